// The CUDA backend: construction, the workspaces and the KV pools (the class: cuda_backend_impl.h;
// its weights: cuda_weights.cpp; one pass over the model: cuda_forward_pass.cpp; a batch's passes,
// graphs and sampling: cuda_batches.cpp).
#include "backend/cuda/cuda_backend_impl.h"

namespace gptoss {
namespace cuda_impl {

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
  // A/B of mixed sampling: =1 keeps no rows' logits, so a step with one host row draws all on the host.
  if (const char* nk = std::getenv("GPTOSS_SAMPLER_KEEPS_NO_LOGITS")) keeps_no_logits_ = std::string(nk) != "0";
  if (const char* hr = std::getenv("GPTOSS_SAMPLER_HOST_ROWS")) host_rows_ = std::string(hr) != "0";
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
  if (h_kept_) cudaFreeHost(h_kept_);
  if (h_allowed_) cudaFreeHost(h_allowed_);
  if (stream_) cudaStreamDestroy(stream_);
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

}  // namespace cuda_impl

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
  return std::make_unique<cuda_impl::CudaBackend>(opts);
}

}  // namespace gptoss
