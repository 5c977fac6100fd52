#pragma once
// The CUDA backend's class, shared by the files that define it: cuda_backend.cpp (construction,
// workspaces, the KV pools), cuda_forward_pass.cpp (one pass over the model: its metadata,
// run_pass, lm_head, a chunk's staging), cuda_batches.cpp (a batch's passes: eager chunks and
// graph replays, the pipelined greedy steps, the device sampler) and cuda_weights.cpp (weights:
// checkpoint upload, random weights, tensor-parallel shards, the repacks into the kernels'
// layouts). Batches of decode and speculative-verify shape (at most
// kMaxGraphSeqTokens tokens a sequence, kMaxGraphBatch in all) run as CUDA graphs captured per
// padded-size bucket; everything else (longer prefill chunks, big mixed batches) runs eagerly, in
// chunks of at most max_chunk_ tokens. Only the backend's own files include this header; the rest
// of the program reaches it through make_cuda_backend (cuda_backend.h).
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
#include "backend/cuda/kernels/linear/lm_head_screen.h"
#include "backend/cuda/pass_meta_layout.h"
#include "backend/cuda/tp_slices.h"
#include "backend/cuda/step_timeline.h"
#include "model/make_model.h"
#include "model/weights.h"

namespace gptoss::cuda_impl {

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
inline int graph_bucket(int M) {
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
                      float* logprobs_out = nullptr, float* kept_logits = nullptr,
                      const LogitChanges& changes = {}, TopLogprobs* top_out = nullptr) override;
  // One GPU: the sampler masks and changes the rows itself (sample_rows' allowed and adds).
  bool applies_logit_changes() const override { return !tp_.active() && !host_rows_; }
  bool samples_top_logprobs() const override { return samples_logprobs() && !host_rows_; }
  // One GPU: the sampler leaves each drawn token's logprob; tensor-parallel ranks hold a vocab slice.
  bool samples_logprobs() const override { return !tp_.active(); }
  bool keeps_logits() const override { return !tp_.active() && !keeps_no_logits_; }
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
  // With screen_pass_ (a greedy pass of 1-8 rows, lm_head_screen_takes): the ids straight into
  // d_greedy_ through the int8 screen (lm_head_screen.h); d_logits_ then holds only the
  // recomputed tile pairs' rows.
  void lm_head(const int32_t* rows, int n_rows);
  LmHeadScreen screen_;  // built at load where the screen serves lm_head's decode copy
  // How a pass's ids come: kNone (lm_head in full, then argmax_rows or the sampler), kArgmax
  // (forward_greedy, launch_greedy: the screen, argmax_rows's rule), kSampler (forward_sample with
  // every row plain greedy: the screen, the sampler's greedy rule, no sampler launch).
  enum ScreenMode { kScreenNone = 0, kScreenArgmax = 1, kScreenSampler = 2 };
  ScreenMode screen_pass_ = kScreenNone;  // set while a screened pass is recorded
  bool screen_serves(int n_rows) const {  // (lm_head() would run the decode copy: the screen's recompute)
    return screen_.built() && lm_head_screen_enabled() && dense_decode_copies(n_rows) &&
           lm_head_screen_takes(lm_head_dec_, n_rows, invariant_);
  }
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
  // Logit row `logit_row` (an index into the batch's logit_rows), at device row `device_row` of
  // d_logits_, to its place in kept_logits_ when forward_sample keeps it; otherwise nothing.
  void copy_kept_row(size_t logit_row, int device_row);
  // Draws rows [0, n) of d_logits_ by per[i] on the device; ids land in d_greedy_ (and with
  // logprobs, the drawn tokens' logprobs in d_lp_).
  void sample_on_device(const std::vector<RowSampling>& per, int n, bool logprobs);
  // After sample_on_device: row `device_row`'s top list to logit row `logit_row`'s place in
  // top_out_ when it asked for one (queued; the caller synchronizes).
  void copy_top_row(size_t logit_row, int device_row, const RowSampling& how);

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
  bool pipe_copied_ = false;
  // Where run_batch copies forward_sample's kept rows (h_kept_, pinned, h_kept_rows_ rows; null
  // outside forward_sample), and each logit row's place there (-1: drawn).
  float* kept_logits_ = nullptr;
  float* h_kept_ = nullptr;
  size_t h_kept_rows_ = 0;
  bool keeps_no_logits_ = false;  // GPTOSS_SAMPLER_KEEPS_NO_LOGITS=1 (an A/B of mixed sampling)
  // GPTOSS_SAMPLER_HOST_ROWS=1: rows with penalties, logit_bias, a structured-output mask or top
  // logprobs kept for the host, as before the forty-second session (an A/B).
  bool host_rows_ = false;
  // forward_sample's logit changes (host, empty outside it; adds_n_ entries, masks_n_ masks), and
  // their device copies: the adds with the raw logits the sampler saves beside them, the masks
  // through pinned staging (h_allowed_, 25 KB a row at o200k). Grown as needed, never in a graph.
  LogitChanges changes_;
  TopLogprobs* top_out_ = nullptr;  // forward_sample's top lists (host; null outside it)
  DeviceBuffer d_top_;              // [kMaxLogitRows] the sampler's top lists
  size_t adds_n_ = 0, masks_n_ = 0;
  DeviceBuffer d_adds_, d_add_raw_, d_allowed_;
  uint64_t* h_allowed_ = nullptr;
  size_t h_allowed_words_ = 0;
  std::vector<int32_t> kept_at_;  // the pass left its ids to the slot (run_batch_impl's graph branch)

  // Captured decode passes by padded size (and tapped layers: graphs that store device taps).
  // (padded size, decode attention plan key, tapped layers)
  // (bucket, attention plan, device tap layers, ids through the lm_head screen: ScreenMode)
  using GraphKey = std::tuple<int, int, std::vector<int32_t>, int>;
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

}  // namespace gptoss::cuda_impl
