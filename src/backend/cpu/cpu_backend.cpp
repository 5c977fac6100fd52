#include "backend/cpu/cpu_backend.h"
#include "backend/kv_layout.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "common/error.h"

namespace gptoss {

namespace {

std::vector<float> to_floats(const TensorView& t) {
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = tensor_float_at(t, i);
  return v;
}

const uint16_t* bf16_data(const TensorView& t) { return reinterpret_cast<const uint16_t*>(t.data); }

// The part [a0, a1) x [b0, b1) x [c0, c1) of a row-major [A][B][C] array: a pointer into `base`
// when that part is contiguous in it (no copy: a memory-mapped checkpoint stays shared), else a
// packed copy in `own`.
template <class T>
const T* slice3(const T* base, size_t B, size_t C, IndexRange a, IndexRange b, IndexRange c, std::vector<T>& own) {
  const bool full_c = c.begin == 0 && size_t(c.end) == C;
  if (full_c && ((b.begin == 0 && size_t(b.end) == B) || a.size() == 1))
    return base + (size_t(a.begin) * B + b.begin) * C;
  own.resize(size_t(a.size()) * b.size() * c.size());
  T* o = own.data();
  for (int i = a.begin; i < a.end; ++i)
    for (int j = b.begin; j < b.end; ++j) {
      std::memcpy(o, base + (size_t(i) * B + j) * C + c.begin, sizeof(T) * c.size());
      o += c.size();
    }
  return own.data();
}

std::vector<float> slice_floats(const std::vector<float>& v, size_t B, size_t C, IndexRange a, IndexRange b,
                                IndexRange c) {
  std::vector<float> own;
  const float* p = slice3(v.data(), B, C, a, b, c, own);
  if (p != own.data()) own.assign(p, p + size_t(a.size()) * b.size() * c.size());
  return own;
}

IndexRange all(int n) { return {0, n}; }

struct CpuLayer {
  std::vector<float> attn_norm, mlp_norm, q_b, k_b, v_b, o_b, sinks, router_b, gate_up_bias, down_bias;
  // This rank's matrices (the whole ones at world 1): views into the mapping or copies below.
  const uint16_t *q_w, *k_w, *v_w, *o_w;
  const uint8_t *gu_blocks, *gu_scales, *dn_blocks, *dn_scales;
  std::vector<uint16_t> o_own;
  std::vector<uint8_t> gu_blocks_own, gu_scales_own, dn_blocks_own, dn_scales_own;
  bool sliding;
  int group_index;  // index of this layer inside its KV group
};

// (value, vocabulary id) of a row's largest logit on one rank: what forward_greedy gathers.
struct RowMax {
  float value;
  int32_t id;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::shared_ptr<const ModelWeights> w, int threads, const TpShard& shard, Communicator* comm)
      : w_(std::move(w)), c_(w_->config), shard_(shard), comm_(comm) {
    if (threads > 0) omp_set_num_threads(threads);
    if (shard_.active()) {
      check_tp_shardable(c_, shard_.world, shard_.experts);
      if (!comm_ || comm_->world() != shard_.world || comm_->rank() != shard_.rank)
        throw Error("cpu backend: tensor-parallel rank " + std::to_string(shard_.rank) + " needs the communicator of its group");
    }
    yarn_ = compute_yarn(c_);
    final_norm_ = to_floats(*w_->final_norm);
    const int H = c_.hidden, D = c_.head_dim, E = c_.num_experts, I = c_.intermediate;
    qh_ = shard_.q_heads(c_);
    kvh_ = shard_.kv_heads(c_);
    inter_ = shard_.intermediate(c_);
    held_ = shard_.experts_held(c_);
    vocab_ = shard_.vocab(c_);
    const IndexRange qd{qh_.begin * D, qh_.end * D}, kd{kvh_.begin * D, kvh_.end * D};
    const IndexRange gu_rows{2 * inter_.begin, 2 * inter_.end};
    // Biases after a row-parallel matrix are added once: by rank 0 (o_proj; down when the
    // intermediate dimension is split), or by the rank holding the expert (expert-parallel).
    const bool o_bias = shard_.root();
    const bool down_bias = shard_.root() || shard_.experts == ExpertSharding::kExpertParallel;
    int idx[2] = {0, 0};
    for (int l = 0; l < c_.num_layers; ++l) {
      const LayerWeights& L = w_->layers[l];
      CpuLayer cl;
      cl.attn_norm = to_floats(*L.attn_norm);
      cl.mlp_norm = to_floats(*L.mlp_norm);
      cl.q_b = slice_floats(to_floats(*L.q_b), c_.q_dim(), 1, all(1), qd, all(1));
      cl.k_b = slice_floats(to_floats(*L.k_b), c_.kv_dim(), 1, all(1), kd, all(1));
      cl.v_b = slice_floats(to_floats(*L.v_b), c_.kv_dim(), 1, all(1), kd, all(1));
      if (o_bias) cl.o_b = to_floats(*L.o_b);
      cl.sinks = slice_floats(to_floats(*L.sinks), c_.num_heads, 1, all(1), qh_, all(1));
      cl.router_b = to_floats(*L.router_b);
      cl.gate_up_bias = slice_floats(to_floats(*L.gate_up_bias), 2 * I, 1, held_, gu_rows, all(1));
      if (down_bias) cl.down_bias = slice_floats(to_floats(*L.down_bias), H, 1, held_, all(H), all(1));
      std::vector<uint16_t> unused;
      cl.q_w = slice3(bf16_data(*L.q_w), c_.q_dim(), H, all(1), qd, all(H), unused);
      cl.k_w = slice3(bf16_data(*L.k_w), c_.kv_dim(), H, all(1), kd, all(H), unused);
      cl.v_w = slice3(bf16_data(*L.v_w), c_.kv_dim(), H, all(1), kd, all(H), unused);
      cl.o_w = slice3(bf16_data(*L.o_w), H, c_.q_dim(), all(1), all(H), qd, cl.o_own);
      cl.gu_blocks = slice3(L.gate_up_blocks->data, 2 * I, H / 2, held_, gu_rows, all(H / 2), cl.gu_blocks_own);
      cl.gu_scales = slice3(L.gate_up_scales->data, 2 * I, H / 32, held_, gu_rows, all(H / 32), cl.gu_scales_own);
      cl.dn_blocks = slice3(L.down_blocks->data, H, I / 2, held_, all(H), IndexRange{inter_.begin / 2, inter_.end / 2},
                            cl.dn_blocks_own);
      cl.dn_scales = slice3(L.down_scales->data, H, I / 32, held_, all(H),
                            IndexRange{inter_.begin / 32, inter_.end / 32}, cl.dn_scales_own);
      cl.sliding = c_.layer_sliding[l];
      cl.group_index = idx[cl.sliding ? kKvSliding : kKvFull]++;
      layers_.push_back(std::move(cl));
    }
    std::vector<uint16_t> unused;
    lm_head_ = slice3(bf16_data(*w_->lm_head), c_.vocab, H, all(1), vocab_, all(H), unused);
    (void)E;
  }

  std::string name() const override { return "cpu"; }
  bool supports_hidden_taps() const override { return true; }
  const GptOssConfig& config() const override { return c_; }
  const KvCacheConfig& kv_config() const override { return kv_; }

  void init_kv_cache(const KvCacheConfig& kv) override {
    if (kv.page_size <= 0) throw Error("KV cache page size must be positive");
    if (kv.dtype != DType::BF16 && kv.dtype != DType::F8_E4M3 && kv.dtype != DType::F32)
      throw Error("KV cache dtype must be bf16 or fp8");
    // The cache is f32 in host memory: refuse one larger than the machine's memory (a clear error
    // where the allocation would throw std::bad_alloc or the kernel would kill the process).
    size_t floats[2];
    double need = 0;
    for (int g = 0; g < 2; ++g) {
      int layers = g == kKvSliding ? c_.num_sliding_layers() : c_.num_full_layers();
      if (kv.num_pages[g] < 0) throw Error("KV cache page count must not be negative");
      floats[g] = size_t(layers) * size_t(kv.num_pages[g]) * 2 * size_t(kv.page_size) * size_t(kv_dim());
      need += double(floats[g]) * sizeof(float);
    }
    const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    if (have > 0 && need > have) {
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "the KV cache (%d + %d pages of %d positions, held as f32 on the CPU) needs %.1f GiB of memory; "
                    "this machine has %.1f GiB",
                    kv.num_pages[kKvFull], kv.num_pages[kKvSliding], kv.page_size, need / double(1ull << 30),
                    have / double(1ull << 30));
      throw Error(msg);
    }
    for (int g = 0; g < 2; ++g) {
      cache_[g].clear();
      cache_[g].shrink_to_fit();  // not the old cache and the new one at once
    }
    try {
      for (int g = 0; g < 2; ++g) cache_[g].assign(floats[g], 0.0f);
    } catch (const std::bad_alloc&) {
      throw Error("cannot allocate the KV cache (" + std::to_string(size_t(need / double(1 << 20))) + " MiB)");
    }
    kv_ = kv;
  }

  void forward(const ForwardBatch& b, float* logits) override {
    const int rows = int(b.logit_rows.size());
    std::vector<float> h = final_hidden(b);
    if (b.tokens.empty()) return;
    if (!shard_.active()) {
      cpu::linear_bf16(h.data(), rows, c_.hidden, lm_head_, c_.vocab, nullptr, logits);
      return;
    }
    // Vocab-parallel lm_head: each rank its rows, gathered padded to the largest slice.
    const int Vr = vocab_.size(), Vmax = split_range(c_.vocab, shard_.world, 0).size();
    std::vector<float> mine(size_t(rows) * Vmax), every(size_t(shard_.world) * rows * Vmax);
    if (rows) cpu::linear_bf16(h.data(), rows, c_.hidden, lm_head_, Vr, nullptr, mine.data());
    for (int r = rows - 1; r >= 0 && Vr != Vmax; --r)  // spread rows to the padded stride
      std::memmove(&mine[size_t(r) * Vmax], &mine[size_t(r) * Vr], sizeof(float) * Vr);
    comm_->all_gather(mine.data(), every.data(), mine.size() * sizeof(float));
    for (int k = 0; k < shard_.world; ++k) {
      const IndexRange v = split_range(c_.vocab, shard_.world, k);
      for (int r = 0; r < rows; ++r)
        std::memcpy(logits + size_t(r) * c_.vocab + v.begin, &every[(size_t(k) * rows + r) * Vmax],
                    sizeof(float) * v.size());
    }
  }

  // Tensor-parallel: each rank's best (value, id) per row, gathered, then the best of those
  // (ties to the lower id: the ranks hold ascending vocabulary slices); the full logits never
  // leave their ranks.
  void forward_greedy(const ForwardBatch& b, int32_t* tokens_out) override {
    if (!shard_.active()) return Backend::forward_greedy(b, tokens_out);
    const int rows = int(b.logit_rows.size());
    std::vector<float> h = final_hidden(b);
    if (b.tokens.empty()) return;
    const int Vr = vocab_.size();
    std::vector<float> mine(size_t(rows) * Vr);
    if (rows) cpu::linear_bf16(h.data(), rows, c_.hidden, lm_head_, Vr, nullptr, mine.data());
    std::vector<RowMax> best(rows), every(size_t(shard_.world) * rows);
    for (int r = 0; r < rows; ++r) {
      const float* row = &mine[size_t(r) * Vr];
      int k = 0;
      for (int i = 1; i < Vr; ++i)
        if (row[i] > row[k]) k = i;
      best[r] = {row[k], vocab_.begin + k};
    }
    comm_->all_gather(best.data(), every.data(), best.size() * sizeof(RowMax));
    for (int r = 0; r < rows; ++r) {
      RowMax m = every[r];
      for (int k = 1; k < shard_.world; ++k)
        if (every[size_t(k) * rows + r].value > m.value) m = every[size_t(k) * rows + r];
      tokens_out[r] = m.id;
    }
  }

 private:
  int kv_dim() const { return kvh_.size() * c_.head_dim; }

  // Runs the layers over the batch and returns the final-normed hidden rows of its logit rows
  // ([logit_rows, hidden]); nothing for an empty batch.
  std::vector<float> final_hidden(const ForwardBatch& b) {
    const int n = int(b.tokens.size());
    if (n == 0) return {};
    const int H = c_.hidden, V = c_.vocab;
    std::vector<int32_t> positions(n);
    for (auto& s : b.seqs) {
      if (s.first_token < 0 || s.n_tokens < 0 || s.first_token + s.n_tokens > n)
        throw Error("forward: sequence token range outside the batch");
      for (int i = 0; i < s.n_tokens; ++i) positions[s.first_token + i] = s.start_pos + i;
    }
    for (int32_t t : b.tokens)
      if (t < 0 || t >= V) throw Error("forward: token id " + std::to_string(t) + " outside the vocabulary");
    const int rows = int(b.logit_rows.size());
    for (int r = 0; r < rows; ++r)
      if (b.logit_rows[r] < 0 || b.logit_rows[r] >= n) throw Error("forward: logit row outside the batch");

    std::vector<float> x(size_t(n) * H);
    for (int i = 0; i < n; ++i) {
      const uint16_t* e = bf16_data(*w_->embed) + size_t(b.tokens[i]) * H;
      for (int j = 0; j < H; ++j) x[size_t(i) * H + j] = bf16_to_f32(e[j]);
    }
    for (int32_t l : b.tap_layers)
      if (l < 0 || l >= c_.num_layers) throw Error("forward: tapped layer " + std::to_string(l) + " does not exist");
    if (!b.tap_layers.empty() && !b.tap_out) throw Error("forward: hidden-state taps asked without an output buffer");
    for (int l = 0; l < c_.num_layers; ++l) {
      attention_block(l, b, positions, x);
      moe_block(l, n, x);
      tap(b, l, x);
    }
    std::vector<float> xr(size_t(rows) * H), h(size_t(rows) * H);
    for (int r = 0; r < rows; ++r) std::copy_n(&x[size_t(b.logit_rows[r]) * H], H, &xr[size_t(r) * H]);
    cpu::rmsnorm(xr.data(), final_norm_.data(), rows, H, c_.rms_eps, h.data());
    return h;
  }

 private:
  // Copies the residual stream after layer l into every tap slot that names it.
  void tap(const ForwardBatch& b, int l, const std::vector<float>& x) {
    const int n = int(b.tokens.size()), H = c_.hidden, slots = int(b.tap_layers.size());
    for (int i = 0; i < slots; ++i)
      if (b.tap_layers[i] == l)
        for (int t = 0; t < n; ++t) std::copy_n(&x[size_t(t) * H], H, b.tap_out + (size_t(t) * slots + i) * H);
  }

  // Storage of one K or V row (this rank's kv heads) of layer l at `pos` of a sequence.
  float* kv_row(const CpuLayer& L, const SeqBatchInfo& s, int pos, int which) {
    const int g = L.sliding ? kKvSliding : kKvFull;
    const int pi = pos / kv_.page_size;
    if (pi >= s.n_pages[g] || s.pages[g][pi] < 0 || s.pages[g][pi] >= kv_.num_pages[g])
      throw Error("forward: no KV page for position " + std::to_string(pos));
    const PagedKvLayout lay{kv_.page_size, kvh_.size(), c_.head_dim};
    const size_t off = lay.layer_offset(L.group_index, kv_.num_pages[g]) +
                       lay.offset(s.pages[g][pi], which, pos % kv_.page_size, 0, 0);
    return &cache_[g][off];
  }

  void store(float* dst, const float* src) {
    const int d = kv_dim();
    if (kv_.dtype == DType::F8_E4M3)
      for (int i = 0; i < d; ++i) dst[i] = fp8_e4m3_to_f32(f32_to_fp8_e4m3(src[i]));
    else
      std::copy_n(src, d, dst);  // the reference keeps K/V exact
  }

  // x += update, where update is this rank's partial sum: summed over the group first.
  void add_residual(std::vector<float>& x, std::vector<float>& update) {
    if (shard_.active()) comm_->all_reduce_sum(update.data(), update.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] += update[i];
  }

  void attention_block(int l, const ForwardBatch& b, const std::vector<int32_t>& positions, std::vector<float>& x) {
    const CpuLayer& L = layers_[l];
    const int Hq = qh_.size(), Hkv = kvh_.size(), D = c_.head_dim;
    const int n = int(b.tokens.size()), H = c_.hidden, Q = Hq * D, K = Hkv * D;
    std::vector<float> h(size_t(n) * H), q(size_t(n) * Q), k(size_t(n) * K), v(size_t(n) * K), a(size_t(n) * Q),
        o(size_t(n) * H);
    cpu::rmsnorm(x.data(), L.attn_norm.data(), n, H, c_.rms_eps, h.data());
    cpu::linear_bf16(h.data(), n, H, L.q_w, Q, L.q_b.data(), q.data());
    cpu::linear_bf16(h.data(), n, H, L.k_w, K, L.k_b.data(), k.data());
    cpu::linear_bf16(h.data(), n, H, L.v_w, K, L.v_b.data(), v.data());
    cpu::rope(q.data(), n, Hq, D, positions.data(), yarn_);
    cpu::rope(k.data(), n, Hkv, D, positions.data(), yarn_);
    const int window = L.sliding ? c_.sliding_window : 0;
    std::vector<float> ks, vs;
    for (auto& s : b.seqs) {
      for (int i = 0; i < s.n_tokens; ++i) {
        int t = s.first_token + i;
        store(kv_row(L, s, positions[t], 0), &k[size_t(t) * K]);
        store(kv_row(L, s, positions[t], 1), &v[size_t(t) * K]);
      }
      if (s.n_tokens == 0) continue;
      // Gather the keys any of this sequence's queries can see into contiguous rows.
      const int end = s.start_pos + s.n_tokens;
      const int first = window > 0 ? std::max(0, s.start_pos - window + 1) : 0;
      ks.resize(size_t(end - first) * K);
      vs.resize(size_t(end - first) * K);
      for (int p = first; p < end; ++p) {
        std::copy_n(kv_row(L, s, p, 0), K, &ks[size_t(p - first) * K]);
        std::copy_n(kv_row(L, s, p, 1), K, &vs[size_t(p - first) * K]);
      }
      cpu::attention(&q[size_t(s.first_token) * Q], s.n_tokens, s.start_pos, ks.data(), vs.data(), first,
                     end - first, Hq, Hkv, D, window, L.sinks.data(), &a[size_t(s.first_token) * Q]);
    }
    cpu::linear_bf16(a.data(), n, Q, L.o_w, H, L.o_b.empty() ? nullptr : L.o_b.data(), o.data());
    add_residual(x, o);
  }

  void moe_block(int l, int n, std::vector<float>& x) {
    const LayerWeights& W = w_->layers[l];
    const CpuLayer& L = layers_[l];
    const int H = c_.hidden, E = c_.num_experts, k = c_.experts_per_token, I = inter_.size();
    std::vector<float> h(size_t(n) * H), rl(size_t(n) * E), rw(size_t(n) * k);
    std::vector<int32_t> ri(size_t(n) * k);
    cpu::rmsnorm(x.data(), L.mlp_norm.data(), n, H, c_.rms_eps, h.data());
    cpu::linear_bf16(h.data(), n, H, bf16_data(*W.router_w), E, L.router_b.data(), rl.data());
    cpu::router_topk(rl.data(), n, E, k, ri.data(), rw.data());

    // Group (token, slot) pairs by expert so each expert's weights are decoded once per step
    // (only the experts this rank holds).
    std::vector<std::vector<int>> by_expert(E);
    for (int i = 0; i < n * k; ++i)
      if (held_.contains(ri[i])) by_expert[ri[i]].push_back(i);
    std::vector<float> y(size_t(n) * k * H);  // per (token, slot) expert output
    std::vector<float> xs, gu, act, out;
    const size_t gu_blocks = size_t(2) * I * H / 2, gu_scales = size_t(2) * I * H / 32;
    const size_t dn_blocks = size_t(H) * I / 2, dn_scales = size_t(H) * I / 32;
    for (int e = held_.begin; e < held_.end; ++e) {
      const auto& rows = by_expert[e];
      const int m = int(rows.size()), le = e - held_.begin;
      if (!m) continue;
      xs.resize(size_t(m) * H);
      for (int r = 0; r < m; ++r) std::copy_n(&h[size_t(rows[r] / k) * H], H, &xs[size_t(r) * H]);
      gu.resize(size_t(m) * 2 * I);
      act.resize(size_t(m) * I);
      out.resize(size_t(m) * H);
      cpu::linear_mxfp4(xs.data(), m, H, L.gu_blocks + le * gu_blocks, L.gu_scales + le * gu_scales, 2 * I,
                        &L.gate_up_bias[size_t(le) * 2 * I], gu.data());
      cpu::swiglu(gu.data(), m, I, c_.swiglu_limit, act.data());
      cpu::linear_mxfp4(act.data(), m, I, L.dn_blocks + le * dn_blocks, L.dn_scales + le * dn_scales, H,
                        L.down_bias.empty() ? nullptr : &L.down_bias[size_t(le) * H], out.data());
      for (int r = 0; r < m; ++r) std::copy_n(&out[size_t(r) * H], H, &y[size_t(rows[r]) * H]);
    }
    // World 1 adds straight into the residual stream (the reference's order); a rank adds its
    // partial update, summed over the group before it joins the stream.
    std::vector<float> update;
    if (shard_.active()) update.assign(x.size(), 0.0f);
    std::vector<float>& acc = shard_.active() ? update : x;
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < k; ++j) {
        if (!held_.contains(ri[t * k + j])) continue;
        const float w = rw[t * k + j];
        const float* yr = &y[(size_t(t) * k + j) * H];
        for (int d = 0; d < H; ++d) acc[size_t(t) * H + d] += w * yr[d];
      }
    if (shard_.active()) add_residual(x, update);
  }

  std::shared_ptr<const ModelWeights> w_;
  const GptOssConfig& c_;
  TpShard shard_;
  Communicator* comm_;
  IndexRange qh_, kvh_, inter_, held_, vocab_;
  YarnTables yarn_;
  std::vector<float> final_norm_;
  std::vector<CpuLayer> layers_;
  const uint16_t* lm_head_ = nullptr;
  KvCacheConfig kv_;
  std::vector<float> cache_[2];
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights, int threads) {
  return std::make_unique<CpuBackend>(std::move(weights), threads, TpShard{}, nullptr);
}

std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights, int threads,
                                          const TpShard& shard, Communicator* comm) {
  return std::make_unique<CpuBackend>(std::move(weights), threads, shard, comm);
}

}  // namespace gptoss
