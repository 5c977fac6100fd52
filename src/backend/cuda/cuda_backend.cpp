// The CUDA backend: owns the weights, the paged KV pools and the workspaces, and composes the
// kernels of kernels.h into the gpt-oss forward pass. Batches of decode and speculative-verify
// shape (at most kMaxGraphSeqTokens tokens a sequence, kMaxGraphBatch in all) run as CUDA graphs
// captured per padded-size bucket; everything else (longer prefill chunks, big mixed batches)
// runs eagerly, in chunks of at most max_chunk_ tokens.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <thread>
#include <tuple>
#include <string>
#include <vector>

#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_communicator.h"
#include "backend/cuda/eagle3_head.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/eagle3/eagle3_kernels.h"
#include "backend/cuda/pass_meta_layout.h"
#include "backend/cuda/tp_slices.h"
#include "backend/cuda/step_timeline.h"
#include "model/make_model.h"
#include "model/weights.h"

namespace gptoss {
namespace {

using namespace gptoss::cuda;

constexpr int kMaxGraphBatch = 64;   // largest decode bucket captured in a graph
// The decode buckets: a graphed pass of M tokens runs padded to the smallest bucket >= M. Steps
// of 8 past 8 (vLLM captures the same sizes). Padding tokens take no expert pair
// (MoeRouting::n_valid): routed like real ones they all went to the same four experts, each 8 of
// them another pass over those experts' weights.
constexpr int kGraphBuckets[] = {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64};
static_assert(kGraphBuckets[std::size(kGraphBuckets) - 1] == kMaxGraphBatch, "the largest bucket");
// GPTOSS_GRAPH_BUCKETS_POW2=1 (benchmarks: the buckets before the eighteenth session): the next
// power of two.
int graph_bucket(int M) {
  static const bool pow2 = env_int("GPTOSS_GRAPH_BUCKETS_POW2", 0) != 0;
  for (int b : kGraphBuckets)
    if (b >= M && (!pow2 || (b & (b - 1)) == 0)) return b;
  return kMaxGraphBatch;
}
// Tokens a sequence may bring to a graphed pass: a speculative verify row is the last sampled
// token plus up to 16 drafts (SpeculativeConfig's K range).
constexpr int kMaxGraphSeqTokens = 17;
constexpr int kMaxLogitRows = 64;    // lm_head rows per pass
static_assert(kMaxGraphBatch <= kMaxLogitRows, "a graphed pass computes the logits of all its rows");
constexpr int kMaxSplits = 32;       // attention KV splits

struct Layer {
  const float* attn_norm;
  const float* mlp_norm;
  const float* sinks;
  WeightMat qkv, o, router, gate_up, down;
  // Decode copies of qkv and o in the fragment layout (--dense-dtype bf16|fp8); fmt kBF16 when
  // there is none (the GEMV/GEMM path then serves decode too).
  WeightMat qkv_dec, o_dec;
  // Decode copies of the experts in the fragment layout (--mxfp4-backend auto when they fit),
  // beside the checkpoint layout that prefill's GEMM reads fastest.
  WeightMat gate_up_dec, down_dec;
  // The router's weights transposed [H][E] for the router fold (RouterFold), or null.
  const bf16_t* router_t = nullptr;
  bool sliding;
  int group_index;  // index among the layers of its KV group
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opts);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  bool computes_on_host() const override { return false; }
  const GptOssConfig& config() const override { return model_cfg_; }
  void init_kv_cache(const KvCacheConfig& kv) override;
  const KvCacheConfig& kv_config() const override { return kvc_; }
  void forward(const ForwardBatch& batch, float* logits) override;
  void forward_greedy(const ForwardBatch& batch, int32_t* tokens_out) override;
  void launch_greedy(const ForwardBatch& batch, bool tokens_from_last) override;
  void finish_greedy(int32_t* tokens_out) override;
  void forward_sample(const ForwardBatch& batch, const RowSampling* rows, int32_t* tokens_out,
                      float* logprobs_out = nullptr) override;
  // One GPU: the sampler leaves each drawn token's logprob; tensor-parallel ranks hold a vocab slice.
  bool samples_logprobs() const override { return !tp_.active(); }
  size_t kv_memory_available() const override;
  int default_max_num_batched_tokens() const override;
  bool supports_hidden_taps() const override { return true; }
  std::vector<int> decode_batch_buckets() const override { return {std::begin(kGraphBuckets), std::end(kGraphBuckets)}; }
  std::unique_ptr<Eagle3Head> make_eagle3_head(std::shared_ptr<const Eagle3Weights> head) override;

 private:
  // Device allocations that live as long as the backend.
  template <class T>
  T* dalloc(size_t count) {
    bufs_.emplace_back(count * sizeof(T));
    return bufs_.back().get<T>();
  }
  // Frees a dalloc'd buffer (weights replaced by their repacked form).
  void dfree(const void* p) {
    for (auto& b : bufs_)
      if (b.get() == p) { b.reset(); return; }
  }
  void repack_weights();
  WeightMat pack(const WeightMat& W, int E, bool swiglu, WeightMat::Format to);
  const float* upload_f32(const TensorView& t);
  const bf16_t* upload_bf16(const TensorView& t);
  // Rows of the bf16 tensors `parts` stacked ([sum of rows, K]) and quantized to MXFP4 on the host.
  WeightMat upload_mxfp4(const std::vector<const TensorView*>& parts, const float* bias);
  void load_checkpoint(const std::string& dir, const LoadProgressFn& progress);
  void build_random(const std::string& preset, uint64_t seed, int loop_tokens);
  void alloc_workspace();
  // Tensor parallelism: after a loader built a layer (or lm_head) whole, keep this rank's slice
  // (tp_slices.h) and free the rest, so a rank never holds more than one whole layer.
  void shard_layer(Layer& L);
  void shard_lm_head();
  // Residual update of a row-parallel op (o_proj, MoE) made whole: every rank ends with the sum.
  void tp_all_reduce_x(int n) {
    if (tp_.active()) comm_->all_reduce_sum(x_, size_t(n) * cfg_.hidden, stream_);
  }
  // Ranks other than 0 contribute only their partial update, not the residual itself.
  void tp_zero_x_off_root(int n) {
    if (tp_.active() && !tp_.root())
      GPTOSS_CUDA_CHECK(cudaMemsetAsync(x_, 0, size_t(n) * cfg_.hidden * sizeof(float), stream_));
  }

  // One pass over n tokens whose metadata is in the device meta block at `meta` (see
  // stage_meta); computes the logits of `rows` (device indices into the pass) into d_logits_.
  struct PassMeta {
    const int32_t* tokens;
    const int32_t* pos;
    const int32_t* pt_off[2];
    const int32_t* pt;
    const int32_t* rows;
    AttentionPassInfo attn;  // sequences and their new tokens in the pass (attention's kernel choice)
    // Every token the one new token of its sequence: RoPE, K/V store and attention in one
    // kernel (attention_decode), with these plans for full and sliding layers.
    bool decode_attn = false;
    DecodeAttentionPlan attn_full, attn_sliding;
    // Sequences with several tokens in a graphed pass: rope_kv_store first, then attention_decode
    // reads every token's K/V from the pages (its stored mode).
    bool attn_kv_stored = false;
    // A graph bucket's pass: the number of real tokens (those past it are padding), on the device.
    const int32_t* n_real = nullptr;
  };
  void run_pass(int n, const PassMeta& m, int n_rows, int nsplit);
  // Tensor-parallel: lm_head leaves this rank's vocab slice in d_vocab_gather_; then either the
  // greedy ids (tp_greedy: (value, id) pairs, no logits moved) or the full rows in d_logits_
  // (tp_gather_logits: for the host's logits and for sampling).
  void lm_head(const int32_t* rows, int n_rows);
  void tp_greedy(int n_rows, bool sampler_rule) {
    vocab_parallel_argmax(*comm_, model_cfg_, tp_, d_vocab_gather_, vocab_ld_, n_rows, d_vocab_pairs_, d_greedy_, stream_,
                          sampler_rule);
  }
  void tp_gather_logits(int n_rows) {
    gather_vocab_logits(*comm_, model_cfg_, tp_, d_vocab_gather_, vocab_ld_, n_rows, d_logits_, stream_);
  }
  int splits_for(int n) const;

  // Host staging of the metadata of one pass; returns its device view.
  struct Staged {
    std::vector<int32_t> tokens, pos, off0, off1, rows, pt;
    AttentionPassInfo attn;
    int32_t n_real = -1;  // a graph bucket's pass: its real tokens (PassMeta::n_real); -1: all
  };
  PassMeta upload_meta(const Staged& st, int n, int n_rows);
  // Sets m's decode attention fields for a pass of n tokens staged in st; returns a key of the
  // choice for the graph cache (0: attention() runs instead). one_each: every token the one new
  // token of its sequence (the fused kernel); graphed: a graph bucket's pass, whose sequences may
  // bring several tokens (speculative verify): rope_kv_store, then the tensor-core kernel in its
  // stored mode.
  int plan_decode_attention(const Staged& st, int n, bool one_each, bool graphed, PassMeta* m) const;
  void stage_chunk(const ForwardBatch& b, int t0, int t1, Staged* st, std::vector<int>* out_index);
  void run_graph_step(const ForwardBatch& b);
  // Exactly one of logits (copy them back), greedy (argmax ids) or `how` with ids (sample; with
  // `logprobs`, also each drawn token's logprob).
  void run_batch(const ForwardBatch& b, float* logits, int32_t* greedy, const RowSampling* how = nullptr,
                 float* logprobs = nullptr);
  void run_batch_impl(const ForwardBatch& b, float* logits, int32_t* greedy, const RowSampling* how,
                      float* logprobs);
  // Draws rows [0, n) of d_logits_ by per[i] on the device; ids land in d_greedy_ (and with
  // logprobs, the drawn tokens' logprobs in d_lp_).
  void sample_on_device(const std::vector<RowSampling>& per, int n, bool logprobs);

  // The model as the engine sees it (config()), and the shape this rank computes with: the same
  // unless tensor-parallel, when cfg_ holds the rank's heads and intermediate slice.
  GptOssConfig model_cfg_;
  GptOssConfig cfg_;
  TpShard tp_;
  std::shared_ptr<Communicator> comm_;
  CudaCommunicator* cuda_comm_ = nullptr;  // comm_ when it is the CUDA one (residual_all_reduce)
  float* d_vocab_gather_ = nullptr;  // TP lm_head: [world][rows][vocab_ld_] logits of every rank
  RowMax* d_vocab_pairs_ = nullptr;  // TP greedy: [world][rows] row maxima of every rank
  // Experts whose weights this rank holds, [begin, end) (all but under --tp-expert-sharding expert).
  int experts_begin_ = 0, experts_end_ = 0;
  bool expert_parallel() const { return tp_.active() && tp_.experts == ExpertSharding::kExpertParallel; }
  // Whether a pass of n tokens runs the dense layers (qkv, o_proj, lm_head) over their decode
  // copies (the skinny kernels): up to kSkinnyMaxTokens, or at every size in batch-invariant
  // mode; but from cublas_min_rows() tokens on one GPU, cuBLASLt over the bf16 weights instead
  // (tensor-parallel slices were not measured on two GPUs; batch-invariant kernels must not
  // change with n).
  bool dense_decode_copies(int n) const {
    if (invariant_) return true;
    const bool cublas = blas_ && !tp_.active() && n >= cublas_min_rows();
    return n <= kSkinnyMaxTokens && !cublas;
  }
  int vocab_ld_ = 0;
  YarnTables yarn_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<DeviceBuffer> bufs_;
  const bf16_t* embed_ = nullptr;
  const float* final_norm_ = nullptr;
  WeightMat lm_head_;
  WeightMat lm_head_dec_;  // fragment-layout decode copy (fmt kBF16: none)
  std::vector<Layer> layers_;
  enum class ExpertKernels { kGemv, kMma, kAuto } expert_kernels_ = ExpertKernels::kAuto;  // --mxfp4-backend
  // --batch-invariant: one kernel family per layer at every batch size (the skinny kernels over
  // fragment weights, the K-split GEMV for the router, one attention split), so a row's logits
  // do not depend on its batch companions, the batch size or preemption.
  bool invariant_ = false;
  // GPTOSS_DECODE_ATTENTION: how decode passes (one new token a sequence) run attention:
  // kAuto = attention_decode with decode_attention_plan's cluster merge (kAuto16: clusters of up
  // to 16), kSplit = attention_decode with the split-and-merge launches at splits_for(n), kOff =
  // rope_kv_store + attention.
  enum class DecodeAttn { kAuto, kAuto16, kSplit, kOff } decode_attn_ = DecodeAttn::kAuto;
  // GPTOSS_DECODE_ATTENTION_MMA=0: the decode plans take the CUDA-core kernel, not the tensor-core one.
  bool decode_attn_mma_ = true;
  // Prefill on expert GEMM version 5: hand the activations over in the fragment K order (no
  // transpose in either GEMM). GPTOSS_EXPERT_GEMM_KPERM=0 turns it off for comparisons.
  bool expert_kperm_ = true;
  // GPTOSS_ROUTE_PADDING=1 (comparisons: as before the nineteenth session): a graph bucket's
  // padding tokens routed to experts like real ones (MoeRouting::n_valid left null).
  bool route_padding_ = false;
  // --dense-gemm: prefill GEMMs of the bf16 dense layers on cuBLASLt (null: our own kernels).
  std::unique_ptr<CublasLtGemm> blas_;
  WeightMat::Format dense_dec_ = WeightMat::kFragBF16;  // --dense-dtype
  int* d_flag_ = nullptr;
  float* inv_freq_ = nullptr;

  KvCacheConfig kvc_;
  DeviceBuffer kv_pool_[2];
  size_t kv_layer_bytes_[2] = {0, 0};

  // Tokens of an eager pass (the workspaces' size): the serving token budget on large GPUs (8192),
  // so that a full prefill pass runs as one chunk and the expert GEMM reads each expert's weights
  // once for all its pairs (4096 + 4096 read them twice); 4096 elsewhere. GPTOSS_MAX_CHUNK sets
  // it (tests: a small chunk, to cut passes).
  int max_chunk_ = 4096;
  // Workspaces (sized for max_chunk_ tokens).
  float* x_ = nullptr;
  bf16_t* xn_ = nullptr;
  bf16_t* qkv_ = nullptr;
  bf16_t* attn_ = nullptr;
  float* partial_ = nullptr;
  float* router_logits_ = nullptr;
  bf16_t* act_ = nullptr;  // bf16, or fp16 when the skinny kernels run the experts
  float* moe_y_ = nullptr;  // [pairs][H] expert outputs before the weighted sum
  MoeRouting routing_;
  float* d_logits_ = nullptr;
  int32_t* d_greedy_ = nullptr;
  int* d_ticket_ = nullptr;  // moe_router_route: blocks done (the last one routes)
  // The router folded into o_proj at 1-8 tokens (RouterFold, kernels.h): on where the model allows
  // (router_fold_, GPTOSS_ROUTER_FOLD=0 turns it off), in passes of at most fold_tokens_ tokens
  // (GPTOSS_ROUTER_FOLD_TOKENS, 1 to kRouterFoldMaxTokens = 8, the default); each layer's fixed-point sums
  // (kRouterFoldMaxTokens x (E + 1) a layer, zeroed at the start of each such pass) and x * norm_w.
  bool router_fold_ = false;
  int router_fold_mode_ = 1;
  int fold_tokens_ = kRouterFoldMaxTokens;
  size_t fold_acc_layer() const { return size_t(kRouterFoldMaxTokens) * (cfg_.num_experts + 1); }
  // The combine folded too (RouterFold::moe_out): each layer's MoE output in fixed point,
  // [layers][H], zeroed with the router's sums. GPTOSS_COMBINE_FOLD: 0 off, 1 where qkv has bf16
  // or fp8 weights only, 2 (default) with MXFP4 qkv too (thirtieth session, s30r7, once its norm-in
  // kernel stopped spilling: 120b --mxfp4-layers all tg64 +1.2%, 20b +0.2%).
  int combine_fold_ = 0;
  long long* fold_moe_ = nullptr;
  long long* fold_acc_ = nullptr;
  float* fold_xg_ = nullptr;
  float* fold_bias_ = nullptr;
  float* d_lp_ = nullptr;    // [kMaxLogitRows] the drawn tokens' logprobs (sample_rows)
  RowSampling* d_how_ = nullptr;
  DeviceBuffer meta_;
  size_t meta_cap_ = 0;  // int32 entries
  // Pinned staging of the metadata, two blocks used in turn, each reused only after the copy that
  // read it last (meta_copied_): a pipelined pass (launch_greedy) stages pass N + 1's while N runs.
  int32_t* h_meta_buf_[2] = {nullptr, nullptr};
  cudaEvent_t meta_copied_[2] = {nullptr, nullptr};
  int meta_slot_ = 0;
  int32_t* h_meta_ = nullptr;  // the block being written (h_meta_buf_[meta_slot_])

  // Pipelined greedy passes (launch_greedy / finish_greedy), oldest first: a pass on the device
  // copies its ids into pinned slot `slot` (h_greedy_, greedy_copied_ says when), or, run
  // synchronously (shapes the graphs do not take), holds them in `ids`.
  struct PendingGreedy {
    int slot = -1;
    int rows = 0;
    std::vector<int32_t> ids;
  };
  std::vector<PendingGreedy> pending_greedy_;
  // The last pass launched (rows -1: none), finished or not: a synchronous launch that takes its
  // ids reads them from it (its pinned slot is not reused before the next launch).
  PendingGreedy last_greedy_{-1, -1, {}};
  std::vector<int32_t> greedy_ids(const PendingGreedy& p);  // waits for a device pass's copy
  int32_t* h_greedy_[2] = {nullptr, nullptr};
  cudaEvent_t greedy_copied_[2] = {nullptr, nullptr};
  // d_greedy_ still holds the last launch_greedy pass's ids in row order (no other pass ran since).
  bool greedy_chain_ = false;
  // Set by launch_greedy around run_batch: the pinned slot the pass's ids go to (-1: a plain,
  // synchronous pass), and whether its tokens are copied from d_greedy_ on the device.
  int pipe_slot_ = -1;
  bool tokens_from_device_ = false;
  bool pipe_copied_ = false;  // the pass left its ids to the slot (run_batch_impl's graph branch)

  // Captured decode passes by padded size (and tapped layers: graphs that store device taps).
  // (padded size, decode attention plan key, tapped layers)
  using GraphKey = std::tuple<int, int, std::vector<int32_t>>;
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  StepTimeline timeline_;  // GPTOSS_CUDA_TIMELINE=1: GPU idle time between passes
  Mxfp4Layers mx_layers_;  // dense layers stored as MXFP4 (--mxfp4-layers)

  // GPTOSS_CUDA_PROFILE=1: decode steps run eagerly with an event after every op; the time per
  // op kind (summed over layers and steps) is printed when the backend goes away, apart for
  // decode-size passes (<= kSkinnyMaxTokens tokens) and larger ones (prefill, mixed steps).
  bool profile_ = false;
  // Eagle3 hidden-state taps of the pass being run (ForwardBatch::tap_layers): run_pass copies the
  // residual stream after each tapped layer, [n, H] per tap slot, into tap_stage_.
  const std::vector<int32_t>* tap_layers_ = nullptr;
  std::vector<float> tap_stage_;
  // ForwardBatch::taps_on_device (the backend's own Eagle3 head, eagle3_head.h): run_pass stores
  // the tapped rows as bf16 [tokens, slots * H] in batch token order into tap_dst_ instead (pass
  // row r -> token tap_dst_rows_[r], or tap_dst0_ + r when null). Eager passes use dev_taps_,
  // graphed ones graph_taps_ (fixed: the graphs hold its address).
  bool tap_device_ = false;
  bf16_t* tap_dst_ = nullptr;
  const int32_t* tap_dst_rows_ = nullptr;
  int tap_dst0_ = 0;
  DeviceBuffer dev_taps_, tap_rows_;
  bf16_t* graph_taps_ = nullptr;
  std::vector<int32_t> tap_rows_host_;
  cuda::DeviceTaps last_taps_;  // what the last forward left for the head
  // GPTOSS_CUDA_SKIP=dense,attn,router,experts,lm_head,route_once,combine: timing experiments only (the
  // output is garbage); the step time without a group of ops is the cost of that group.
  std::string skip_;
  bool skip(const char* what) const { return !skip_.empty() && skip_.find(what) != std::string::npos; }
  std::vector<std::pair<const char*, cudaEvent_t>> prof_marks_;
  std::map<std::string, std::pair<double, int>> prof_[2];  // [0] decode-size passes, [1] larger ones
  int prof_class_ = 0;                                       // the running pass's
  cudaEvent_t prof_start_ = nullptr;
  void mark(const char* what) {
    if (!profile_) return;
    cudaEvent_t e;
    GPTOSS_CUDA_CHECK(cudaEventCreate(&e));
    GPTOSS_CUDA_CHECK(cudaEventRecord(e, stream_));
    prof_marks_.push_back({what, e});
  }
  void collect_profile() {
    if (!profile_ || prof_marks_.empty()) return;
    GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudaEvent_t prev = prof_start_;
    for (auto& [what, e] : prof_marks_) {
      float ms = 0;
      GPTOSS_CUDA_CHECK(cudaEventElapsedTime(&ms, prev, e));
      auto& slot = prof_[prof_class_][what];
      slot.first += ms;
      slot.second += 1;
      if (prev != prof_start_) cudaEventDestroy(prev);
      prev = e;
    }
    cudaEventDestroy(prev);
    prof_marks_.clear();
  }
};


CudaBackend::CudaBackend(const BackendOptions& opts) {
  if (!cuda_device_available()) throw Error("--device cuda: no CUDA device is available");
  device_ = opts.device_index;
  // MXFP4 kernel families: "mma" repacks the experts at load into the tensor-core fragment
  // layout (skinny kernels for decode, the mma GEMM on that layout for prefill); "gemv" keeps
  // the checkpoint layout (CUDA-core GEMV for decode, the mma GEMM for prefill); "auto" keeps the
  // checkpoint layout for prefill and adds a fragment copy for decode when that copy takes at
  // most a quarter of the GPU's memory (20b), and otherwise (120b) uses the fragment layout
  // alone, as "mma": on the H200 the fragment layout wins decode batches of 1-64 tokens and the
  // checkpoint layout wins prefill (docs/BENCHMARKS.md).
  if (opts.mxfp4_backend == "mma")
    expert_kernels_ = ExpertKernels::kMma;
  else if (opts.mxfp4_backend == "gemv")
    expert_kernels_ = ExpertKernels::kGemv;
  else if (opts.mxfp4_backend == "auto" || opts.mxfp4_backend.empty())
    expert_kernels_ = ExpertKernels::kAuto;
  else
    throw Error("--mxfp4-backend " + opts.mxfp4_backend + ": expected auto, mma or gemv");
  invariant_ = opts.batch_invariant;
  if (opts.dense_dtype == "bf16")
    dense_dec_ = WeightMat::kFragBF16;
  else if (opts.dense_dtype == "fp8")
    dense_dec_ = WeightMat::kFragFP8;
  else
    throw Error("--dense-dtype " + opts.dense_dtype + ": expected bf16 or fp8");
  mx_layers_ = parse_mxfp4_layers(opts.mxfp4_layers);
  tp_ = opts.tp_shard;
  comm_ = opts.comm;
  cuda_comm_ = dynamic_cast<CudaCommunicator*>(comm_.get());
  if (tp_.active()) {
    if (!comm_ || comm_->world() != tp_.world || comm_->rank() != tp_.rank)
      throw Error("cuda backend: tensor-parallel rank " + std::to_string(tp_.rank) + " of " + std::to_string(tp_.world) +
                  " needs its group's communicator");
    if (mx_layers_.any()) throw Error("--mxfp4-layers qkv/o/lm_head is not supported with --tp on CUDA yet");
  }
  GPTOSS_CUDA_CHECK(cudaSetDevice(device_));
  GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (!opts.model_dir.empty())
    load_checkpoint(opts.model_dir, opts.load_progress);
  else if (!opts.random_weights.empty())
    build_random(opts.random_weights, opts.seed, opts.random_loop_tokens);
  else
    throw Error("cuda backend: give a model directory or a random-weights preset");
  model_cfg_ = cfg_;
  experts_begin_ = tp_.experts_held(model_cfg_).begin;
  experts_end_ = tp_.experts_held(model_cfg_).end;
  if (tp_.active()) cfg_ = tp_local_config(model_cfg_, tp_);
  if (cfg_.hidden % 32 || cfg_.intermediate % 32 || cfg_.q_dim() % 32)
    throw Error("cuda backend: hidden, intermediate and q_dim must be multiples of 32");
  if (cfg_.head_dim != 64 && cfg_.head_dim != 32) throw Error("cuda backend: head_dim must be 32 or 64");
  repack_weights();
  yarn_ = compute_yarn(cfg_);
  inv_freq_ = dalloc<float>(yarn_.inv_freq.size());
  GPTOSS_CUDA_CHECK(cudaMemcpy(inv_freq_, yarn_.inv_freq.data(), yarn_.inv_freq.size() * 4, cudaMemcpyHostToDevice));
  int idx[2] = {0, 0};
  for (int l = 0; l < cfg_.num_layers; ++l) {
    layers_[l].sliding = cfg_.layer_sliding[l];
    layers_[l].group_index = idx[layers_[l].sliding ? kKvSliding : kKvFull]++;
  }
  max_chunk_ = std::clamp(env_int("GPTOSS_MAX_CHUNK", default_max_num_batched_tokens() >= 8192 ? 8192 : 4096), 1, 16384);
  alloc_workspace();
  blas_ = make_dense_gemm(opts.dense_gemm, invariant_);
  if (blas_) {
    // qkv's bf16 store with its bias in one cuBLASLt call (the biases are bf16 values), and the
    // staged route's rows for the decode passes (captured in graphs) in case they are not.
    for (const Layer& L : layers_)
      if (L.qkv.fmt == WeightMat::kBF16) blas_->prepare_bf16_bias(L.qkv.bias, L.qkv.N, stream_);
    blas_->reserve_staging(size_t(kSkinnyMaxTokens) * (cfg_.q_dim() + 2 * cfg_.kv_dim()) * sizeof(float));
  }
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  profile_ = std::getenv("GPTOSS_CUDA_PROFILE") != nullptr;
  if (const char* sk = std::getenv("GPTOSS_CUDA_SKIP")) skip_ = sk;
  if (const char* da = std::getenv("GPTOSS_DECODE_ATTENTION")) {
    const std::string v = da;
    if (v == "auto" || v.empty())
      decode_attn_ = DecodeAttn::kAuto;
    else if (v == "auto16")
      decode_attn_ = DecodeAttn::kAuto16;
    else if (v == "split")
      decode_attn_ = DecodeAttn::kSplit;
    else if (v == "off")
      decode_attn_ = DecodeAttn::kOff;
    else
      throw Error("GPTOSS_DECODE_ATTENTION=" + v + ": expected auto, auto16, split or off");
  }
  if (const char* mma = std::getenv("GPTOSS_DECODE_ATTENTION_MMA")) decode_attn_mma_ = std::string(mma) != "0";
  if (const char* kp = std::getenv("GPTOSS_EXPERT_GEMM_KPERM")) expert_kperm_ = std::string(kp) != "0";
  route_padding_ = env_int("GPTOSS_ROUTE_PADDING", 0) != 0;
  if (profile_) GPTOSS_CUDA_CHECK(cudaEventCreate(&prof_start_));
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);  // frees below (and the buffers after) belong to this backend's device
  for (int cls = 0; cls < 2 && profile_; ++cls) {
    if (prof_[cls].empty()) continue;
    double total = 0;
    for (auto& [k, v] : prof_[cls]) total += v.first;
    if (cls == 0)
      std::fprintf(stderr, "cuda profile, decode-size passes (<= %d tokens; eager, events between ops):\n",
                   kSkinnyMaxTokens);
    else
      std::fprintf(stderr, "cuda profile, larger passes (prefill, mixed steps; eager, events between ops):\n");
    for (auto& [k, v] : prof_[cls])
      std::fprintf(stderr, "  %-14s %10.3f ms  %5.1f%%  (%d ops)\n", k.c_str(), v.first, 100 * v.first / total, v.second);
  }
  if (prof_start_) cudaEventDestroy(prof_start_);
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
  for (int i = 0; i < 2; ++i) {
    if (h_meta_buf_[i]) cudaFreeHost(h_meta_buf_[i]);
    if (meta_copied_[i]) cudaEventDestroy(meta_copied_[i]);
    if (h_greedy_[i]) cudaFreeHost(h_greedy_[i]);
    if (greedy_copied_[i]) cudaEventDestroy(greedy_copied_[i]);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

const float* CudaBackend::upload_f32(const TensorView& t) {
  std::vector<float> h(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) h[i] = tensor_float_at(t, i);
  float* d = dalloc<float>(h.size());
  GPTOSS_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

const bf16_t* CudaBackend::upload_bf16(const TensorView& t) {
  if (t.dtype != DType::BF16) throw Error(t.file + ": " + t.name + ": expected bf16");
  bf16_t* d = dalloc<bf16_t>(t.numel());
  GPTOSS_CUDA_CHECK(cudaMemcpy(d, t.data, t.nbytes, cudaMemcpyHostToDevice));
  return d;
}

WeightMat CudaBackend::upload_mxfp4(const std::vector<const TensorView*>& parts, const float* bias) {
  int N = 0;
  const int K = int(parts[0]->shape.back());
  for (const TensorView* t : parts) {
    if (t->dtype != DType::BF16 || t->shape.size() != 2 || t->shape[1] != K)
      throw Error(t->file + ": " + t->name + ": --mxfp4-layers expects bf16 [rows, " + std::to_string(K) + "]");
    N += int(t->shape[0]);
  }
  if (K % 32) throw Error("--mxfp4-layers: K must be a multiple of 32");
  std::vector<uint8_t> blocks(size_t(N) * K / 2), scales(size_t(N) * K / 32);
  std::vector<const uint8_t*> rows;  // source row (bf16 bytes) of each output row
  for (const TensorView* t : parts)
    for (int64_t r = 0; r < t->shape[0]; ++r) rows.push_back(t->data + size_t(r) * K * 2);
  // Quantizing lm_head (579 M weights) is seconds of work: spread the rows over the cores.
  const int nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int w = 0; w < nt; ++w)
    pool.emplace_back([&, w] {
      std::vector<float> row(K);
      std::vector<uint16_t> bits(K);
      for (int r = w; r < N; r += nt) {
        std::memcpy(bits.data(), rows[r], size_t(K) * 2);  // the mapping need not be 2-byte aligned
        for (int k = 0; k < K; ++k) row[k] = bf16_to_f32(bits[k]);
        mxfp4_quantize_row(row.data(), K, blocks.data() + size_t(r) * K / 2, scales.data() + size_t(r) * K / 32);
      }
    });
  for (auto& t : pool) t.join();
  uint8_t* db = dalloc<uint8_t>(blocks.size());
  uint8_t* ds = dalloc<uint8_t>(scales.size());
  GPTOSS_CUDA_CHECK(cudaMemcpy(db, blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
  GPTOSS_CUDA_CHECK(cudaMemcpy(ds, scales.data(), scales.size(), cudaMemcpyHostToDevice));
  return WeightMat{WeightMat::kMXFP4, db, ds, bias, N, K};
}

void CudaBackend::load_checkpoint(const std::string& dir, const LoadProgressFn& progress) {
  auto mw = ModelWeights::load(dir, progress);
  cfg_ = mw->config;
  if (tp_.active()) check_tp_shardable(cfg_, tp_.world, tp_.experts);
  const int H = cfg_.hidden, E = cfg_.num_experts, I = cfg_.intermediate;
  const int qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), QKV = qd + 2 * kvd;
  embed_ = upload_bf16(*mw->embed);
  final_norm_ = upload_f32(*mw->final_norm);
  // Tensor-parallel: the big tensors stay in the checkpoint's mapping and shard_layer /
  // shard_lm_head upload only this rank's slice of them.
  const bool from_map = tp_.active();
  if (from_map && mw->lm_head->dtype != DType::BF16) throw Error(mw->lm_head->file + ": lm_head: expected bf16");
  lm_head_ = mx_layers_.lm_head ? upload_mxfp4({mw->lm_head}, nullptr)
                                : WeightMat{WeightMat::kBF16,
                                            from_map ? reinterpret_cast<const bf16_t*>(mw->lm_head->data)
                                                     : upload_bf16(*mw->lm_head),
                                            nullptr, nullptr, cfg_.vocab, H};
  shard_lm_head();
  // Progress in bytes of the big tensors, reported as each layer starts (the last call, after
  // the loop, says the stage is done).
  auto layer_bytes = [](const LayerWeights& lw) {
    uint64_t b = 0;
    for (const TensorView* t : {lw.q_w, lw.k_w, lw.v_w, lw.o_w, lw.router_w, lw.gate_up_blocks, lw.gate_up_scales,
                                lw.down_blocks, lw.down_scales})
      if (t) b += t->nbytes;
    return b;
  };
  uint64_t up_total = 0, up_done = 0;
  for (const LayerWeights& lw : mw->layers) up_total += layer_bytes(lw);
  for (const LayerWeights& lw : mw->layers) {
    if (progress) progress("uploading", up_done, up_total);
    up_done += layer_bytes(lw);
    Layer L{};
    L.attn_norm = upload_f32(*lw.attn_norm);
    L.mlp_norm = upload_f32(*lw.mlp_norm);
    L.sinks = upload_f32(*lw.sinks);
    // q, k and v fused into one [QKV, H] matrix: one GEMV/GEMM instead of three.
    std::vector<float> b(QKV);
    for (int i = 0; i < qd; ++i) b[i] = tensor_float_at(*lw.q_b, i);
    for (int i = 0; i < kvd; ++i) b[qd + i] = tensor_float_at(*lw.k_b, i);
    for (int i = 0; i < kvd; ++i) b[qd + kvd + i] = tensor_float_at(*lw.v_b, i);
    float* bqkv = dalloc<float>(QKV);
    GPTOSS_CUDA_CHECK(cudaMemcpy(bqkv, b.data(), QKV * 4, cudaMemcpyHostToDevice));
    if (mx_layers_.qkv) {
      L.qkv = upload_mxfp4({lw.q_w, lw.k_w, lw.v_w}, bqkv);
    } else {
      bf16_t* wqkv = dalloc<bf16_t>(size_t(QKV) * H);
      GPTOSS_CUDA_CHECK(cudaMemcpy(wqkv, lw.q_w->data, lw.q_w->nbytes, cudaMemcpyHostToDevice));
      GPTOSS_CUDA_CHECK(cudaMemcpy(wqkv + size_t(qd) * H, lw.k_w->data, lw.k_w->nbytes, cudaMemcpyHostToDevice));
      GPTOSS_CUDA_CHECK(cudaMemcpy(wqkv + size_t(qd + kvd) * H, lw.v_w->data, lw.v_w->nbytes, cudaMemcpyHostToDevice));
      L.qkv = WeightMat{WeightMat::kBF16, wqkv, nullptr, bqkv, QKV, H};
    }
    L.o = mx_layers_.o ? upload_mxfp4({lw.o_w}, upload_f32(*lw.o_b))
                       : WeightMat{WeightMat::kBF16, upload_bf16(*lw.o_w), nullptr, upload_f32(*lw.o_b), H, qd};
    L.router = WeightMat{WeightMat::kBF16, upload_bf16(*lw.router_w), nullptr, upload_f32(*lw.router_b), E, H};
    auto up_u8 = [&](const TensorView& t) -> const uint8_t* {
      if (from_map) return t.data;
      uint8_t* d = dalloc<uint8_t>(t.nbytes);
      GPTOSS_CUDA_CHECK(cudaMemcpy(d, t.data, t.nbytes, cudaMemcpyHostToDevice));
      return d;
    };
    L.gate_up = WeightMat{WeightMat::kMXFP4, up_u8(*lw.gate_up_blocks), up_u8(*lw.gate_up_scales),
                          upload_f32(*lw.gate_up_bias), 2 * I, H};
    L.down = WeightMat{WeightMat::kMXFP4, up_u8(*lw.down_blocks), up_u8(*lw.down_scales), upload_f32(*lw.down_bias),
                       H, I};
    shard_layer(L);
    layers_.push_back(L);
  }
  if (progress) progress("uploading", up_total, up_total);
}

void CudaBackend::build_random(const std::string& preset, uint64_t seed, int loop_tokens) {
  cfg_ = GptOssConfig::preset(preset);
  LoopSpec loop;
  loop.tokens = loop_tokens;
  if (loop.active()) {
    loop.check(cfg_);
    if (mx_layers_.lm_head) throw Error("--random-loop-tokens needs a bf16 lm_head (not --mxfp4-layers lm_head)");
  }
  if (tp_.active()) check_tp_shardable(cfg_, tp_.world, tp_.experts);
  const int H = cfg_.hidden, E = cfg_.num_experts, I = cfg_.intermediate, V = cfg_.vocab;
  const int qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), QKV = qd + 2 * kvd;
  uint64_t sid = seed * 1000003ull + 17;
  auto bf = [&](size_t n, float std) {
    bf16_t* d = dalloc<bf16_t>(n);
    fill_random_bf16(d, n, sid++, 0.f, std, stream_);
    return d;
  };
  auto f32 = [&](size_t n, float mean, float std) {  // norms, sinks, biases: bf16 values, as checkpoints store them
    float* d = dalloc<float>(n);
    fill_random_f32(d, n, sid++, mean, std, stream_);
    round_f32_to_bf16_values(d, n, stream_);
    return d;
  };
  auto u8 = [&](size_t n, int lo, int hi) {
    uint8_t* d = dalloc<uint8_t>(n);
    fill_random_u8(d, n, sid++, lo, hi, stream_);
    return d;
  };
  // The distributions make-model writes (uniform with the same mean and spread), so a GPU random
  // model behaves like a checkpoint one.
  const RandomWeightSpec r;
  const float ds = r.dense_std, bs = r.bias_std;
  const int slo = r.scale_lo, shi = r.scale_hi;
  embed_ = bf(size_t(V) * H, r.embed_std);
  final_norm_ = f32(H, 1.f, r.norm_std);
  // Dense layers chosen by --mxfp4-layers get random codes and the experts' scale range.
  auto mx = [&](int N, int K, float* bias) {
    return WeightMat{WeightMat::kMXFP4, u8(size_t(N) * K / 2, 0, 255), u8(size_t(N) * K / 32, slo, shi), bias, N, K};
  };
  lm_head_ = mx_layers_.lm_head ? mx(V, H, nullptr) : WeightMat{WeightMat::kBF16, bf(size_t(V) * H, ds), nullptr, nullptr, V, H};
  // A loop model (make_model.h's LoopSpec, as make-model writes it): the cycle's rows replaced.
  if (loop.active())
    for (bool head : {false, true})
      loop.rows(H, head, [&](int64_t row, const std::vector<uint16_t>& v) {
        bf16_t* base = const_cast<bf16_t*>(head ? static_cast<const bf16_t*>(lm_head_.w) : embed_);
        GPTOSS_CUDA_CHECK(cudaMemcpyAsync(base + size_t(row) * H, v.data(), v.size() * 2, cudaMemcpyHostToDevice, stream_));
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // v is gone after the call
      });
  shard_lm_head();
  for (int l = 0; l < cfg_.num_layers; ++l) {
    Layer L{};
    L.attn_norm = f32(H, 1.f, r.norm_std);
    L.mlp_norm = f32(H, 1.f, r.norm_std);
    L.sinks = f32(cfg_.num_heads, 0.f, 0.5f);
    L.qkv = mx_layers_.qkv ? mx(QKV, H, f32(QKV, 0.f, bs))
                           : WeightMat{WeightMat::kBF16, bf(size_t(QKV) * H, ds), nullptr, f32(QKV, 0.f, bs), QKV, H};
    L.o = mx_layers_.o ? mx(H, qd, f32(H, 0.f, bs))
                       : WeightMat{WeightMat::kBF16, bf(size_t(H) * qd, ds), nullptr, f32(H, 0.f, bs), H, qd};
    L.router = WeightMat{WeightMat::kBF16, bf(size_t(E) * H, ds), nullptr, f32(E, 0.f, bs), E, H};
    L.gate_up = WeightMat{WeightMat::kMXFP4, u8(size_t(E) * 2 * I * H / 2, 0, 255),
                          u8(size_t(E) * 2 * I * H / 32, slo, shi), f32(size_t(E) * 2 * I, 0.f, bs), 2 * I, H};
    L.down = WeightMat{WeightMat::kMXFP4, u8(size_t(E) * H * I / 2, 0, 255), u8(size_t(E) * H * I / 32, slo, shi),
                       f32(size_t(E) * H, 0.f, bs), H, I};
    shard_layer(L);
    layers_.push_back(L);
  }
}

// cfg_ is still the whole model here (the constructor narrows it after loading).
void CudaBackend::shard_layer(Layer& L) {
  if (!tp_.active()) return;
  const GptOssConfig& c = cfg_;
  const int H = c.hidden, E = c.num_experts, I = c.intermediate, D = c.head_dim;
  const int qd = c.q_dim(), kvd = c.kv_dim(), QKV = qd + 2 * kvd;
  const IndexRange qh = tp_.q_heads(c), kh = tp_.kv_heads(c), is = tp_.intermediate(c);
  auto cut = [&](const void* src, const MidSlice& m) {
    uint8_t* d = dalloc<uint8_t>(m.bytes());
    copy_mid_slice(d, src, m, stream_);
    return d;
  };
  auto cut_qkv = [&](const void* src, size_t row_bytes) {  // q rows of my heads, then k, then v
    const MidSlice parts[3] = {{1, size_t(QKV), row_bytes, size_t(qh.begin) * D, size_t(qh.size()) * D},
                               {1, size_t(QKV), row_bytes, size_t(qd + kh.begin * D), size_t(kh.size()) * D},
                               {1, size_t(QKV), row_bytes, size_t(qd + kvd + kh.begin * D), size_t(kh.size()) * D}};
    uint8_t* d = dalloc<uint8_t>(parts[0].bytes() + parts[1].bytes() + parts[2].bytes());
    size_t at = 0;
    for (const MidSlice& m : parts) {
      copy_mid_slice(d + at, src, m, stream_);
      at += m.bytes();
    }
    return d;
  };
  Layer S = L;
  const int QKVl = (qh.size() + 2 * kh.size()) * D;
  S.qkv = WeightMat{WeightMat::kBF16, cut_qkv(L.qkv.w, size_t(H) * 2), nullptr,
                    reinterpret_cast<const float*>(cut_qkv(L.qkv.bias, 4)), QKVl, H};
  S.sinks = reinterpret_cast<const float*>(cut(L.sinks, {1, size_t(c.num_heads), 4, size_t(qh.begin), size_t(qh.size())}));
  // o_proj: the columns of my heads; its bias is added once, by rank 0.
  S.o = WeightMat{WeightMat::kBF16, cut(L.o.w, {size_t(H), size_t(qd), 2, size_t(qh.begin) * D, size_t(qh.size()) * D}),
                  nullptr, tp_.root() ? L.o.bias : nullptr, H, qh.size() * D};
  if (tp_.experts == ExpertSharding::kExpertParallel) {
    // Whole experts [eb, ee), biases with them (each rank adds only its experts' outputs).
    const IndexRange ex = tp_.experts_held(c);
    auto experts = [&](const void* src, size_t per_expert) {
      return cut(src, {1, size_t(E), per_expert, size_t(ex.begin), size_t(ex.size())});
    };
    S.gate_up = WeightMat{WeightMat::kMXFP4, experts(L.gate_up.w, size_t(2) * I * H / 2),
                          experts(L.gate_up.scales, size_t(2) * I * H / 32),
                          reinterpret_cast<const float*>(experts(L.gate_up.bias, size_t(2) * I * 4)), 2 * I, H};
    S.down = WeightMat{WeightMat::kMXFP4, experts(L.down.w, size_t(H) * I / 2), experts(L.down.scales, size_t(H) * I / 32),
                       reinterpret_cast<const float*>(experts(L.down.bias, size_t(H) * 4)), H, I};
  } else {
    // Experts: gate_up rows 2i, 2i+1 of my i (gate and up interleaved), down's columns of my i in
    // whole MXFP4 blocks; down's bias once, by rank 0.
    const size_t gb = size_t(2) * is.begin, gn = size_t(2) * is.size();
    S.gate_up = WeightMat{WeightMat::kMXFP4, cut(L.gate_up.w, {size_t(E), size_t(2) * I, size_t(H) / 2, gb, gn}),
                          cut(L.gate_up.scales, {size_t(E), size_t(2) * I, size_t(H) / 32, gb, gn}),
                          reinterpret_cast<const float*>(cut(L.gate_up.bias, {size_t(E), size_t(2) * I, 4, gb, gn})),
                          int(gn), H};
    const size_t db = size_t(is.begin) / 32, dn = size_t(is.size()) / 32;
    S.down = WeightMat{WeightMat::kMXFP4, cut(L.down.w, {size_t(E) * H, size_t(I) / 32, 16, db, dn}),
                       cut(L.down.scales, {size_t(E) * H, size_t(I) / 32, 1, db, dn}),
                       tp_.root() ? L.down.bias : nullptr, H, is.size()};
  }
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (const void* p : std::initializer_list<const void*>{L.qkv.w, L.qkv.bias, L.sinks, L.o.w, L.gate_up.w,
                                                          L.gate_up.scales, L.gate_up.bias, L.down.w, L.down.scales})
    dfree(p);
  if (!tp_.root()) dfree(L.o.bias);
  if (!tp_.root() || tp_.experts == ExpertSharding::kExpertParallel) dfree(L.down.bias);
  L = S;
}

void CudaBackend::shard_lm_head() {
  if (!tp_.active()) return;
  const IndexRange v = tp_.vocab(cfg_);
  const WeightMat W = lm_head_;
  uint8_t* d = dalloc<uint8_t>(size_t(v.size()) * W.K * 2);
  copy_mid_slice(d, W.w, {1, size_t(W.N), size_t(W.K) * 2, size_t(v.begin), size_t(v.size())}, stream_);
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  dfree(W.w);
  lm_head_ = WeightMat{WeightMat::kBF16, d, nullptr, nullptr, v.size(), W.K};
}

WeightMat CudaBackend::pack(const WeightMat& W, int E, bool swiglu, WeightMat::Format to) {
  void* w = dalloc<uint8_t>(frag_weight_bytes(to, E, W.N, W.K));
  void* aux = nullptr;
  if (to == WeightMat::kFragMXFP4) aux = dalloc<uint8_t>(size_t(E) * W.N * W.K / 32);
  if (to == WeightMat::kFragFP8) aux = dalloc<float>(size_t(E) * W.N);
  return pack_frag(W, E, swiglu, to, w, aux, d_flag_, stream_);
}

// Weights the decode kernels read in the fragment layout: the experts (repacked in place: the
// GEMM reads that layout too, so there is one copy), dense MXFP4 layers likewise, and decode
// copies of qkv/o/lm_head in bf16 or fp8 beside the row-major bf16 that prefill keeps.
void CudaBackend::repack_weights() {
  d_flag_ = dalloc<int>(1);
  GPTOSS_CUDA_CHECK(cudaMemsetAsync(d_flag_, 0, 4, stream_));
  const int E = experts_end_ - experts_begin_;  // experts held (all unless expert-parallel)
  auto in_place = [&](WeightMat& W, int e, bool swiglu) {
    if (!frag_packable(W)) return;
    WeightMat P = pack(W, e, swiglu, WeightMat::kFragMXFP4);
    GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    dfree(W.w);
    dfree(W.scales);
    W = P;
  };
  auto dec_copy = [&](const WeightMat& W) {
    if (W.fmt == WeightMat::kMXFP4) return W;  // packed in place below, or served as it is
    if (!frag_packable(W)) return WeightMat{};
    return pack(W, 1, false, dense_dec_);
  };
  // Batch-invariant mode runs the experts through the skinny kernels at every size: one copy,
  // in the fragment layout.
  bool mma = expert_kernels_ == ExpertKernels::kMma || invariant_, copies = false;
  if (expert_kernels_ == ExpertKernels::kAuto && !invariant_ && !layers_.empty()) {
    size_t free_b = 0, total = 0;
    GPTOSS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    const WeightMat& g0 = layers_[0].gate_up;
    const WeightMat& d0 = layers_[0].down;
    const size_t per_layer = frag_weight_bytes(WeightMat::kFragMXFP4, E, g0.N, g0.K) * 17 / 16 +
                             frag_weight_bytes(WeightMat::kFragMXFP4, E, d0.N, d0.K) * 17 / 16;
    // Where the prefill GEMM's version 5 runs (Hopper), the fragment layout is the faster one for
    // prefill too (H200, s13r1, 20b gate_up + down at 2048 tokens: 1315 us on it against 1689 for
    // the best version on the checkpoint layout): one copy, in the fragment layout, serves both
    // and leaves the memory of the second to the KV cache. Elsewhere a second copy where there is
    // room (20b); without room (120b) the fragment layout alone, since decode batches of 8-64
    // tokens run ~2x faster on it (H200, 120b tg64 x32: 1447 vs 678 tok/s) and serving is mostly
    // decode.
    copies = !expert_gemm_v3_available() && per_layer * layers_.size() <= total / 4 && frag_packable(g0) &&
             frag_packable(d0);
    mma = !copies && frag_packable(g0) && frag_packable(d0);
  }
  for (Layer& L : layers_) {
    if (mma && frag_packable(L.gate_up) && frag_packable(L.down)) {
      // Both expert matrices or neither: a skinny gate_up hands fp16 activations to down. (A
      // tensor-parallel intermediate slice, 1440 of 120b's 2880, can leave down's K % 64 != 0.)
      in_place(L.gate_up, E, true);
      in_place(L.down, E, false);
    }
    if (mma) {
      if (L.qkv.fmt == WeightMat::kMXFP4) in_place(L.qkv, 1, false);
      if (L.o.fmt == WeightMat::kMXFP4) in_place(L.o, 1, false);
    }
    if (copies) {
      L.gate_up_dec = pack(L.gate_up, E, true, WeightMat::kFragMXFP4);
      L.down_dec = pack(L.down, E, false, WeightMat::kFragMXFP4);
    }
    L.qkv_dec = L.qkv.fmt == WeightMat::kBF16 ? dec_copy(L.qkv) : WeightMat{};
    L.o_dec = L.o.fmt == WeightMat::kBF16 ? dec_copy(L.o) : WeightMat{};
  }
  // The router fold: one token, one GPU (no tensor or expert parallelism: the residual is whole
  // here and every expert local), the batch-invariant mode aside (its router runs apart at every
  // size), and a router the fold's kernels hold (bf16, E <= 128, top-k <= 8).
  router_fold_mode_ = env_int("GPTOSS_ROUTER_FOLD", 1);
  fold_tokens_ = std::clamp(env_int("GPTOSS_ROUTER_FOLD_TOKENS", kRouterFoldMaxTokens), 1, kRouterFoldMaxTokens);
  combine_fold_ = env_int("GPTOSS_COMBINE_FOLD", 2);
  router_fold_ = router_fold_mode_ != 0 && !tp_.active() && !invariant_ &&
                 cfg_.num_experts <= kRouterFoldMaxE && cfg_.experts_per_token <= 8;
  for (Layer& L : layers_) {
    if (!router_fold_ || L.router.fmt != WeightMat::kBF16) continue;
    bf16_t* wt = dalloc<bf16_t>(size_t(L.router.N) * L.router.K);
    router_fold_transpose(static_cast<const bf16_t*>(L.router.w), L.router.N, L.router.K, wt, stream_);
    L.router_t = wt;
  }
  if (invariant_ && !layers_.empty() && layers_[0].gate_up.fmt != WeightMat::kFragMXFP4)
    throw Error("--batch-invariant needs the experts in the fragment layout (rows % 16, K % 64); this model's " +
                std::string(tp_.active() ? "tensor-parallel slice (try --tp-expert-sharding expert) " : "") +
                "has down_proj K = " + std::to_string(layers_[0].down.K));
  if (mma && lm_head_.fmt == WeightMat::kMXFP4) in_place(lm_head_, 1, false);
  lm_head_dec_ = lm_head_.fmt == WeightMat::kBF16 ? dec_copy(lm_head_) : WeightMat{};
  int flag = 0;
  GPTOSS_CUDA_CHECK(cudaMemcpyAsync(&flag, d_flag_, 4, cudaMemcpyDeviceToHost, stream_));
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (flag) throw Error("MXFP4 scales above 2^113 (e8m0 byte > 240) are not supported by --mxfp4-backend mma; use gemv");
}

void CudaBackend::alloc_workspace() {
  const int T = max_chunk_, H = cfg_.hidden, E = cfg_.num_experts, k = cfg_.experts_per_token;
  const int QKV = cfg_.q_dim() + 2 * cfg_.kv_dim();
  const int P = T * k;
  x_ = dalloc<float>(size_t(T) * H);
  xn_ = dalloc<bf16_t>(size_t(T) * H);
  qkv_ = dalloc<bf16_t>(size_t(T) * QKV);
  attn_ = dalloc<bf16_t>(size_t(T) * cfg_.q_dim());
  size_t part = std::max(attention_partial_floats(T, cfg_.num_heads, cfg_.head_dim, 1),
                         attention_partial_floats(kMaxGraphBatch, cfg_.num_heads, cfg_.head_dim, kMaxSplits));
  partial_ = dalloc<float>(part);
  router_logits_ = dalloc<float>(size_t(T) * E);
  act_ = dalloc<bf16_t>(size_t(P) * cfg_.intermediate);
  moe_y_ = dalloc<float>(size_t(P) * H);
  routing_ = moe_routing_carve(dalloc<uint8_t>(moe_routing_bytes(P, E)), P, E);
  d_logits_ = dalloc<float>(size_t(kMaxLogitRows) * cfg_.vocab);
  if (tp_.active()) {
    vocab_ld_ = tp_max_vocab_slice(model_cfg_, tp_);
    d_vocab_gather_ = dalloc<float>(size_t(tp_.world) * kMaxLogitRows * vocab_ld_);
    d_vocab_pairs_ = dalloc<RowMax>(size_t(tp_.world) * kMaxLogitRows);
  }
  d_greedy_ = dalloc<int32_t>(kMaxLogitRows);
  d_lp_ = dalloc<float>(kMaxLogitRows);
  d_ticket_ = dalloc<int>(1);  // moe_router_route's last-block counter: zero between launches
  if (router_fold_) {
    fold_acc_ = dalloc<long long>(layers_.size() * (fold_acc_layer() + H));  // the router's sums, then fold_moe_
    fold_moe_ = fold_acc_ + layers_.size() * fold_acc_layer();
    fold_xg_ = dalloc<float>(size_t(kRouterFoldMaxTokens) * H);
    fold_bias_ = dalloc<float>(E);
  }
  GPTOSS_CUDA_CHECK(cudaMemsetAsync(d_ticket_, 0, sizeof(int), stream_));
  d_how_ = dalloc<RowSampling>(kMaxLogitRows);
  streamk_prepare();  // the stream-K decode kernel's workspace, before any graph capture
}

size_t CudaBackend::kv_memory_available() const {
  GPTOSS_CUDA_CHECK(cudaSetDevice(device_));  // the caller's thread may have another current device
  size_t free_b = 0, total = 0;
  GPTOSS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
  // Whatever KV pools exist now are given back by init_kv_cache; keep a margin for the
  // metadata blocks, graphs and the CUDA context's own growth.
  size_t have = kv_pool_[0].bytes() + kv_pool_[1].bytes();
  size_t margin = size_t(1) << 30;
  size_t avail = free_b + have;
  return avail > margin ? avail - margin : 0;
}

int CudaBackend::default_max_num_batched_tokens() const {
  // vLLM's rule for its API server: 8192 on GPUs with 70 GiB or more (H100, H200), but not an
  // A100, where a larger budget measured slower for vLLM. On an H200 it took 20b at 64 streams
  // from 7607 to 7895-8044 tok/s output, the median TTFT from 129 to 316 ms (docs/BENCHMARKS.md).
  cudaDeviceProp p{};
  GPTOSS_CUDA_CHECK(cudaGetDeviceProperties(&p, device_));
  const bool large = p.totalGlobalMem >= (size_t(70) << 30) && std::string(p.name).find("A100") == std::string::npos;
  return large ? 8192 : Backend::default_max_num_batched_tokens();
}

void CudaBackend::init_kv_cache(const KvCacheConfig& kv) {
  if (kv.dtype != DType::BF16 && kv.dtype != DType::F8_E4M3)
    throw Error("cuda backend: KV cache dtype must be bf16 or fp8 (e4m3)");
  if (kv.page_size <= 0) throw Error("cuda backend: page_size must be positive");
  GPTOSS_CUDA_CHECK(cudaSetDevice(device_));
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
  kvc_ = kv;
  for (int g = 0; g < 2; ++g) {
    kv_pool_[g].reset();
    int layers = g == kKvSliding ? cfg_.num_sliding_layers() : cfg_.num_full_layers();
    // One extra page per group: padding tokens of a graph bucket write their K/V there.
    kv_layer_bytes_[g] = size_t(kv.num_pages[g] + 1) * kv_page_bytes(cfg_, KvGroup(g), kv.page_size, kv.dtype) /
                         std::max(1, layers);
    if (layers > 0) kv_pool_[g].alloc(kv_layer_bytes_[g] * layers);
  }
}

int CudaBackend::splits_for(int n) const {
  if (invariant_) return 1;  // a token's attention sums must not depend on how many share its pass
  int blocks = n * cfg_.num_kv_heads;
  int s = (264 + blocks - 1) / blocks;
  return std::clamp(s, 1, kMaxSplits);
}

int CudaBackend::plan_decode_attention(const Staged& st, int n, bool one_each, bool graphed, PassMeta* m) const {
  // Stored mode only on tensor cores (the CUDA-core per-token kernel is attention()'s own path).
  const bool stored = !one_each && graphed && decode_attn_mma_;
  m->decode_attn = (one_each || stored) && !invariant_ && decode_attn_ != DecodeAttn::kOff;
  m->attn_kv_stored = m->decode_attn && stored;
  if (!m->decode_attn) return 0;
  int max_pos = 0;
  for (int32_t p : st.pos) max_pos = std::max(max_pos, p);
  const int full_keys = max_pos + 1;
  const int sliding_keys = cfg_.sliding_window > 0 ? std::min(full_keys, cfg_.sliding_window) : full_keys;
  if (decode_attn_ == DecodeAttn::kSplit) {
    m->attn_full = m->attn_sliding = DecodeAttentionPlan{splits_for(n), false, decode_attn_mma_};
  } else {
    // (GPTOSS_DECODE_CLUSTER_MAX: a smaller cap, for measurements.)
    static const int cap = env_int("GPTOSS_DECODE_CLUSTER_MAX", 16);
    const int most = std::min(cap, decode_attn_ == DecodeAttn::kAuto16 ? 16 : 8);
    m->attn_full = decode_attention_plan(n, cfg_.num_kv_heads, full_keys, splits_for(n), most, decode_attn_mma_);
    m->attn_sliding = decode_attention_plan(n, cfg_.num_kv_heads, sliding_keys, splits_for(n), most, decode_attn_mma_);
  }
  auto code = [](const DecodeAttentionPlan& p) { return (p.nsplit * 2 + (p.cluster ? 1 : 0)) * 2 + (p.mma ? 1 : 0); };
  return 1 + code(m->attn_full) * 1000 + code(m->attn_sliding) + (m->attn_kv_stored ? 1000000 : 0);
}

CudaBackend::PassMeta CudaBackend::upload_meta(const Staged& st, int n, int n_rows) {
  timeline_.work(stream_);
  const PassMetaLayout lay = pass_meta_layout(n, n_rows, st.pt.size());
  size_t need = lay.end + kMaxLogitRows + 16;
  if (need > meta_cap_) {
    // Growing moves the block: graphs captured against the old one must go.
    GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
    size_t cap = std::max<size_t>(need * 2, size_t(1) << 20);
    meta_.alloc(cap * 4);
    for (int i = 0; i < 2; ++i) {
      if (h_meta_buf_[i]) cudaFreeHost(h_meta_buf_[i]);
      GPTOSS_CUDA_CHECK(cudaMallocHost(&h_meta_buf_[i], cap * 4));
      if (!meta_copied_[i]) GPTOSS_CUDA_CHECK(cudaEventCreateWithFlags(&meta_copied_[i], cudaEventDisableTiming));
      GPTOSS_CUDA_CHECK(cudaEventRecord(meta_copied_[i], stream_));  // (the stream is idle)
    }
    meta_cap_ = cap;
  }
  // The other block: the copy that read it last (two passes back) must be done with it; the
  // pass before this one may still be running.
  meta_slot_ ^= 1;
  GPTOSS_CUDA_CHECK(cudaEventSynchronize(meta_copied_[meta_slot_]));
  h_meta_ = h_meta_buf_[meta_slot_];
  // Each part at its fixed place (pass_meta_layout: a captured graph reads them there on every
  // replay); a vector shorter than its part leaves the rest unwritten.
  int32_t* h = h_meta_;
  auto put = [&](const std::vector<int32_t>& v, size_t at) { std::memcpy(h + at, v.data(), v.size() * 4); };
  put(st.tokens, lay.tokens);
  put(st.pos, lay.pos);
  put(st.off0, lay.off0);
  put(st.off1, lay.off1);
  put(st.rows, lay.rows);
  h[lay.n_real] = st.n_real < 0 ? n : st.n_real;
  put(st.pt, lay.pt);
  GPTOSS_CUDA_CHECK(cudaMemcpyAsync(meta_.get(), h, lay.end * 4, cudaMemcpyHostToDevice, stream_));
  GPTOSS_CUDA_CHECK(cudaEventRecord(meta_copied_[meta_slot_], stream_));
  // A pipelined pass's tokens: the ids the previous one picked, row for row, still in d_greedy_.
  // (Real tokens only: a graph bucket's padding keeps its uploaded ids.)
  if (tokens_from_device_)
    GPTOSS_CUDA_CHECK(cudaMemcpyAsync(meta_.get<int32_t>() + lay.tokens, d_greedy_,
                                      size_t(st.n_real >= 0 ? st.n_real : n) * 4, cudaMemcpyDeviceToDevice, stream_));
  const int32_t* d = meta_.get<int32_t>();
  PassMeta m{d + lay.tokens, d + lay.pos, {d + lay.off0, d + lay.off1}, d + lay.pt, d + lay.rows, st.attn, false, {}, {}};
  if (st.n_real >= 0) m.n_real = d + lay.n_real;
  return m;
}

void CudaBackend::lm_head(const int32_t* rows, int n_rows) {
  rmsnorm(x_, final_norm_, n_rows, cfg_.hidden, cfg_.rms_eps, rows, xn_, stream_);
  // Tensor-parallel: this rank's vocab slice into its part of the gather buffer (the caller
  // follows with tp_greedy or tp_gather_logits).
  float* out = tp_.active() ? d_vocab_gather_ + size_t(tp_.rank) * n_rows * vocab_ld_ : d_logits_;
  Epilogue e{Epilogue::kStoreF32, out, tp_.active() ? vocab_ld_ : cfg_.vocab};
  const bool dec = lm_head_dec_.fmt != WeightMat::kBF16 && dense_decode_copies(n_rows);
  linear(dec ? lm_head_dec_ : lm_head_, xn_, cfg_.hidden, n_rows, e, stream_, invariant_, blas_.get());
}

void CudaBackend::run_pass(int n, const PassMeta& m, int n_rows, int nsplit) {
  const GptOssConfig& c = cfg_;
  const int H = c.hidden, QKV = c.q_dim() + 2 * c.kv_dim(), E = c.num_experts, k = c.experts_per_token;
  if (profile_) {
    prof_class_ = n <= kSkinnyMaxTokens ? 0 : 1;
    GPTOSS_CUDA_CHECK(cudaEventRecord(prof_start_, stream_));
  }
  if (router_fold_ && n <= fold_tokens_)  // the fold's sums start at zero in every layer
    GPTOSS_CUDA_CHECK(cudaMemsetAsync(fold_acc_, 0, layers_.size() * (fold_acc_layer() + H) * sizeof(long long), stream_));
  embed(embed_, m.tokens, n, H, x_, stream_);
  // Each layer's input norm comes with the residual update that precedes it: the first here,
  // the others from the previous layer's MoE combine.
  if (!layers_.empty()) rmsnorm(x_, layers_[0].attn_norm, n, H, c.rms_eps, nullptr, xn_, stream_);
  mark("embed");
  const bool small = n <= kSkinnyMaxTokens || invariant_;
  const bool dense_decode_copy = dense_decode_copies(n);
  const bool inv = invariant_;
  // The combine folded (RouterFold::moe_out, one token): layer li's MoE output, in fixed point,
  // that layer li + 1's qkv and o_proj take in place of a combine launch; null when none is.
  const long long* moe_pending = nullptr;
  // (Not with the timing diagnostics of GPTOSS_CUDA_SKIP: a layer whose router fold they turn off
  // would leave the previous layer's MoE output unadded.)
  const bool combine_fold =
      router_fold_ && combine_fold_ && n == 1 && !tap_layers_ && router_fold_mode_ == 1 && skip_.empty();
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& L = layers_[li];
    const int g = L.sliding ? kKvSliding : kKvFull;
    KvLayer kv{static_cast<uint8_t*>(kv_pool_[g].get()) + kv_layer_bytes_[g] * L.group_index,
               kvc_.dtype == DType::F8_E4M3, kvc_.page_size};
    TokenMeta tm{m.pos, m.pt_off[g], m.pt};
    const WeightMat& Wqkv = dense_decode_copy && L.qkv_dec.fmt != WeightMat::kBF16 ? L.qkv_dec : L.qkv;
    const WeightMat& Wo = dense_decode_copy && L.o_dec.fmt != WeightMat::kBF16 ? L.o_dec : L.o;
    if (!skip("dense")) {
      const Epilogue qe{Epilogue::kStoreBF16, qkv_, QKV};
      if (moe_pending) {  // the previous layer's combine folded: qkv normalizes x + its MoE output
        if (!linear_norm_in(Wqkv, NormIn{x_, moe_pending, L.attn_norm, c.rms_eps}, n, qe, stream_))
          throw Error("combine fold: qkv's kernel does not take the previous layer's MoE output");
      } else {
        linear(Wqkv, xn_, H, n, qe, stream_, inv, blas_.get());
      }
    }
    mark("qkv");
    if (!skip("attn") && m.decode_attn) {
      if (m.attn_kv_stored) {
        rope_kv_store(qkv_, n, c.num_heads, c.num_kv_heads, c.head_dim, inv_freq_, yarn_.attention_scaling, tm, kv,
                      stream_);
        mark("rope_kv");
      }
      attention_decode(qkv_, n, c.num_heads, c.num_kv_heads, c.head_dim, L.sliding ? c.sliding_window : 0, L.sinks,
                       inv_freq_, yarn_.attention_scaling, tm, kv, L.sliding ? m.attn_sliding : m.attn_full, partial_,
                       attn_, stream_, m.attn_kv_stored);
    } else if (!skip("attn")) {
      rope_kv_store(qkv_, n, c.num_heads, c.num_kv_heads, c.head_dim, inv_freq_, yarn_.attention_scaling, tm, kv,
                    stream_);
      mark("rope_kv");
      attention(qkv_, n, c.num_heads, c.num_kv_heads, c.head_dim, L.sliding ? c.sliding_window : 0, L.sinks, tm, kv,
                nsplit, partial_, attn_, stream_, inv ? AttentionPath::kFlash : AttentionPath::kAuto,
                m.attn);
    }
    mark("attention");
    // The skinny kernels take fp16 activations (their MMA type for MXFP4): the router's fused
    // norm leaves the rows in fp16 (same buffer, other type), SwiGLU hands fp16 to down.
    const bool dec_experts = small && L.gate_up_dec.fmt != WeightMat::kBF16;
    const WeightMat& Wgu = dec_experts ? L.gate_up_dec : L.gate_up;
    const WeightMat& Wdn = dec_experts ? L.down_dec : L.down;
    const bool skinny = is_skinny_family(choose_linear_kernel({Wgu.fmt, n * k, n, Wgu.N, Wgu.K, true, 0, inv}));
    const bool xn_f16 = skinny && !inv && linear_rmsnorm_fuses(L.router, n);
    // The router's GEMV normalizes in place (decode sizes) and leaves the rows for the experts;
    // batch-invariant mode normalizes apart at every size (the fused norm sums in another order).
    // Decode sizes: norm, router and routing in one launch (router_route_fuses).
    const bool fused_route = !inv && L.router.fmt == WeightMat::kBF16 && router_route_fuses(n, H, E, k);
    // GPTOSS_CUDA_SKIP=route_once: the router runs in layer 0 only, the others reuse its routing
    // (and its normalized rows): what the router's launches cost inside the step.
    const bool route_once = skip("route_once") && li > 0;
    // 1-kRouterFoldMaxTokens tokens: the router folded into o_proj (RouterFold), where o_proj's kernel takes it.
    RouterFold fold{fold_acc_ + li * fold_acc_layer(), L.router_t, L.mlp_norm, L.router.bias, fold_bias_, fold_xg_,
                    c.rms_eps, E, k, H, false};
    fold.moe_in = moe_pending;
    fold.n = n;
    fold.n_valid = route_padding_ ? nullptr : m.n_real;  // a bucket's padding takes no pair, as in the router
    const bool try_fold = n <= fold_tokens_ && L.router_t && fused_route && skinny && xn_f16 && router_fold_experts_take(Wgu) &&
                          router_fold_experts_take(Wdn) && !skip("router") && !skip("experts") && !route_once;
    bool folded = false;
    // Tensor-parallel: rank 0 adds its o_proj part to the residual, the others store theirs; the
    // all-reduce sums them.
    const bool o_store = tp_.active() && !tp_.root();
    if (!skip("dense")) {
      const Epilogue oe{o_store ? Epilogue::kStoreF32 : Epilogue::kAddF32, x_, H};
      if (try_fold) folded = linear_router_fold(Wo, attn_, c.q_dim(), n, oe, fold, stream_);
      if (!folded) linear(Wo, attn_, c.q_dim(), n, oe, stream_, inv, blas_.get());
      // GPTOSS_ROUTER_FOLD=2 (a timing diagnostic): o_proj computes the fold's sums, and the
      // router and the experts still run as without the fold.
      if (folded && router_fold_mode_ == 2) folded = false;
    }
    if (moe_pending && !folded)
      throw Error("combine fold: o_proj did not take the previous layer's MoE output (its router fold did not run)");
    // This layer's combine folded into the next layer's qkv and o_proj: every layer but the last,
    // where the router folded (the next one's will: the layers share their shapes).
    const bool fold_combine = combine_fold && folded && li + 1 < layers_.size() &&
                              (combine_fold_ == 2 || Wqkv.fmt != WeightMat::kFragMXFP4);
    if (fold_combine) fold.moe_out = fold_moe_ + li * size_t(H);
    moe_pending = nullptr;
    tp_all_reduce_x(n);
    mark("o_proj");
    if (route_once || folded) {
      // layer 0's routing stays (route_once); the expert kernels route from the fold's sums
    } else if (!skip("router") && fused_route) {
      MoeRouting rr = routing_;
      rr.n_valid = route_padding_ ? nullptr : m.n_real;
      moe_router_route(static_cast<const bf16_t*>(L.router.w), L.router.bias, E, H, x_, L.mlp_norm, c.rms_eps, n, xn_,
                       xn_f16, router_logits_, k, rr, d_ticket_, stream_, experts_begin_, experts_end_);
    } else if (!skip("router")) {
      const Epilogue re{Epilogue::kStoreF32, router_logits_, E};
      if (inv) {
        rmsnorm(x_, L.mlp_norm, n, H, c.rms_eps, nullptr, xn_, stream_);
        linear(L.router, xn_, H, n, re, stream_, true);
      } else {
        linear_rmsnorm(L.router, x_, L.mlp_norm, c.rms_eps, n, xn_, true, re, stream_, xn_f16, blas_.get());
      }
    }
    mark("norm+router");
    if (!skip("router") && !fused_route && !route_once)
      moe_route(router_logits_, n, E, k, routing_, stream_, experts_begin_, experts_end_);
    // Expert-parallel: pairs routed to other ranks' experts are not computed here; their rows
    // of moe_y_ must add nothing in the combine.
    if (expert_parallel() && !skip("experts"))
      GPTOSS_CUDA_CHECK(cudaMemsetAsync(moe_y_, 0, size_t(n) * k * H * sizeof(float), stream_));
    mark("route");
    Epilogue gu{Epilogue::kSwiGLU, act_, c.intermediate};
    gu.swiglu_limit = c.swiglu_limit;
    gu.out_f16 = skinny;
    const Epilogue dn{Epilogue::kStoreF32, moe_y_, H};
    // Prefill on version 5 for both GEMMs: gate_up reads a copy of the normalized rows already in
    // the fragment K order (in qkv_, free since o_proj) and stores its SwiGLU output in that order
    // for down, so neither transposes its activations in shared memory.
    const bool kperm = expert_kperm_ && !skinny && !inv && !skip("experts") && QKV >= H &&
                       expert_gemm_v5_runs(Wgu, xn_, H, n * k, E, true, gu, n, inv) &&
                       expert_gemm_v5_runs(Wdn, act_, c.intermediate, n * k, E, false, dn, n, inv);
    const bf16_t* gu_in = xn_;
    if (kperm) {
      permute_rows_frag_k(xn_, n, H, qkv_, stream_);
      gu_in = qkv_;
      gu.k_permuted = true;
    }
    MoeRouting routing_gu = routing_;
    if (folded) {
      routing_gu.fold = fold;
      routing_gu.fold.gate_up = true;
      routing_gu.fold.moe_out = nullptr;  // down's
    }
    if (!skip("experts")) linear_grouped(Wgu, gu_in, H, n * k, E, true, routing_gu, gu, stream_, n, xn_f16, inv, kperm);
    mark("gate_up");
    // The routing came two launches back (gate_up ran between): down reads it, and issues its
    // first weight loads, before waiting on gate_up (MoeRouting::settled).
    MoeRouting routing_settled = routing_;
    routing_settled.settled = true;
    if (folded) routing_settled.fold = fold;
    if (!skip("experts"))
      linear_grouped(Wdn, act_, c.intermediate, n * k, E, false, routing_settled, dn, stream_, n, skinny, inv, kperm);
    mark("down");
    const float* next_norm = li + 1 < layers_.size() ? layers_[li + 1].attn_norm : nullptr;
    if (tp_.active()) {
      // Decode sizes: combine, all-reduce and the next norm in one peer-memory kernel
      // (ll_allreduce.h); batch-invariant mode keeps the separate kernels at every size.
      const ResidualAllReduce fused{x_, n, H, tp_.root(), moe_y_, routing_, k, next_norm, c.rms_eps, xn_};
      if (inv || skip("experts") || !cuda_comm_ || !cuda_comm_->residual_all_reduce(fused, stream_)) {
        // The next layer's norm needs the whole residual: combine, all-reduce, then normalize.
        tp_zero_x_off_root(n);
        if (!skip("experts")) moe_combine(moe_y_, routing_, n, k, H, x_, nullptr, c.rms_eps, xn_, stream_, inv);
        tp_all_reduce_x(n);
        if (next_norm) rmsnorm(x_, next_norm, n, H, c.rms_eps, nullptr, xn_, stream_);
      }
    } else if (fold_combine) {
      moe_pending = fold.moe_out;  // down added the MoE output there; the next layer takes it
    } else if (!skip("experts")) {
      // (GPTOSS_CUDA_SKIP=combine: no combine launch at all, the next layer reading stale rows:
      // the most a fold of the combine into its neighbours can save.)
      if (!skip("combine")) moe_combine(moe_y_, routing_, n, k, H, x_, next_norm, c.rms_eps, xn_, stream_, inv);
    } else if (next_norm) {
      rmsnorm(x_, next_norm, n, H, c.rms_eps, nullptr, xn_, stream_);
    }
    mark("combine");
    if (tap_layers_)
      for (size_t i = 0; i < tap_layers_->size(); ++i)
        if ((*tap_layers_)[i] == int(li)) {
          if (tap_device_)
            tap_store(x_, n, H, tap_dst_rows_, tap_dst0_, int(i), int(tap_layers_->size()), tap_dst_, stream_);
          else
            GPTOSS_CUDA_CHECK(cudaMemcpyAsync(tap_stage_.data() + i * size_t(n) * H, x_,
                                              size_t(n) * H * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        }
  }
  if (moe_pending) throw Error("combine fold: the last layer's MoE output was not added");
  if (n_rows > 0 && !skip("lm_head")) lm_head(m.rows, n_rows);
  mark("lm_head");
  collect_profile();
}

void CudaBackend::stage_chunk(const ForwardBatch& b, int t0, int t1, Staged* st, std::vector<int>* seq_of) {
  // Two leading page-table entries hold each group's spare page (for padding tokens).
  st->pt.assign({kvc_.num_pages[0], kvc_.num_pages[1]});
  const int ps = kvc_.page_size;
  for (const SeqBatchInfo& s : b.seqs) {
    int a = std::max(t0, s.first_token), e = std::min(t1, s.first_token + s.n_tokens);
    if (a >= e) continue;
    AttentionPassInfo& ai = st->attn;
    ai.min_seq_tokens = ai.num_seqs++ == 0 ? e - a : std::min(ai.min_seq_tokens, e - a);
    ai.max_seq_tokens = std::max(ai.max_seq_tokens, e - a);
    ai.seq_tokens.push_back(e - a);  // (pass rows follow b.seqs' order)
    int last_pos = s.start_pos + (e - s.first_token) - 1;
    int need = last_pos / ps + 1;
    int off[2];
    for (int g = 0; g < 2; ++g) {
      int layers = g == kKvSliding ? cfg_.num_sliding_layers() : cfg_.num_full_layers();
      off[g] = int(st->pt.size());
      if (layers == 0) {
        st->pt.push_back(kvc_.num_pages[g]);
        off[g] = g;
        continue;
      }
      if (s.n_pages[g] < need || !s.pages[g])
        throw Error("cuda backend: sequence page table too short for position " + std::to_string(last_pos));
      for (int i = 0; i < need; ++i) {
        int p = s.pages[g][i];
        if (p >= kvc_.num_pages[g]) throw Error("cuda backend: page id out of range");
        st->pt.push_back(p);
      }
      // Pages of the new tokens must exist (sliding entries below the window may be -1).
      for (int t = a; t < e; ++t) {
        int pos = s.start_pos + (t - s.first_token);
        if (s.pages[g][pos / ps] < 0) throw Error("cuda backend: no page for a new token");
      }
    }
    for (int t = a; t < e; ++t) {
      int tok = b.tokens[t];
      if (tok < 0 || tok >= cfg_.vocab) throw Error("cuda backend: token id out of range");
      st->tokens.push_back(tok);
      st->pos.push_back(s.start_pos + (t - s.first_token));
      st->off0.push_back(off[0]);
      st->off1.push_back(off[1]);
    }
  }
  (void)seq_of;
}

void CudaBackend::sample_on_device(const std::vector<RowSampling>& per, int n, bool logprobs) {
  GPTOSS_CUDA_CHECK(cudaMemcpyAsync(d_how_, per.data(), n * sizeof(RowSampling), cudaMemcpyHostToDevice, stream_));
  sample_rows(d_logits_, n, cfg_.vocab, d_how_, d_greedy_, stream_, logprobs ? d_lp_ : nullptr);
}

void CudaBackend::run_batch(const ForwardBatch& b, float* logits, int32_t* greedy, const RowSampling* how,
                            float* logprobs) {
  // Several backends (tensor-parallel ranks) may share a process; the current device is per thread.
  GPTOSS_CUDA_CHECK(cudaSetDevice(device_));
  if (pipe_slot_ < 0) greedy_chain_ = false;  // d_greedy_ will not hold a pipelined pass's ids
  if (timeline_.on()) {
    int most = 0;
    for (const SeqBatchInfo& q : b.seqs) most = std::max(most, int(q.n_tokens));
    timeline_.begin(stream_, int(b.tokens.size()), most);
  }
  run_batch_impl(b, logits, greedy, how, logprobs);
  timeline_.end(stream_);
}

void CudaBackend::run_batch_impl(const ForwardBatch& b, float* logits, int32_t* greedy, const RowSampling* how,
                                 float* logprobs) {
  const int M = int(b.tokens.size());
  if (kvc_.num_pages[0] + kvc_.num_pages[1] == 0) throw Error("cuda backend: init_kv_cache first");
  tap_layers_ = nullptr;
  last_taps_ = {};
  if (M == 0) return;
  int covered = 0;
  for (const SeqBatchInfo& s : b.seqs) covered += s.n_tokens;
  if (covered != M) throw Error("cuda backend: sequences do not cover the batch's tokens");
  // Graph buckets serve decode steps and speculative verify passes alike (1 + K tokens a
  // sequence, logits for each row, mixed with plain decoding sequences): a captured pass depends
  // only on its padded token count B (kernel choices, splits and metadata offsets follow from
  // B), while which tokens belong to which sequence, their positions and pages are metadata.
  // Tokens of one sequence attend to each other as in an eager pass: every K/V is stored before
  // attention reads the pages. The lm_head runs on all B rows; the wanted ones are picked below.
  // Hidden-state taps (Eagle3) copied to the host take the eager path (the graphs do not copy
  // them out); taps kept on the device are graphed too, when the pass rows are in batch order.
  const bool taps = !b.tap_layers.empty(), taps_dev = taps && b.taps_on_device;
  bool decode = M <= kMaxGraphBatch && !profile_ && (!taps || taps_dev);
  for (int32_t l : b.tap_layers)
    if (l < 0 || l >= cfg_.num_layers) throw Error("cuda backend: tapped layer " + std::to_string(l) + " does not exist");
  if (taps && !b.tap_out && !taps_dev) throw Error("cuda backend: hidden-state taps asked without an output buffer");
  if (taps_dev && tp_.active()) throw Error("cuda backend: device taps are not supported with tensor parallelism");
  const int tap_width = int(b.tap_layers.size()) * cfg_.hidden;
  if (taps_dev && !graph_taps_) graph_taps_ = dalloc<bf16_t>(size_t(kMaxGraphBatch) * 3 * cfg_.hidden);
  if (taps_dev && b.tap_layers.size() > 3) throw Error("cuda backend: at most 3 device tap layers");
  for (const SeqBatchInfo& s : b.seqs) decode &= s.n_tokens <= kMaxGraphSeqTokens;
  if (taps_dev) {  // graphed taps land in batch order: the sequences must be laid out in order
    int at = 0;
    for (const SeqBatchInfo& s : b.seqs) {
      decode &= s.first_token == at;
      at += s.n_tokens;
    }
  }
  const int V = cfg_.vocab;
  // Tensor-parallel greedy rows (forward_greedy, or samples that are all at temperature 0, as the
  // engine asks for greedy requests): the vocab-parallel argmax, no logits gathered.
  const bool tp_pairs = tp_.active() && greedy &&
                        (!how || std::all_of(how, how + b.logit_rows.size(),
                                             [](const RowSampling& s) { return s.temperature < 1e-5f; }));
  if (decode) {
    const int B = graph_bucket(M);
    Staged st;
    stage_chunk(b, 0, M, &st, nullptr);
    const bool one_each = st.attn.max_seq_tokens == 1;
    // A graph is replayed for other batches of its bucket: attention's kernel choice must not
    // follow this batch's shape (a capture of 16-token sequences would hold only the flash
    // kernel, wrong for a later decode step). The fused decode kernel serves passes of one token
    // a sequence, its stored mode (and the per-token kernel) any pass; the graph key says which.
    st.attn = AttentionPassInfo{};
    st.n_real = M;  // the router gives the padding tokens no expert (MoeRouting::n_valid)
    for (int i = M; i < B; ++i) {  // padding tokens: position 0 on the spare pages
      st.tokens.push_back(0);
      st.pos.push_back(0);
      st.off0.push_back(0);
      st.off1.push_back(1);
    }
    // Token order of the staged pass may differ from the batch's: map batch index -> pass row.
    std::vector<int> row_of(M, -1);
    {
      int r = 0;
      for (const SeqBatchInfo& s : b.seqs)
        for (int t = s.first_token; t < s.first_token + s.n_tokens; ++t) row_of[t] = r++;
    }
    for (int32_t t : b.logit_rows)
      if (t < 0 || t >= M) throw Error("cuda backend: logit row out of range");
    for (int i = 0; i < B; ++i) st.rows.push_back(i);
    PassMeta pm = upload_meta(st, B, B);
    // Graphs with device taps are their own (they hold the tap stores), per set of tapped layers;
    // decode passes (one token a sequence) have their own, per decode attention plan.
    const int attn_key = plan_decode_attention(st, B, one_each, true, &pm);
    const GraphKey key{B, attn_key, taps_dev ? b.tap_layers : std::vector<int32_t>{}};
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      cudaGraph_t graph;
      if (taps_dev) {
        tap_layers_ = &b.tap_layers;
        tap_device_ = true;
        tap_dst_ = graph_taps_;
        tap_dst_rows_ = nullptr;
        tap_dst0_ = 0;
      }
      GPTOSS_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      run_pass(B, pm, B, splits_for(B));
      tap_layers_ = nullptr;
      if (!tp_.active()) argmax_rows(d_logits_, B, V, d_greedy_, stream_);
      GPTOSS_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      cudaGraphExec_t exec;
      GPTOSS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      cudaGraphDestroy(graph);
      it = graphs_.emplace(key, exec).first;
    }
    GPTOSS_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    if (taps_dev) last_taps_ = DeviceTaps{graph_taps_, M};
    // Tensor-parallel: the graph ends at each rank's vocab slice; greedy exchanges row maxima,
    // logits and sampling gather the rows (queued while the graph runs).
    if (tp_pairs) tp_greedy(B, how != nullptr);
    else if (tp_.active()) tp_gather_logits(B);
    if (how && !tp_pairs) {
      std::vector<RowSampling> per(B);  // padding rows draw too, harmlessly
      for (size_t i = 0; i < b.logit_rows.size(); ++i) per[row_of[b.logit_rows[i]]] = how[i];
      sample_on_device(per, B, logprobs != nullptr);
      std::vector<int32_t> ids(B);
      std::vector<float> lps(logprobs ? B : 0);
      GPTOSS_CUDA_CHECK(cudaMemcpyAsync(ids.data(), d_greedy_, B * 4, cudaMemcpyDeviceToHost, stream_));
      if (logprobs) GPTOSS_CUDA_CHECK(cudaMemcpyAsync(lps.data(), d_lp_, B * 4, cudaMemcpyDeviceToHost, stream_));
      GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (size_t i = 0; i < b.logit_rows.size(); ++i) {
        greedy[i] = ids[row_of[b.logit_rows[i]]];
        if (logprobs) logprobs[i] = lps[row_of[b.logit_rows[i]]];
      }
    } else if (greedy && pipe_slot_ >= 0) {
      // launch_greedy: the ids (rows in order: check_pipelined_batch) to a pinned slot; no wait.
      GPTOSS_CUDA_CHECK(cudaMemcpyAsync(h_greedy_[pipe_slot_], d_greedy_, M * 4, cudaMemcpyDeviceToHost, stream_));
      GPTOSS_CUDA_CHECK(cudaEventRecord(greedy_copied_[pipe_slot_], stream_));
      pipe_copied_ = true;
    } else if (greedy) {
      std::vector<int32_t> ids(B);
      GPTOSS_CUDA_CHECK(cudaMemcpyAsync(ids.data(), d_greedy_, B * 4, cudaMemcpyDeviceToHost, stream_));
      GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      for (size_t i = 0; i < b.logit_rows.size(); ++i) greedy[i] = ids[row_of[b.logit_rows[i]]];
    } else {
      for (size_t i = 0; i < b.logit_rows.size(); ++i)
        GPTOSS_CUDA_CHECK(cudaMemcpyAsync(logits + i * size_t(V), d_logits_ + size_t(row_of[b.logit_rows[i]]) * V,
                                          size_t(V) * 4, cudaMemcpyDeviceToHost, stream_));
      GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    return;
  }
  // Eager path: chunks of max_chunk_ tokens in batch order (each token attends through the
  // pages, so a sequence split across chunks sees its earlier tokens' K/V).
  for (int t0 = 0; t0 < M; t0 += max_chunk_) {
    int t1 = std::min(M, t0 + max_chunk_);
    Staged st;
    stage_chunk(b, t0, t1, &st, nullptr);
    // Pass rows follow the sequences' order within the chunk.
    std::vector<int> row_of(t1 - t0, -1);
    {
      int r = 0;
      for (const SeqBatchInfo& s : b.seqs)
        for (int t = std::max(t0, s.first_token); t < std::min(t1, s.first_token + s.n_tokens); ++t)
          row_of[t - t0] = r++;
    }
    std::vector<int> outs;  // output indices whose logits come from this chunk
    for (size_t i = 0; i < b.logit_rows.size(); ++i) {
      int t = b.logit_rows[i];
      if (t < 0 || t >= M) throw Error("cuda backend: logit row out of range");
      if (t >= t0 && t < t1) outs.push_back(int(i));
    }
    int n = t1 - t0;
    int first = std::min<int>(kMaxLogitRows, outs.size());
    for (int i = 0; i < first; ++i) st.rows.push_back(row_of[b.logit_rows[outs[i]] - t0]);
    PassMeta pm = upload_meta(st, n, first);
    plan_decode_attention(st, n, st.attn.max_seq_tokens == 1, false, &pm);
    if (taps_dev) {
      // The whole batch's rows (chunks fill their parts); pass row -> batch token.
      if (t0 == 0 && dev_taps_.bytes() < size_t(M) * tap_width * sizeof(bf16_t))
        dev_taps_.alloc(size_t(M) * tap_width * sizeof(bf16_t));
      if (tap_rows_.bytes() == 0) tap_rows_.alloc(size_t(max_chunk_) * sizeof(int32_t));
      tap_rows_host_.assign(size_t(n), -1);
      bool in_order = true;
      for (int t = t0; t < t1; ++t) {
        tap_rows_host_[size_t(row_of[t - t0])] = t;
        in_order &= row_of[t - t0] == t - t0;
      }
      if (!in_order)
        GPTOSS_CUDA_CHECK(cudaMemcpyAsync(tap_rows_.get(), tap_rows_host_.data(), size_t(n) * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, stream_));
      tap_layers_ = &b.tap_layers;
      tap_device_ = true;
      tap_dst_ = dev_taps_.get<bf16_t>();
      tap_dst_rows_ = in_order ? nullptr : tap_rows_.get<int32_t>();
      tap_dst0_ = t0;
    } else if (taps) {
      tap_layers_ = &b.tap_layers;
      tap_device_ = false;
      tap_stage_.resize(b.tap_layers.size() * size_t(n) * cfg_.hidden);
    }
    run_pass(n, pm, first, splits_for(n));
    if (taps_dev) {
      tap_layers_ = nullptr;
      last_taps_ = DeviceTaps{dev_taps_.get<bf16_t>(), M};
    } else if (tap_layers_) {  // pass row -> batch token: the [tokens, slots, H] layout of ForwardBatch::tap_out
      tap_layers_ = nullptr;
      GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      const size_t H = size_t(cfg_.hidden), slots = b.tap_layers.size();
      for (int t = t0; t < t1; ++t)
        for (size_t i = 0; i < slots; ++i)
          std::copy_n(tap_stage_.data() + (i * n + row_of[t - t0]) * H, H, b.tap_out + (size_t(t) * slots + i) * H);
    }
    for (size_t done = 0; done < outs.size();) {
      int cnt = std::min<int>(kMaxLogitRows, outs.size() - done);
      if (done > 0) {
        // More rows than one lm_head pass takes: stage the next batch of row indices.
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (int i = 0; i < cnt; ++i) h_meta_[i] = row_of[b.logit_rows[outs[done + i]] - t0];
        int32_t* drows = meta_.get<int32_t>() + (meta_cap_ - kMaxLogitRows);
        GPTOSS_CUDA_CHECK(cudaMemcpyAsync(drows, h_meta_, cnt * 4, cudaMemcpyHostToDevice, stream_));
        lm_head(drows, cnt);
      }
      if (tp_pairs) tp_greedy(cnt, how != nullptr);
      else if (tp_.active()) tp_gather_logits(cnt);
      if (greedy) {
        if (how && !tp_pairs) {
          std::vector<RowSampling> per(cnt);
          for (int i = 0; i < cnt; ++i) per[i] = how[outs[done + i]];
          sample_on_device(per, cnt, logprobs != nullptr);
        } else if (!tp_.active()) {
          argmax_rows(d_logits_, cnt, V, d_greedy_, stream_);
        }
        std::vector<int32_t> ids(cnt);
        std::vector<float> lps(logprobs && how && !tp_pairs ? cnt : 0);
        GPTOSS_CUDA_CHECK(cudaMemcpyAsync(ids.data(), d_greedy_, cnt * 4, cudaMemcpyDeviceToHost, stream_));
        if (!lps.empty())
          GPTOSS_CUDA_CHECK(cudaMemcpyAsync(lps.data(), d_lp_, cnt * 4, cudaMemcpyDeviceToHost, stream_));
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (int i = 0; i < cnt; ++i) greedy[outs[done + i]] = ids[i];
        if (!lps.empty())
          for (int i = 0; i < cnt; ++i) logprobs[outs[done + i]] = lps[i];
      } else {
        for (int i = 0; i < cnt; ++i)
          GPTOSS_CUDA_CHECK(cudaMemcpyAsync(logits + size_t(outs[done + i]) * V, d_logits_ + size_t(i) * V,
                                            size_t(V) * 4, cudaMemcpyDeviceToHost, stream_));
      }
      GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      done += cnt;
    }
  }
}

void CudaBackend::forward(const ForwardBatch& batch, float* logits) { run_batch(batch, logits, nullptr); }

void CudaBackend::forward_greedy(const ForwardBatch& batch, int32_t* tokens_out) {
  run_batch(batch, nullptr, tokens_out);
}

void CudaBackend::launch_greedy(const ForwardBatch& batch, bool tokens_from_last) {
  check_pipelined_batch(batch, tokens_from_last, last_greedy_.rows);
  if (pending_greedy_.size() >= 2) throw Error("launch_greedy: at most two passes in flight (finish_greedy the oldest)");
  const int M = int(batch.tokens.size());
  // On the device where the pass is a graph replay of one GPU (run_batch_impl's decode branch).
  // (Eagle3 taps and tensor parallelism take the synchronous path.)
  const bool on_device = !tp_.active() && !profile_ && M <= kMaxGraphBatch && batch.tap_layers.empty() &&
                         (!tokens_from_last || greedy_chain_);
  PendingGreedy p;
  p.rows = M;
  if (on_device) {
    if (!h_greedy_[0])
      for (int i = 0; i < 2; ++i) {
        GPTOSS_CUDA_CHECK(cudaMallocHost(&h_greedy_[i], kMaxLogitRows * sizeof(int32_t)));
        GPTOSS_CUDA_CHECK(cudaEventCreateWithFlags(&greedy_copied_[i], cudaEventDisableTiming));
      }
    // The slot the other pass in flight (at most one; checked above) does not use.
    p.slot = !pending_greedy_.empty() && pending_greedy_.back().slot == 0 ? 1 : 0;
    pipe_slot_ = p.slot;
    tokens_from_device_ = tokens_from_last;
    pipe_copied_ = false;
    std::vector<int32_t> ids(M);
    try {
      run_batch(batch, nullptr, ids.data());  // the graph branch leaves the ids to the slot
    } catch (...) {
      pipe_slot_ = -1;
      tokens_from_device_ = false;
      greedy_chain_ = false;
      throw;
    }
    pipe_slot_ = -1;
    tokens_from_device_ = false;
    if (!pipe_copied_) {  // an eager pass gave them synchronously
      p.slot = -1;
      p.ids = std::move(ids);
    }
  } else {
    // Synchronously, with the last pass's ids read back first where this pass takes them.
    ForwardBatch fed;
    const ForwardBatch* run = &batch;
    if (tokens_from_last) {
      fed = batch;
      fed.tokens = greedy_ids(last_greedy_);
      run = &fed;
    }
    p.ids.resize(M);
    forward_greedy(*run, p.ids.data());
  }
  last_greedy_ = p;
  // d_greedy_ holds this pass's ids in row order, however it ran on one GPU (a tensor-parallel
  // group's argmax leaves them elsewhere).
  greedy_chain_ = !tp_.active();
  pending_greedy_.push_back(std::move(p));
}

std::vector<int32_t> CudaBackend::greedy_ids(const PendingGreedy& p) {
  if (p.slot < 0) return p.ids;
  GPTOSS_CUDA_CHECK(cudaEventSynchronize(greedy_copied_[p.slot]));
  return std::vector<int32_t>(h_greedy_[p.slot], h_greedy_[p.slot] + p.rows);
}

void CudaBackend::finish_greedy(int32_t* tokens_out) {
  if (pending_greedy_.empty()) throw Error("finish_greedy: no pass launched");
  const std::vector<int32_t> ids = greedy_ids(pending_greedy_.front());
  std::copy(ids.begin(), ids.end(), tokens_out);
  pending_greedy_.erase(pending_greedy_.begin());
}

void CudaBackend::forward_sample(const ForwardBatch& batch, const RowSampling* rows, int32_t* tokens_out,
                                 float* logprobs_out) {
  if (logprobs_out && !samples_logprobs())
    throw Error("cuda backend: a tensor-parallel rank gives no logprobs from forward_sample");
  run_batch(batch, nullptr, tokens_out, rows, logprobs_out);
}

std::unique_ptr<Eagle3Head> CudaBackend::make_eagle3_head(std::shared_ptr<const Eagle3Weights> head) {
  if (tp_.active()) return nullptr;  // a rank's backend; the tensor-parallel group hands out no taps
  GPTOSS_CUDA_CHECK(cudaSetDevice(device_));
  Eagle3HeadEnv env;
  env.device = device_;
  env.stream = stream_;
  env.target = model_cfg_;
  env.target_embed = embed_;
  env.taps = [this] { return last_taps_; };
  std::string why;
  auto h = make_cuda_eagle3_head(std::move(head), env, &why);
  if (!h) std::fprintf(stderr, "eagle3: the draft head runs on the host: the cuda head does not take %s\n", why.c_str());
  return h;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) { return std::make_unique<CudaBackend>(opts); }

}  // namespace gptoss
