#include "backend/cuda/eagle3_head.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernels/eagle3/eagle3_kernels.h"
#include "backend/kv_layout.h"
#include "common/dtype.h"
#include "common/error.h"
#include "model/weights.h"

namespace gptoss::cuda {

namespace {

constexpr int kPageSize = 16;     // positions a page of the head's cache
constexpr int kCommitRows = 256;  // rows a commit runs at once (bounds the workspaces)
constexpr int kMaxDraft = 16;     // tokens a proposal chains (SpeculativeConfig's K range)
constexpr int kMaxSplits = 32;    // attention KV splits

class CudaEagle3Head final : public Eagle3Head {
 public:
  CudaEagle3Head(std::shared_ptr<const Eagle3Weights> w, const Eagle3HeadEnv& env);
  std::string where() const override { return "cuda"; }
  bool device_taps() const override { return true; }
  std::unique_ptr<Seq> new_seq() const override {
    auto s = std::make_unique<DevSeq>();
    s->stream = env_.stream;
    return s;
  }
  void commit(Seq& s, int32_t pos, int n, const int32_t* next_tokens, const Eagle3Taps& taps) override;
  std::vector<int32_t> propose(Seq& s, int k, std::vector<float>* logits) override;

 private:
  struct DevSeq final : Seq {
    // A commit's kernels may still write the cache when the sequence ends: let them finish.
    ~DevSeq() override {
      if (stream && kv.bytes()) cudaStreamSynchronize(stream);
    }
    cudaStream_t stream = nullptr;
    int32_t first_pos = 0;
    int32_t rows = 0;         // committed rows, positions first_pos .. first_pos + rows - 1
    bool has_last = false;    // `last` holds the last committed row's pre-norm output
    int cap_pages = 0;
    DeviceBuffer kv;          // [cap_pages][2][kPageSize][kv heads][head_dim] bf16
    DeviceBuffer last;        // [H] f32
  };

  // A matrix in the checkpoint layout (GEMV, and the GEMM for commits of many rows) and, when
  // its shape allows (gpt-oss-120b heads: o_proj, gate|up, lm_head), a copy in the fragment layout the tensor-core skinny kernels read for
  // 1-64 rows (the target's decode path; on an H200 they stream bf16 near 4.3 TB/s against
  // the GEMV's 3.2, docs/BENCHMARKS.md).
  struct Mat {
    WeightMat w, dec;
  };
  Mat make_mat(const std::vector<const TensorView*>& parts, int N, int K);
  void lin(const Mat& m, const bf16_t* A, int lda, int M, const Epilogue& e) const {
    const bool dec = m.dec.fmt != WeightMat::kBF16 && M <= kSkinnyMaxTokens;
    linear(dec ? m.dec : m.w, A, lda, M, e, env_.stream);
  }
  // out = (rmsnorm(x) * norm_w) . W^T for one row x (f32 [K]): the GEMV's fused norm, or the
  // norm into xn_ and the skinny kernel.
  void lin_norm(const Mat& m, const float* x, const float* norm_w, const Epilogue& e) const {
    if (m.dec.fmt != WeightMat::kBF16) {
      rmsnorm(x, norm_w, 1, m.w.K, c_.rms_eps, nullptr, xn_, env_.stream);
      linear(m.dec, xn_, m.w.K, 1, e, env_.stream);
    } else {
      linear_rmsnorm(m.w, x, norm_w, c_.rms_eps, 1, xn_, false, e, env_.stream);
    }
  }

  template <class T>
  T* dalloc(size_t count) {
    bufs_.emplace_back(std::max<size_t>(1, count) * sizeof(T));
    return bufs_.back().get<T>();
  }
  const bf16_t* upload_bf16(const std::vector<const TensorView*>& parts);
  const float* upload_floats(const TensorView& t);
  // Room in s.kv for positions up to last_pos (keeps the rows there).
  void ensure_pages(DevSeq& s, int32_t last_pos);
  // Rows at positions pos .. pos + n - 1 (d_tokens, d_pos, d_off: their token, position and
  // page-table offset on the device; d_h: their hidden input f32 [n, H]): K/V into s.kv; with
  // `full`, the last row through attention and the MLP, its pre-norm output to d_out [H].
  void run_rows(DevSeq& s, int32_t pos, int n, const int32_t* d_tokens, const int32_t* d_pos, const int32_t* d_off,
                const float* d_h, bool full, float* d_out);
  int32_t page_off(const DevSeq& s) const { return -(s.first_pos / kPageSize); }

  std::shared_ptr<const Eagle3Weights> w_;
  Eagle3Config c_;
  Eagle3HeadEnv env_;
  int H_, Q_, KV_, QKV_, I_, V_, tap_width_;
  size_t page_bytes_;
  int max_pages_;
  std::vector<DeviceBuffer> bufs_;
  bool skinny_ = true;  // GPTOSS_EAGLE3_DENSE=gemv: no fragment copies (comparisons)
  Mat fc_, qkv_w_, o_, gate_up_, down_, lm_head_;
  const bf16_t* embed_ = nullptr;
  const float *input_norm_, *hidden_norm_, *post_norm_, *norm_;
  const float* inv_freq_;
  float attn_scaling_ = 1.0f;
  const float* no_sinks_;
  const int32_t* d2t_;
  const int32_t* page_iota_;  // [max_pages_]: page table entry i = page i of the sequence's buffer
  // Workspaces (one call at a time, on env_.stream).
  bf16_t* taps_up_;  // [kCommitRows, tap_width] host taps uploaded
  float* h_;         // [kCommitRows, H]
  bf16_t* cat_;      // [kCommitRows, 2H]
  bf16_t* qkv_;      // [kCommitRows, QKV]
  bf16_t* attn_;     // [Q]
  float* resid_;     // [H]
  bf16_t* xn_;       // [H]
  float* gu_;        // [2I]
  bf16_t* act_;      // [I]
  float* chain_[2];  // [H] outputs of chained proposal rows
  float* logits_;    // [kMaxDraft, V]
  int32_t* arg_;     // [kMaxDraft]
  int32_t* drafts_;  // [kMaxDraft]
  int32_t* meta_;    // [3 * kCommitRows]: tokens, positions, page-table offsets
  float* partial_;
  std::vector<int32_t> h_meta_;
  std::vector<uint16_t> h_taps_;
};

const bf16_t* CudaEagle3Head::upload_bf16(const std::vector<const TensorView*>& parts) {
  size_t total = 0;
  for (const TensorView* t : parts) total += t->nbytes;
  auto* d = dalloc<uint8_t>(total);
  size_t at = 0;
  for (const TensorView* t : parts) {
    if (t->dtype != DType::BF16) throw Error("eagle3 (cuda): tensor " + t->name + " is not bf16");
    GPTOSS_CUDA_CHECK(cudaMemcpy(d + at, t->data, t->nbytes, cudaMemcpyHostToDevice));
    at += t->nbytes;
  }
  return reinterpret_cast<const bf16_t*>(d);
}

CudaEagle3Head::Mat CudaEagle3Head::make_mat(const std::vector<const TensorView*>& parts, int N, int K) {
  Mat m;
  m.w.fmt = WeightMat::kBF16;
  m.w.w = upload_bf16(parts);
  m.w.N = N;
  m.w.K = K;
  // K <= 4096: the skinny kernel stages 8 rows of activations in shared memory (8 x K bf16 a
  // block; down_proj's K = 17280 would not fit), and the target runs it up to o_proj's 4096.
  if (skinny_ && frag_packable(m.w) && K <= 4096)
    m.dec = pack_frag(m.w, 1, false, WeightMat::kFragBF16, dalloc<uint8_t>(frag_weight_bytes(WeightMat::kFragBF16, 1, N, K)),
                      nullptr, nullptr, env_.stream);
  return m;
}

const float* CudaEagle3Head::upload_floats(const TensorView& t) {
  std::vector<float> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = tensor_float_at(t, i);
  float* d = dalloc<float>(v.size());
  GPTOSS_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

CudaEagle3Head::CudaEagle3Head(std::shared_ptr<const Eagle3Weights> w, const Eagle3HeadEnv& env)
    : w_(std::move(w)), c_(w_->config), env_(env) {
  GPTOSS_CUDA_CHECK(cudaSetDevice(env_.device));
  H_ = c_.hidden;
  Q_ = c_.num_heads * c_.head_dim;
  KV_ = c_.num_kv_heads * c_.head_dim;
  QKV_ = Q_ + 2 * KV_;
  I_ = c_.intermediate;
  V_ = c_.draft_vocab;
  tap_width_ = 3 * c_.target_hidden;
  page_bytes_ = PagedKvLayout{kPageSize, c_.num_kv_heads, c_.head_dim}.page_elems() * sizeof(bf16_t);
  // Proposals run up to kMaxDraft positions past the model's context.
  max_pages_ = (env_.target.max_position_embeddings + kMaxDraft) / kPageSize + 2;

  if (const char* d = std::getenv("GPTOSS_EAGLE3_DENSE")) {
    if (std::string(d) == "gemv") skinny_ = false;
    else if (std::string(d) != "skinny") throw Error("GPTOSS_EAGLE3_DENSE=" + std::string(d) + ": expected skinny or gemv");
  }
  fc_ = make_mat({w_->fc}, H_, tap_width_);
  qkv_w_ = make_mat({w_->q, w_->k, w_->v}, QKV_, 2 * H_);  // rows q | k | v: the rope_kv_store layout
  o_ = make_mat({w_->o}, H_, Q_);
  gate_up_ = make_mat({w_->gate, w_->up}, 2 * I_, H_);  // gate rows, then up rows
  down_ = make_mat({w_->down}, H_, I_);
  lm_head_ = make_mat({w_->lm_head}, V_, H_);
  embed_ = w_->embed ? upload_bf16({w_->embed}) : env_.target_embed;
  input_norm_ = upload_floats(*w_->input_norm);
  hidden_norm_ = upload_floats(*w_->hidden_norm);
  post_norm_ = upload_floats(*w_->post_norm);
  norm_ = upload_floats(*w_->norm);

  YarnTables rope;
  if (c_.rope_yarn) {
    GptOssConfig r;
    r.head_dim = c_.head_dim;
    r.rope = c_.yarn;
    rope = compute_yarn(r);
  } else {  // as the host head computes them
    rope.attention_scaling = 1.0f;
    for (int i = 0; i < c_.head_dim / 2; ++i)
      rope.inv_freq.push_back(float(1.0 / std::pow(c_.rope_theta, double(2 * i) / c_.head_dim)));
  }
  attn_scaling_ = rope.attention_scaling;
  float* f = dalloc<float>(rope.inv_freq.size());
  GPTOSS_CUDA_CHECK(cudaMemcpy(f, rope.inv_freq.data(), rope.inv_freq.size() * 4, cudaMemcpyHostToDevice));
  inv_freq_ = f;
  std::vector<float> sinks(size_t(c_.num_heads), -INFINITY);
  f = dalloc<float>(sinks.size());
  GPTOSS_CUDA_CHECK(cudaMemcpy(f, sinks.data(), sinks.size() * 4, cudaMemcpyHostToDevice));
  no_sinks_ = f;
  int32_t* i32 = dalloc<int32_t>(size_t(V_));
  GPTOSS_CUDA_CHECK(cudaMemcpy(i32, w_->draft_to_target.data(), size_t(V_) * 4, cudaMemcpyHostToDevice));
  d2t_ = i32;
  std::vector<int32_t> iota(static_cast<size_t>(max_pages_));
  for (int i = 0; i < max_pages_; ++i) iota[size_t(i)] = i;
  i32 = dalloc<int32_t>(iota.size());
  GPTOSS_CUDA_CHECK(cudaMemcpy(i32, iota.data(), iota.size() * 4, cudaMemcpyHostToDevice));
  page_iota_ = i32;

  taps_up_ = dalloc<bf16_t>(size_t(kCommitRows) * tap_width_);
  h_ = dalloc<float>(size_t(kCommitRows) * H_);
  cat_ = dalloc<bf16_t>(size_t(kCommitRows) * 2 * H_);
  qkv_ = dalloc<bf16_t>(size_t(kCommitRows) * QKV_);
  attn_ = dalloc<bf16_t>(size_t(Q_));
  resid_ = dalloc<float>(size_t(H_));
  xn_ = dalloc<bf16_t>(size_t(H_));
  gu_ = dalloc<float>(2 * size_t(I_));
  act_ = dalloc<bf16_t>(size_t(I_));
  chain_[0] = dalloc<float>(size_t(H_));
  chain_[1] = dalloc<float>(size_t(H_));
  logits_ = dalloc<float>(size_t(kMaxDraft) * V_);
  arg_ = dalloc<int32_t>(kMaxDraft);
  drafts_ = dalloc<int32_t>(kMaxDraft);
  meta_ = dalloc<int32_t>(3 * kCommitRows);
  partial_ = dalloc<float>(attention_partial_floats(1, c_.num_heads, c_.head_dim, kMaxSplits));
  GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaEagle3Head::ensure_pages(DevSeq& s, int32_t last_pos) {
  const int need = last_pos / kPageSize + page_off(s) + 1;
  if (last_pos / kPageSize >= max_pages_)
    throw Error("eagle3 (cuda): position " + std::to_string(last_pos) + " is past the model's context");
  if (s.last.bytes() == 0) s.last.alloc(size_t(H_) * sizeof(float));
  if (need <= s.cap_pages) return;
  const int cap = std::max({need, 2 * s.cap_pages, 4});
  DeviceBuffer grown(size_t(cap) * page_bytes_);
  // The rows kept (a rewind or a proposal's scratch rows may lie past them: not needed).
  const int used = s.rows > 0 ? (s.first_pos + s.rows - 1) / kPageSize + page_off(s) + 1 : 0;
  if (used > 0)
    GPTOSS_CUDA_CHECK(cudaMemcpyAsync(grown.get(), s.kv.get(), size_t(std::min(used, s.cap_pages)) * page_bytes_,
                                      cudaMemcpyDeviceToDevice, env_.stream));
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(env_.stream));  // the old buffer may still be read
  s.kv = std::move(grown);
  s.cap_pages = cap;
}

void CudaEagle3Head::run_rows(DevSeq& s, int32_t pos, int n, const int32_t* d_tokens, const int32_t* d_pos, const int32_t* d_off,
                              const float* d_h, bool full, float* d_out) {
  cudaStream_t st = env_.stream;
  const int D = c_.head_dim, Hq = c_.num_heads, Hkv = c_.num_kv_heads;
  eagle3_input(embed_, d_tokens, d_h, input_norm_, hidden_norm_, n, H_, c_.rms_eps, c_.norm_before_residual, cat_,
               full ? resid_ : nullptr, st);
  lin(qkv_w_, cat_, 2 * H_, n, Epilogue{Epilogue::kStoreBF16, qkv_, QKV_});
  const KvLayer kv{s.kv.get(), false, kPageSize};
  rope_kv_store(qkv_, n, Hq, Hkv, D, inv_freq_, attn_scaling_, TokenMeta{d_pos, d_off, page_iota_}, kv, st);
  if (!full) return;
  // The last row attends to the head's rows first_pos .. its own position: a window of that
  // length (no sinks) keeps the attention off the pages before first_pos, which this
  // sequence's buffer does not have.
  const int window = pos + n - 1 - s.first_pos + 1;
  const int nsplit = std::clamp((window + 127) / 128, 1, kMaxSplits);
  attention(qkv_ + size_t(n - 1) * QKV_, 1, Hq, Hkv, D, window, no_sinks_,
            TokenMeta{d_pos + n - 1, d_off + n - 1, page_iota_}, kv, nsplit, partial_, attn_, st,
            AttentionPath::kPerToken);
  lin(o_, attn_, Q_, 1, Epilogue{Epilogue::kAddF32, resid_, H_});
  lin_norm(gate_up_, resid_, post_norm_, Epilogue{Epilogue::kStoreF32, gu_, 2 * I_});
  eagle3_silu_mul(gu_, I_, resid_, H_, act_, d_out, st);
  lin(down_, act_, I_, 1, Epilogue{Epilogue::kAddF32, d_out, H_});
}

void CudaEagle3Head::commit(Seq& seq, int32_t pos, int n, const int32_t* next_tokens, const Eagle3Taps& taps) {
  if (n <= 0) return;
  GPTOSS_CUDA_CHECK(cudaSetDevice(env_.device));
  DevSeq& s = static_cast<DevSeq&>(seq);
  if (pos < 0) throw Error("eagle3 (cuda): negative position");
  if (!s.has_last || pos < s.first_pos || pos > s.first_pos + s.rows) {  // (re)start the cache at pos
    s.first_pos = pos;
    s.rows = 0;
    s.has_last = false;
  }
  s.rows = pos - s.first_pos;  // rewinds past rows recomputed now, drops scratch rows
  ensure_pages(s, pos + n - 1);
  DeviceTaps dev;
  if (!taps.host) {
    dev = env_.taps ? env_.taps() : DeviceTaps{};
    if (!dev.rows || taps.batch_token < 0 || taps.batch_token + n > dev.tokens)
      throw Error("eagle3 (cuda): the last forward left no device taps for batch tokens " +
                  std::to_string(taps.batch_token) + " .. " + std::to_string(taps.batch_token + n - 1));
  }
  cudaStream_t st = env_.stream;
  for (int c0 = 0; c0 < n; c0 += kCommitRows) {
    const int cn = std::min(kCommitRows, n - c0);
    const bf16_t* A;
    if (taps.host) {
      // The host taps as the bf16 rows fc reads (round to nearest even, as the device store does).
      h_taps_.resize(size_t(cn) * tap_width_);
      const float* src = taps.host + size_t(c0) * tap_width_;
      for (size_t i = 0; i < h_taps_.size(); ++i) h_taps_[i] = f32_to_bf16(src[i]);
      GPTOSS_CUDA_CHECK(cudaMemcpyAsync(taps_up_, h_taps_.data(), h_taps_.size() * 2, cudaMemcpyHostToDevice, st));
      A = taps_up_;
    } else {
      A = dev.rows + size_t(taps.batch_token + c0) * tap_width_;
    }
    lin(fc_, A, tap_width_, cn, Epilogue{Epilogue::kStoreF32, h_, H_});
    h_meta_.resize(3 * size_t(cn));
    for (int i = 0; i < cn; ++i) {
      const int32_t t = next_tokens[c0 + i];
      if (t < 0 || t >= c_.vocab) throw Error("eagle3: token id " + std::to_string(t) + " outside the vocabulary");
      h_meta_[size_t(i)] = t;
      h_meta_[size_t(cn + i)] = pos + c0 + i;
      h_meta_[size_t(2 * cn + i)] = page_off(s);
    }
    GPTOSS_CUDA_CHECK(cudaMemcpyAsync(meta_, h_meta_.data(), h_meta_.size() * 4, cudaMemcpyHostToDevice, st));
    // Only the last row's output is used (one layer: it seeds the proposals).
    const bool last_chunk = c0 + cn == n;
    run_rows(s, pos + c0, cn, meta_, meta_ + cn, meta_ + 2 * cn, h_, last_chunk, s.last.get<float>());
  }
  s.rows += n;
  s.has_last = true;
}

std::vector<int32_t> CudaEagle3Head::propose(Seq& seq, int k, std::vector<float>* logits) {
  std::vector<int32_t> drafts;
  DevSeq& s = static_cast<DevSeq&>(seq);
  if (k <= 0 || !s.has_last) return drafts;
  if (k > kMaxDraft) throw Error("eagle3 (cuda): at most " + std::to_string(kMaxDraft) + " draft tokens a step");
  GPTOSS_CUDA_CHECK(cudaSetDevice(env_.device));
  cudaStream_t st = env_.stream;
  const int32_t next = s.first_pos + s.rows;  // position of the first chained (scratch) row
  if (k > 1) {
    ensure_pages(s, next + k - 2);
    h_meta_.resize(2 * size_t(k - 1));
    for (int j = 0; j < k - 1; ++j) {
      h_meta_[size_t(j)] = next + j;
      h_meta_[size_t(k - 1 + j)] = page_off(s);
    }
    GPTOSS_CUDA_CHECK(cudaMemcpyAsync(meta_, h_meta_.data(), h_meta_.size() * 4, cudaMemcpyHostToDevice, st));
  }
  const float* h = s.last.get<float>();
  for (int j = 0; j < k; ++j) {
    if (j > 0) {
      // The token just proposed (on the device) at the next position, with h for the taps.
      float* out = chain_[j % 2];
      run_rows(s, next + j - 1, 1, drafts_ + j - 1, meta_ + j - 1, meta_ + (k - 1) + j - 1, h, true, out);
      h = out;
    }
    float* lg = logits_ + size_t(j) * V_;
    lin_norm(lm_head_, h, norm_, Epilogue{Epilogue::kStoreF32, lg, V_});
    argmax_rows(lg, 1, V_, arg_ + j, st);
    eagle3_draft_to_target(arg_ + j, d2t_, V_, drafts_ + j, st);
  }
  drafts.resize(size_t(k));
  GPTOSS_CUDA_CHECK(cudaMemcpyAsync(drafts.data(), drafts_, size_t(k) * 4, cudaMemcpyDeviceToHost, st));
  if (logits) {
    const size_t at = logits->size();
    logits->resize(at + size_t(k) * V_);
    GPTOSS_CUDA_CHECK(
        cudaMemcpyAsync(logits->data() + at, logits_, size_t(k) * V_ * 4, cudaMemcpyDeviceToHost, st));
  }
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(st));
  return drafts;
}

}  // namespace

std::unique_ptr<Eagle3Head> make_cuda_eagle3_head(std::shared_ptr<const Eagle3Weights> w, const Eagle3HeadEnv& env,
                                                  std::string* why) {
  const Eagle3Config& c = w->config;
  const GptOssConfig& t = env.target;
  if (c.target_hidden != t.hidden)
    throw Error("eagle3: the head expects a target hidden size of " + std::to_string(c.target_hidden) +
                ", the model has " + std::to_string(t.hidden));
  if (c.vocab != t.vocab)
    throw Error("eagle3: the head's vocab_size " + std::to_string(c.vocab) + " differs from the model's " +
                std::to_string(t.vocab));
  if (!w->embed && c.hidden != t.hidden)
    throw Error("eagle3: the head shares the target's embedding, which is [" + std::to_string(t.vocab) + ", " +
                std::to_string(t.hidden) + "]; the head's hidden size is " + std::to_string(c.hidden));
  auto no = [&](const std::string& reason) -> std::unique_ptr<Eagle3Head> {
    if (why) *why = reason;
    return nullptr;
  };
  if (c.head_dim != 32 && c.head_dim != 64) return no("head_dim " + std::to_string(c.head_dim) + " (the attention kernels take 32 or 64)");
  if (c.num_heads % c.num_kv_heads || c.num_heads / c.num_kv_heads > 8)
    return no("more than 8 query heads per kv head");
  const int Q = c.num_heads * c.head_dim;
  for (int v : {c.hidden, Q, c.intermediate, 3 * c.target_hidden})
    if (v % 32) return no("a width (" + std::to_string(v) + ") that is not a multiple of 32");
  if (c.hidden > 16384) return no("hidden size above 16384");
  if (!w->embed && !env.target_embed) return no("no embedding on the device");
  return std::make_unique<CudaEagle3Head>(std::move(w), env);
}

}  // namespace gptoss::cuda
