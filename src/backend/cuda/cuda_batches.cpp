// A batch's passes on the GPU: chunks of the batch run as eager passes or replayed CUDA graphs,
// the pipelined greedy steps (launch_greedy / finish_greedy), the device sampler's rows and the
// logits kept for the host (the class: cuda_backend_impl.h; one pass: cuda_forward_pass.cpp).
#include "backend/cuda/cuda_backend_impl.h"

#include <cstring>

namespace gptoss {
namespace cuda_impl {

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

}  // namespace cuda_impl
}  // namespace gptoss
