// One pass over the model on the GPU: the pass's metadata uploaded, then every layer's kernels
// in order (run_pass: kernels.h's entry points, with the folds and launch choices made here),
// lm_head, and the staging of a batch's chunk into a pass (the class: cuda_backend_impl.h).
#include "backend/cuda/cuda_backend_impl.h"

#include <cstring>

namespace gptoss {
namespace cuda_impl {

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
    const Epilogue qe{Epilogue::kStoreBF16, qkv_, QKV};
    if (!skip("dense")) {
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
      // cuBLASLt's qkv lets no dependent launch start early: attention then asks for its row first.
      const bool qkv_overlaps = !linear_on_cublas(Wqkv, H, n, qe, inv, blas_.get());
      attention_decode(qkv_, n, c.num_heads, c.num_kv_heads, c.head_dim, L.sliding ? c.sliding_window : 0, L.sinks,
                       inv_freq_, yarn_.attention_scaling, tm, kv, L.sliding ? m.attn_sliding : m.attn_full, partial_,
                       attn_, stream_, m.attn_kv_stored, qkv_overlaps);
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

}  // namespace cuda_impl
}  // namespace gptoss
