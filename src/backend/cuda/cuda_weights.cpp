// The CUDA backend's weights: checkpoint tensors uploaded (MXFP4 experts kept packed), random
// weights built on the GPU, tensor-parallel shards, and the repacks into the tensor-core fragment
// layout the decode kernels read (the experts, and the dense layers' decode copies).
#include "backend/cuda/cuda_backend_impl.h"

namespace gptoss::cuda_impl {

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
  // Greedy steps of 1-8 rows then read lm_head through its int8 screen (lm_head_screen.h): one
  // GPU only (a tensor-parallel rank's slice takes the vocab-parallel argmax).
  // (A bf16 decode copy means lm_head_ is row-major bf16, what build() reads.)
  if (lm_head_screen_enabled() && !tp_.active() && lm_head_screen_takes(lm_head_dec_, 1, invariant_)) {
    screen_.build(lm_head_, stream_);
    std::fprintf(stderr, "gptoss: greedy steps screen lm_head through an int8 copy (%.0f MB; GPTOSS_LM_HEAD_SCREEN=0: off)\n",
                 screen_.bytes() / 1e6);
  }
  int flag = 0;
  GPTOSS_CUDA_CHECK(cudaMemcpyAsync(&flag, d_flag_, 4, cudaMemcpyDeviceToHost, stream_));
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (flag) throw Error("MXFP4 scales above 2^113 (e8m0 byte > 240) are not supported by --mxfp4-backend mma; use gemv");
}

}  // namespace gptoss::cuda_impl
