#include "engine/engine.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"

namespace gptoss {

namespace {
// At most this many prompt-logprob rows per step (each is a [vocab] float row on the host).
constexpr int32_t kMaxPromptLogprobRows = 128;
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    default: return "";
  }
}

std::optional<EngineEvent> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, timeout, [&] { return !q_.empty(); })) return std::nullopt;
  EngineEvent ev = std::move(q_.front());
  q_.pop_front();
  return ev;
}

void RequestStream::cancel() {
  if (cancelled_.exchange(true)) return;
  sig_->notify();
}

void RequestStream::push(EngineEvent ev) {
  if (ev.finished) finished_ = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    q_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

Engine::Engine(Backend& backend, EngineConfig cfg) : backend_(backend), cfg_(std::move(cfg)) {
  const GptOssConfig& mc = backend_.config();
  vocab_ = mc.vocab;
  if (cfg_.max_num_seqs < 1) throw Error("max_num_seqs must be at least 1");
  if (cfg_.max_num_batched_tokens < 1) throw Error("max_num_batched_tokens must be at least 1");
  int mml = cfg_.max_model_len > 0 ? cfg_.max_model_len : mc.max_position_embeddings;
  if (mml < 2) throw Error("max_model_len must be at least 2");
  KvCacheConfig kvc = backend_.kv_config();
  kvc.page_size = cfg_.page_size;
  int64_t tokens = cfg_.kv_cache_tokens;
  size_t bytes = cfg_.kv_cache_bytes > 0 ? cfg_.kv_cache_bytes : backend_.kv_memory_available();
  if (tokens <= 0 && bytes == 0) {
    // No device limit (the CPU backend): enough for max_num_seqs full contexts, at most 256K
    // positions and about 1 GiB of f32 full-attention cache.
    tokens = std::min<int64_t>(int64_t(cfg_.max_num_seqs) * mml, int64_t(1) << 18);
    size_t page_f32 = kv_page_bytes(mc, kKvFull, cfg_.page_size, DType::F32);
    if (page_f32 > 0)
      tokens = std::min<int64_t>(tokens, std::max<int64_t>(1, int64_t((size_t(1) << 30) / page_f32)) * cfg_.page_size);
  }
  KvManagerConfig kc = plan_kv_pages(mc, kvc.dtype, cfg_.page_size, tokens, bytes, cfg_.max_num_seqs,
                                     cfg_.max_num_batched_tokens);
  // A sequence must fit the pool alone.
  int64_t pool_tokens = int64_t(kc.num_pages[kKvFull]) * cfg_.page_size;
  if (mml > pool_tokens) {
    std::fprintf(stderr, "engine: max_model_len %d exceeds the KV cache (%lld positions); using %lld\n", mml,
                 (long long)pool_tokens, (long long)pool_tokens);
    mml = int(pool_tokens);
  }
  if (kc.has_sliding) {
    // The sliding pool must hold one sequence's window plus a full chunk.
    int need = (mc.sliding_window - 1 + cfg_.page_size - 1) / cfg_.page_size + 2 +
               (cfg_.max_num_batched_tokens + cfg_.page_size - 1) / cfg_.page_size;
    kc.num_pages[kKvSliding] = std::max(kc.num_pages[kKvSliding], std::min(need, kc.num_pages[kKvFull] + 1));
  }
  max_model_len_ = mml;
  kvc.num_pages[kKvFull] = kc.num_pages[kKvFull];
  kvc.num_pages[kKvSliding] = kc.num_pages[kKvSliding];
  backend_.init_kv_cache(kvc);
  kv_ = std::make_unique<KvManager>(kc);
  publish_stats();
}

Engine::~Engine() { stop(); }

void Engine::start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  stop_ = true;
  sig_->notify();
  if (thread_.joinable()) thread_.join();
  // Abort whatever is left.
  drain_incoming();
  auto abort_seq = [&](Sequence& s) {
    EngineEvent ev;
    finish(s, ev, FinishReason::kAbort);
  };
  for (auto& s : running_) abort_seq(*s);
  for (auto& s : waiting_) abort_seq(*s);
  running_.clear();
  waiting_.clear();
  publish_stats();
}

std::shared_ptr<RequestStream> Engine::submit(std::vector<int32_t> prompt, const SamplingParams& sp) {
  if (prompt.empty()) throw Error("the prompt is empty");
  if (int(prompt.size()) >= max_model_len_)
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens; the maximum context length is " +
                std::to_string(max_model_len_) + " tokens");
  for (int32_t t : prompt)
    if (t < 0 || t >= vocab_) throw Error("token id " + std::to_string(t) + " is outside the vocabulary");
  if (sp.max_tokens < 1) throw Error("max_tokens must be at least 1");
  for (auto [t, bias] : sp.logit_bias)
    if (t < 0 || t >= vocab_) throw Error("logit_bias: token id " + std::to_string(t) + " is outside the vocabulary");
  if (stop_) throw Error("the engine is stopped");
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->stream = std::make_shared<RequestStream>(s->id, sig_);
  s->prompt_len = int(prompt.size());
  s->tokens = std::move(prompt);
  s->sp = sp;
  uint64_t seed;
  if (sp.seed) {
    seed = *sp.seed;
  } else {
    std::lock_guard<std::mutex> l(seed_mu_);
    seed = seed_rng_();
  }
  s->rng.seed(seed);
  s->arrival = Clock::now();
  auto stream = s->stream;
  ++active_;
  {
    std::lock_guard<std::mutex> l(in_mu_);
    incoming_.push_back(std::move(s));
  }
  sig_->notify();
  return stream;
}

void Engine::drain_incoming() {
  std::lock_guard<std::mutex> l(in_mu_);
  while (!incoming_.empty()) {
    waiting_.push_back(std::move(incoming_.front()));
    incoming_.pop_front();
  }
}

void Engine::loop() {
  while (!stop_) {
    {
      std::unique_lock<std::mutex> l(sig_->mu);
      bool idle = running_.empty() && waiting_.empty();
      if (idle) {
        sig_->cv.wait(l, [&] {
          if (stop_ || sig_->pending) return true;
          std::lock_guard<std::mutex> il(in_mu_);
          return !incoming_.empty();
        });
      }
      sig_->pending = false;
    }
    if (stop_) break;
    step();
  }
}

bool Engine::step() {
  drain_incoming();
  // Cancellations (running and waiting).
  for (size_t i = 0; i < running_.size();) {
    if (running_[i]->stream->cancelled()) {
      EngineEvent ev;
      finish(*running_[i], ev, FinishReason::kAbort);
      running_.erase(running_.begin() + i);
    } else {
      ++i;
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->stream->cancelled()) {
      EngineEvent ev;
      finish(**it, ev, FinishReason::kAbort);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  if (running_.empty() && waiting_.empty()) {
    publish_stats();
    return false;
  }
  try {
    schedule_and_run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine: step failed: %s\n", e.what());
    for (auto& s : running_) {
      EngineEvent ev;
      ev.error = e.what();
      finish(*s, ev, FinishReason::kError);
    }
    running_.clear();
  }
  publish_stats();
  return true;
}

void Engine::preempt(size_t i) {
  auto s = std::move(running_[i]);
  running_.erase(running_.begin() + i);
  kv_->free(s->id);
  s->num_computed = 0;
  ++metrics_.preemptions;
  waiting_.push_front(std::move(s));
}

void Engine::schedule_and_run() {
  // 1. Capacity: admit FCFS while there are slots and pages for the whole prompt (beyond one
  // page per running sequence kept in reserve for decodes).
  while (!waiting_.empty() && int(running_.size()) < cfg_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    int need[2];
    kv_->pages_for_length(int32_t(s.tokens.size()) + 1, need);
    int reserve = int(running_.size());
    bool fits = need[kKvFull] + reserve <= kv_->num_free(kKvFull) &&
                need[kKvSliding] + reserve <= kv_->num_free(kKvSliding) + 0;
    if (!fits && !running_.empty()) break;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    if (!fits) break;  // admitted alone into an empty engine; it gets what is there
  }

  // 2. Micro-batch under the token budget.
  struct Item {
    Sequence* s;
    int32_t n;
  };
  std::vector<Item> items;
  std::vector<uint8_t> in_step(running_.size(), 0);
  int budget = cfg_.max_num_batched_tokens;
  // decodes, oldest first
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i].get();
    if (s->num_computed != int32_t(s->tokens.size()) - 1) continue;
    bool ok = true;
    while (!kv_->prepare(s->id, s->num_computed, 1)) {
      // preempt the newest running sequence not already in this step (possibly s itself)
      size_t v = running_.size();
      while (v > 0 && in_step[v - 1]) --v;
      if (v == 0) {
        ok = false;
        break;
      }
      --v;
      bool self = running_[v].get() == s;
      preempt(v);
      in_step.erase(in_step.begin() + v);
      if (self) {
        ok = false;
        break;
      }
    }
    if (!ok) {
      // s was preempted (or nothing left to free); the loop index now points past it
      if (i < running_.size() && running_[i].get() != s) --i;
      continue;
    }
    in_step[i] = 1;
    items.push_back({s, 1});
    --budget;
  }
  // prefill chunks, oldest first
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* s = running_[i].get();
    int32_t remaining = int32_t(s->tokens.size()) - s->num_computed;
    if (in_step[i] || remaining <= 1) continue;
    int32_t n = std::min<int32_t>(remaining, budget);
    // Prompt logprobs take a [rows, vocab] host logits row per prompt position: bound a step's rows.
    if (s->sp.prompt_logprobs >= 0 && s->prompt_lp_next < s->prompt_len) n = std::min(n, kMaxPromptLogprobRows);
    while (n > 0 && !kv_->can_prepare(s->id, s->num_computed, n)) n /= 2;
    if (n == 0) continue;
    kv_->prepare(s->id, s->num_computed, n);
    in_step[i] = 1;
    items.push_back({s, n});
    budget -= n;
  }
  if (items.empty()) {
    // Nothing fits: free the newest running sequence so older ones progress.
    if (running_.size() > 1) {
      preempt(running_.size() - 1);
      return;
    }
    if (running_.size() == 1) {
      EngineEvent ev;
      ev.error = "the KV cache cannot hold this request";
      finish(*running_[0], ev, FinishReason::kError);
      running_.clear();
    }
    return;
  }

  // 3. One forward over the mixed batch.
  ForwardBatch batch;
  std::vector<Sequence*> row_seq;
  // Rows for prompt logprobs (after the sampled rows): the logits at prompt position `pos` give
  // the logprob of prompt token pos + 1.
  struct PromptRow {
    Sequence* s;
    int32_t pos, batch_index;
  };
  std::vector<PromptRow> prompt_rows;
  for (auto& it : items) {
    SeqBatchInfo info;
    info.first_token = int32_t(batch.tokens.size());
    info.n_tokens = it.n;
    info.start_pos = it.s->num_computed;
    kv_->fill(it.s->id, info);
    batch.tokens.insert(batch.tokens.end(), it.s->tokens.begin() + it.s->num_computed,
                        it.s->tokens.begin() + it.s->num_computed + it.n);
    batch.seqs.push_back(info);
    if (it.s->sp.prompt_logprobs >= 0) {
      const int32_t from = std::max(it.s->num_computed, it.s->prompt_lp_next - 1);
      const int32_t to = std::min(it.s->num_computed + it.n, it.s->prompt_len - 1);
      for (int32_t p = from; p < to; ++p) prompt_rows.push_back({it.s, p, info.first_token + (p - it.s->num_computed)});
    }
    if (it.s->num_computed + it.n == int32_t(it.s->tokens.size())) {
      batch.logit_rows.push_back(int32_t(batch.tokens.size()) - 1);
      row_seq.push_back(it.s);
    }
  }
  for (const PromptRow& pr : prompt_rows) batch.logit_rows.push_back(pr.batch_index);
  // When no row needs its logits on the host (logprobs, prompt logprobs, penalties, logit_bias),
  // the backend draws the tokens itself (on the device for CUDA: ids come back instead of
  // [rows, vocab] logits), with this step's uniform from each request's generator, as
  // sample_token would use it.
  const int rows = int(row_seq.size());
  std::vector<int32_t> toks(rows);
  const bool backend_samples =
      rows > 0 && prompt_rows.empty() && std::all_of(row_seq.begin(), row_seq.end(), [](const Sequence* s) {
        return s->sp.logprobs < 0 && s->sp.presence_penalty == 0.0f && s->sp.frequency_penalty == 0.0f &&
               s->sp.logit_bias.empty();
      });
  if (backend_samples) {
    std::vector<RowSampling> how(rows);
    for (int r = 0; r < rows; ++r) how[r] = row_sampling(row_seq[r]->sp, uniform01(row_seq[r]->rng));
    backend_.forward_sample(batch, how.data(), toks.data());
  } else {
    logits_.resize(size_t(batch.logit_rows.size()) * vocab_);
    backend_.forward(batch, logits_.data());
  }
  ++metrics_.steps;
  for (auto& it : items) {
    if (it.s->num_computed < it.s->prompt_len)
      metrics_.prompt_tokens += std::min<int32_t>(it.n, it.s->prompt_len - it.s->num_computed);
    it.s->num_computed += it.n;
  }
  if (!prompt_rows.empty()) {
    std::vector<TokenLogprob> plps(prompt_rows.size());
    const float* base = logits_.data() + size_t(rows) * vocab_;
#pragma omp parallel for schedule(static) if (prompt_rows.size() > 1)
    for (int i = 0; i < int(prompt_rows.size()); ++i) {
      const PromptRow& pr = prompt_rows[i];
      plps[i] = compute_logprobs(base + size_t(i) * vocab_, vocab_, pr.s->tokens[pr.pos + 1], pr.s->sp.prompt_logprobs);
    }
    for (size_t i = 0; i < prompt_rows.size(); ++i) {
      prompt_rows[i].s->prompt_lps.push_back(std::move(plps[i]));
      prompt_rows[i].s->prompt_lp_next = prompt_rows[i].pos + 2;
    }
  }

  // 4. Sample (rows in parallel: each has its own generator), then stream and finish in order.
  std::vector<TokenLogprob> lps(rows);
#pragma omp parallel for schedule(dynamic, 1) if (rows > 1 && !backend_samples)
  for (int r = 0; r < rows; ++r) {
    if (backend_samples) continue;
    thread_local std::vector<float> scratch;
    thread_local std::vector<int32_t> idx;
    Sequence& s = *row_seq[r];
    const float* row = logits_.data() + size_t(r) * vocab_;
    toks[r] = sample_token(row, vocab_, s.sp, s.counts, s.rng, scratch, idx);
    if (s.sp.logprobs >= 0) lps[r] = compute_logprobs(row, vocab_, toks[r], s.sp.logprobs);
  }
  // Prompt-logprob steps grow the host logits to ~100 MB: give that back rather than keep it.
  if (!prompt_rows.empty()) std::vector<float>().swap(logits_);
  std::vector<uint64_t> done;
  for (int r = 0; r < rows; ++r) {
    Sequence& s = *row_seq[r];
    EngineEvent ev;
    append_token(s, toks[r], s.sp.logprobs >= 0 ? &lps[r] : nullptr, ev);
    if (ev.finished) done.push_back(s.id);
  }
  for (uint64_t id : done)
    for (size_t i = 0; i < running_.size(); ++i)
      if (running_[i]->id == id) {
        running_.erase(running_.begin() + i);
        break;
      }
}

size_t Engine::safe_text_end(const Sequence& s) const {
  size_t end = s.text.size();
  // hold back a suffix that may begin a stop string
  size_t hold = 0;
  for (const auto& st : s.sp.stop) {
    for (size_t k = std::min(st.size() - 1, s.text.size()); k > hold; --k)
      if (s.text.compare(s.text.size() - k, k, st, 0, k) == 0) {
        hold = k;
        break;
      }
  }
  end -= hold;
  // hold back an incomplete UTF-8 sequence
  size_t i = end, back = 0;
  while (i > s.text_sent && back < 4) {
    unsigned char c = s.text[i - 1];
    ++back;
    --i;
    if ((c & 0xC0) != 0x80) {  // lead byte or ASCII
      int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      if (int(back) < len) end = i;
      break;
    }
  }
  return std::max(end, s.text_sent);
}

void Engine::append_token(Sequence& s, int32_t tok, TokenLogprob* lp, EngineEvent& ev) {
  auto now = Clock::now();
  if (!s.got_first) {
    s.got_first = true;
    metrics_.ttft_s.observe(std::chrono::duration<double>(now - s.arrival).count());
  } else {
    metrics_.itl_s.observe(std::chrono::duration<double>(now - s.last_token).count());
  }
  s.last_token = now;
  s.tokens.push_back(tok);
  ++s.counts[tok];
  ++metrics_.generation_tokens;
  ev.tokens.push_back(tok);
  if (lp) ev.logprobs.push_back(std::move(*lp));
  if (!s.prompt_lps.empty()) {
    ev.prompt_logprobs = std::move(s.prompt_lps);
    s.prompt_lps.clear();
  }

  bool is_stop_tok = std::find(s.sp.stop_token_ids.begin(), s.sp.stop_token_ids.end(), tok) != s.sp.stop_token_ids.end();
  if (!s.sp.ignore_eos && !is_stop_tok)
    is_stop_tok = std::find(cfg_.stop_token_ids.begin(), cfg_.stop_token_ids.end(), tok) != cfg_.stop_token_ids.end();
  if (is_stop_tok) {
    ev.stop_token = tok;
    finish(s, ev, FinishReason::kStop);
    return;
  }
  if (cfg_.token_text) {
    size_t before = s.text.size();
    s.text += cfg_.token_text(tok);
    for (const auto& st : s.sp.stop) {
      if (st.empty()) continue;
      size_t from = before >= st.size() ? before - st.size() + 1 : 0;
      size_t pos = s.text.find(st, from);
      if (pos != std::string::npos) {
        s.text.resize(std::max(pos, s.text_sent));
        ev.stop_string = st;
        finish(s, ev, FinishReason::kStop);
        return;
      }
    }
  }
  if (s.output_len() >= s.sp.max_tokens || int(s.tokens.size()) >= max_model_len_) {
    finish(s, ev, FinishReason::kLength);
    return;
  }
  size_t end = safe_text_end(s);
  ev.text = s.text.substr(s.text_sent, end - s.text_sent);
  s.text_sent = end;
  ev.prompt_tokens = s.prompt_len;
  ev.completion_tokens = s.output_len();
  s.stream->push(std::move(ev));
}

void Engine::finish(Sequence& s, EngineEvent& ev, FinishReason r) {
  kv_->free(s.id);
  if (s.text_sent < s.text.size()) ev.text += s.text.substr(s.text_sent);
  s.text_sent = s.text.size();
  ev.finished = true;
  ev.finish_reason = r;
  ev.prompt_tokens = s.prompt_len;
  ev.completion_tokens = s.output_len();
  if (r == FinishReason::kAbort) ++metrics_.requests_aborted;
  ++metrics_.requests_finished;
  metrics_.e2e_s.observe(std::chrono::duration<double>(Clock::now() - s.arrival).count());
  --active_;  // before the push: whoever sees the end also sees the count
  s.stream->push(std::move(ev));
}

void Engine::publish_stats() {
  EngineStats st;
  st.running = int(running_.size());
  {
    std::lock_guard<std::mutex> l(in_mu_);
    st.waiting = int(waiting_.size() + incoming_.size());
  }
  st.kv_usage = kv_->usage();
  for (int g = 0; g < 2; ++g) {
    st.kv_pages_used[g] = kv_->pool(KvGroup(g)).num_used();
    st.kv_pages_total[g] = kv_->pool(KvGroup(g)).num_pages();
  }
  std::lock_guard<std::mutex> l(stats_mu_);
  stats_ = st;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> l(stats_mu_);
  return stats_;
}

}  // namespace gptoss
