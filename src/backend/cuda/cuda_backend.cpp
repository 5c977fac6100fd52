// The CUDA backend: construction, the workspaces, the KV pools, and the forward pass that
// composes the kernels of kernels.h (the class: cuda_backend_impl.h; its weights: cuda_weights.cpp).
#include "backend/cuda/cuda_backend_impl.h"

#include <cstring>

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
  if (screen_pass_ != kScreenNone) {
    screen_.argmax(lm_head_dec_, xn_, cfg_.hidden, n_rows, d_logits_, cfg_.vocab, d_greedy_, invariant_, stream_,
                   screen_pass_ == kScreenSampler);
    return;
  }
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
  // Rows with logit changes: the whole list goes up (rows index it); the sampler saves each
  // changed logit's raw value beside it, for the drawn token's logprob. Masks likewise.
  const LogitAdd* dadds = nullptr;
  float* draw = nullptr;
  const uint64_t* dallowed = nullptr;
  if (changes_.adds && adds_n_ > 0) {
    if (d_adds_.bytes() < adds_n_ * sizeof(LogitAdd)) {
      const size_t cap = std::max<size_t>(adds_n_, 2 * d_adds_.bytes() / sizeof(LogitAdd));
      d_adds_.alloc(cap * sizeof(LogitAdd));
      d_add_raw_.alloc(cap * sizeof(float));
    }
    GPTOSS_CUDA_CHECK(
        cudaMemcpyAsync(d_adds_.get(), changes_.adds, adds_n_ * sizeof(LogitAdd), cudaMemcpyHostToDevice, stream_));
    dadds = d_adds_.get<LogitAdd>();
    draw = d_add_raw_.get<float>();
  }
  if (changes_.allowed && masks_n_ > 0) {  // staged in h_allowed_ by forward_sample
    const size_t words = masks_n_ * allowed_words(cfg_.vocab);
    if (d_allowed_.bytes() < words * sizeof(uint64_t)) d_allowed_.alloc(words * sizeof(uint64_t));
    GPTOSS_CUDA_CHECK(
        cudaMemcpyAsync(d_allowed_.get(), h_allowed_, words * sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
    dallowed = d_allowed_.get<uint64_t>();
  }
  TopLogprobs* dtop = nullptr;
  if (top_out_ && logprobs) {
    if (d_top_.bytes() == 0) d_top_.alloc(size_t(kMaxLogitRows) * sizeof(TopLogprobs));
    dtop = d_top_.get<TopLogprobs>();
  }
  sample_rows(d_logits_, n, cfg_.vocab, d_how_, d_greedy_, stream_, logprobs ? d_lp_ : nullptr, dadds, draw,
              dallowed, dtop);
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
    // Greedy passes that want no logits of 1-8 rows take the int8 screen of lm_head: the same ids
    // as the full lm_head and argmax_rows (forward_greedy, launch_greedy) or the sampler
    // (forward_sample with every row plain greedy: temperature 0, nothing kept, changed, masked or
    // listed, no logprobs), half the bytes.
    ScreenMode screen_mode = kScreenNone;
    if (greedy && !taps && !tp_.active() && screen_serves(B)) {
      const bool plain_greedy =
          how && !logprobs && std::all_of(how, how + b.logit_rows.size(), [](const RowSampling& s) {
            return s.temperature < 1e-5f && !s.keep_logits && s.adds_count == 0 && s.allowed_row < 0 &&
                   s.top_logprobs == 0;
          });
      screen_mode = !how ? kScreenArgmax : plain_greedy ? kScreenSampler : kScreenNone;
    }
    const bool screened = screen_mode != kScreenNone;
    const GraphKey key{B, attn_key, taps_dev ? b.tap_layers : std::vector<int32_t>{}, screen_mode};
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
      {
        screen_pass_ = screen_mode;
        struct Reset {
          ScreenMode& f;
          ~Reset() { f = kScreenNone; }
        } reset{screen_pass_};
        run_pass(B, pm, B, splits_for(B));
      }
      tap_layers_ = nullptr;
      if (!tp_.active() && !screened) argmax_rows(d_logits_, B, V, d_greedy_, stream_);
      GPTOSS_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      cudaGraphExec_t exec;
      GPTOSS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      cudaGraphDestroy(graph);
      it = graphs_.emplace(key, exec).first;
    }
    GPTOSS_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    if (screened) note_lm_head_screen_pass();
    if (taps_dev) last_taps_ = DeviceTaps{graph_taps_, M};
    // Tensor-parallel: the graph ends at each rank's vocab slice; greedy exchanges row maxima,
    // logits and sampling gather the rows (queued while the graph runs).
    if (tp_pairs) tp_greedy(B, how != nullptr);
    else if (tp_.active()) tp_gather_logits(B);
    if (how && !tp_pairs && !screened) {
      std::vector<RowSampling> per(B);  // padding rows draw too, harmlessly
      for (size_t i = 0; i < b.logit_rows.size(); ++i) per[row_of[b.logit_rows[i]]] = how[i];
      sample_on_device(per, B, logprobs != nullptr);
      std::vector<int32_t> ids(B);
      std::vector<float> lps(logprobs ? B : 0);
      GPTOSS_CUDA_CHECK(cudaMemcpyAsync(ids.data(), d_greedy_, B * 4, cudaMemcpyDeviceToHost, stream_));
      if (logprobs) GPTOSS_CUDA_CHECK(cudaMemcpyAsync(lps.data(), d_lp_, B * 4, cudaMemcpyDeviceToHost, stream_));
      for (size_t i = 0; i < b.logit_rows.size(); ++i) {
        copy_kept_row(i, row_of[b.logit_rows[i]]);
        copy_top_row(i, row_of[b.logit_rows[i]], how[i]);
      }
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
          for (int i = 0; i < cnt; ++i) {
            copy_kept_row(size_t(outs[done + i]), i);
            copy_top_row(size_t(outs[done + i]), i, how[outs[done + i]]);
          }
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
                                 float* logprobs_out, float* kept_logits, const LogitChanges& changes,
                                 TopLogprobs* top_out) {
  if (logprobs_out && !samples_logprobs())
    throw Error("cuda backend: a tensor-parallel rank gives no logprobs from forward_sample");
  kept_at_.assign(batch.logit_rows.size(), -1);
  int32_t kept = 0;
  size_t n_adds = 0, n_masks = 0;
  for (size_t i = 0; i < batch.logit_rows.size(); ++i) {
    if (rows[i].keep_logits) kept_at_[i] = kept++;
    if (rows[i].keep_logits) continue;
    if (rows[i].adds_count > 0) {
      if (!changes.adds || tp_.active() || rows[i].adds_begin < 0)
        throw Error("cuda backend: logit adds need their list (and one GPU)");
      n_adds = std::max(n_adds, size_t(rows[i].adds_begin) + size_t(rows[i].adds_count));
      // The entries must be in the vocabulary (the sampler writes their logits) and distinct (one
      // thread a token): the order logit_adds gives them.
      const LogitAdd* a = changes.adds + rows[i].adds_begin;
      for (int32_t k = 0; k < rows[i].adds_count; ++k)
        if (a[k].token < 0 || a[k].token >= cfg_.vocab || (k > 0 && a[k - 1].token >= a[k].token))
          throw Error("cuda backend: a row's logit adds must be distinct vocabulary ids in increasing order");
    }
    if (rows[i].allowed_row >= 0) {
      if (!changes.allowed || tp_.active()) throw Error("cuda backend: a masked row needs its masks (and one GPU)");
      n_masks = std::max(n_masks, size_t(rows[i].allowed_row) + 1);
    }
  }
  if (kept > 0 && (!kept_logits || !keeps_logits()))
    throw Error("cuda backend: keep_logits rows need kept_logits (and one GPU)");
  // Kept rows come through pinned staging (a copy to pageable memory is staged by the driver in
  // chunks, each waited for), then one host copy to the caller's buffer.
  const size_t V = size_t(cfg_.vocab);
  if (size_t(kept) > h_kept_rows_) {
    if (h_kept_) GPTOSS_CUDA_CHECK(cudaFreeHost(h_kept_));
    h_kept_ = nullptr;
    h_kept_rows_ = std::max<size_t>(size_t(kept), 2 * h_kept_rows_);
    GPTOSS_CUDA_CHECK(cudaMallocHost(&h_kept_, h_kept_rows_ * V * sizeof(float)));
  }
  kept_logits_ = kept > 0 ? h_kept_ : nullptr;
  // The masks to pinned memory now, before the pass is queued (every earlier copy from it has
  // finished: each pass ends with the stream synchronized), so the sampler's upload is one
  // asynchronous copy after the pass.
  if (n_masks > 0) {
    const size_t words = n_masks * allowed_words(cfg_.vocab);
    if (words > h_allowed_words_) {
      if (h_allowed_) GPTOSS_CUDA_CHECK(cudaFreeHost(h_allowed_));
      h_allowed_ = nullptr;
      h_allowed_words_ = std::max(words, 2 * h_allowed_words_);
      GPTOSS_CUDA_CHECK(cudaMallocHost(&h_allowed_, h_allowed_words_ * sizeof(uint64_t)));
    }
    std::memcpy(h_allowed_, changes.allowed, words * sizeof(uint64_t));
  }
  changes_ = changes;
  adds_n_ = n_adds;
  masks_n_ = n_masks;
  top_out_ = logprobs_out ? top_out : nullptr;
  try {
    run_batch(batch, nullptr, tokens_out, rows, logprobs_out);
  } catch (...) {
    kept_logits_ = nullptr;
    changes_ = {};
    top_out_ = nullptr;
    throw;
  }
  kept_logits_ = nullptr;
  changes_ = {};
  top_out_ = nullptr;
  if (kept > 0) std::memcpy(kept_logits, h_kept_, size_t(kept) * V * sizeof(float));
}

void CudaBackend::copy_top_row(size_t logit_row, int device_row, const RowSampling& how) {
  if (!top_out_ || how.top_logprobs <= 0 || how.keep_logits || d_top_.bytes() == 0) return;
  GPTOSS_CUDA_CHECK(cudaMemcpyAsync(top_out_ + logit_row, d_top_.get<TopLogprobs>() + device_row, sizeof(TopLogprobs),
                                    cudaMemcpyDeviceToHost, stream_));
}

void CudaBackend::copy_kept_row(size_t logit_row, int device_row) {
  // Queued before the caller's synchronize; the sampler left this row's logits untouched.
  if (!kept_logits_ || logit_row >= kept_at_.size() || kept_at_[logit_row] < 0) return;
  const size_t V = size_t(cfg_.vocab);
  GPTOSS_CUDA_CHECK(cudaMemcpyAsync(kept_logits_ + size_t(kept_at_[logit_row]) * V, d_logits_ + size_t(device_row) * V,
                                    V * sizeof(float), cudaMemcpyDeviceToHost, stream_));
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
