#include "engine/engine.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/error.h"

namespace gptoss {

namespace {
// At most this many prompt-logprob rows per step (each is a [vocab] float row on the host).
constexpr int32_t kMaxPromptLogprobRows = 128;
}  // namespace

Engine::Engine(Backend& backend, EngineConfig cfg) : backend_(backend), cfg_(std::move(cfg)) {
  const GptOssConfig& mc = backend_.config();
  vocab_ = mc.vocab;
  if (const char* f = std::getenv("GPTOSS_TEST_FAIL_AT_OUTPUT_TOKEN"); f && cfg_.test_fail_at_output_token == 0)
    cfg_.test_fail_at_output_token = std::atoi(f);
  if (cfg_.max_num_seqs < 1) throw Error("max_num_seqs must be at least 1");
  if (cfg_.max_num_batched_tokens == 0)
    cfg_.max_num_batched_tokens = std::max(backend_.default_max_num_batched_tokens(), cfg_.max_num_seqs);
  if (cfg_.max_num_batched_tokens < 1) throw Error("max_num_batched_tokens must be at least 1");
  // Every running sequence decodes in every step (stall-free batching): the budget must hold them.
  if (cfg_.max_num_batched_tokens < cfg_.max_num_seqs)
    throw Error("max_num_batched_tokens (" + std::to_string(cfg_.max_num_batched_tokens) +
                ") must be at least max_num_seqs (" + std::to_string(cfg_.max_num_seqs) +
                "): every running sequence decodes a token in each step");
  // An explicit max_model_len (or KV size) is a promise to the user: refused at start when it
  // cannot be kept, never quietly reduced. Only the defaults adapt to the memory there is.
  if (cfg_.speculative.enabled() && cfg_.speculative.method == "eagle3") {
    if (!backend_.supports_hidden_taps())
      throw Error("eagle3 drafts need the target's hidden states, which the " + backend_.name() +
                  " backend does not hand out yet (eagle3 is not on " + backend_.name() +
                  " yet: use the cpu or cuda backend, or the ngram method)");
    auto head = Eagle3Weights::load(cfg_.speculative.model);
    eagle_taps_ = head->config.tap_layers(mc.num_layers);
    eagle_tap_width_ = 3 * head->config.target_hidden;
    // The backend's own head when it has one (CUDA: on the GPU); GPTOSS_EAGLE3_HOST=1 keeps
    // the head on the host (comparisons, debugging).
    const char* host_only = std::getenv("GPTOSS_EAGLE3_HOST");
    if (!(host_only && std::string(host_only) == "1")) drafter_ = backend_.make_eagle3_head(head);
    if (!drafter_) {
      std::shared_ptr<Checkpoint> target;  // the shared embedding of a head that ships none
      const TensorView* embed = nullptr;
      if (!head->embed && !cfg_.speculative.target_model.empty()) {
        target = std::make_shared<Checkpoint>(cfg_.speculative.target_model);
        embed = &target->get("model.embed_tokens.weight");
      }
      drafter_ = std::make_unique<HostEagle3Head>(std::make_unique<Eagle3Drafter>(std::move(head), mc, embed, target));
    }
  }
  const bool explicit_len = cfg_.max_model_len > 0;
  int mml = explicit_len ? cfg_.max_model_len : mc.max_position_embeddings;
  if (mml < 2) throw Error("max_model_len must be at least 2");
  if (mml > mc.max_position_embeddings)
    throw Error("--max-model-len " + std::to_string(mml) + " is larger than the model's max_position_embeddings (" +
                std::to_string(mc.max_position_embeddings) + ")");
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
    if (explicit_len) tokens = std::max<int64_t>(tokens, mml);  // the context asked for fits at least once
  }
  KvManagerConfig kc = plan_kv_pages(mc, kvc.dtype, cfg_.page_size, tokens, bytes, cfg_.max_num_seqs,
                                     cfg_.max_num_batched_tokens);
  // A sequence must fit the pool alone.
  int64_t pool_tokens = int64_t(kc.num_pages[kKvFull]) * cfg_.page_size;
  if (mml > pool_tokens) {
    if (explicit_len || cfg_.kv_cache_tokens > 0)
      throw Error("max_model_len " + std::to_string(mml) + " does not fit the KV cache, which holds " +
                  std::to_string(pool_tokens) + " tokens (one sequence of max_model_len must fit): raise " +
                  "--kv-cache-tokens or --kv-cache-memory, or pass --max-model-len " + std::to_string(pool_tokens) +
                  " or less");
    std::fprintf(stderr, "engine: the model's max_position_embeddings (%d) exceeds the KV cache (%lld tokens); "
                 "max_model_len set to %lld\n", mml, (long long)pool_tokens, (long long)pool_tokens);
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
  kc.enable_prefix_caching = cfg_.enable_prefix_caching;
  kv_ = std::make_unique<KvManager>(kc);
  publish_stats();
}

Engine::~Engine() { stop(); }

void Engine::start() {
  if (thread_.joinable()) return;
  stop_ = false;
  deliver_quit_ = false;
  deliver_async_ = true;
  // Named threads, so top -H, perf and gdb say which is which.
  deliver_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gptoss-deliver");
    deliver_main();
  });
  if (cfg_.async_scheduling) {
    worker_quit_ = false;
    worker_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "gptoss-forward");
      worker_main();
    });
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gptoss-engine");
    loop();
  });
}

void Engine::stop() {
  stop_ = true;
  sig_->notify();
  if (thread_.joinable()) thread_.join();
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> l(worker_mu_);
      worker_quit_.store(true);
    }
    worker_cv_.notify_all();
    worker_.join();
  }
  // Abort whatever is left.
  drain_incoming();
  auto abort_seq = [&](Sequence& s) {
    if (s.done) return;
    EngineEvent ev;
    finish(s, ev, FinishReason::kAbort);
  };
  for (auto& s : running_) abort_seq(*s);
  for (auto& s : waiting_) abort_seq(*s);
  running_.clear();
  waiting_.clear();
  flush_outbox();
  publish_stats();
  // The delivery thread pushes what is queued (the aborts above included), then ends.
  if (deliver_.joinable()) {
    {
      std::lock_guard<std::mutex> l(deliver_mu_);
      deliver_quit_ = true;
    }
    deliver_cv_.notify_all();
    deliver_.join();
  }
  deliver_async_ = false;
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
  if (cfg_.speculative.enabled()) s->draft_len = AdaptiveDraftLength(cfg_.speculative.num_speculative_tokens);
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

// The forward worker: runs one Launched pass at a time off the engine thread, so that the
// engine does the previous pass's bookkeeping meanwhile (EngineConfig::async_scheduling). Both
// sides spin before blocking: the next job and the join come within microseconds of each other,
// and a condition variable's wake-up alone can cost more than the host work the overlap hides.
// The engine thread waits for the join spinning the whole pass when a GPU computes it
// (Backend::computes_on_host): a wake-up after a 15 ms sleep cost ~50 us more a gap on the H200
// machine (120b, 32-64 streams) than the CUDA stream's own spinning wait in the synchronous loop.
namespace {
template <class Pred>
bool spin_until(Pred ready, std::chrono::microseconds budget = std::chrono::microseconds(200)) {
  const auto until = std::chrono::steady_clock::now() + budget;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}
}  // namespace

void Engine::worker_main() {
  while (true) {
    if (!spin_until([&] { return worker_job_.load() != nullptr || worker_quit_.load(); })) {
      std::unique_lock<std::mutex> l(worker_mu_);
      worker_cv_.wait(l, [&] { return worker_job_.load() != nullptr || worker_quit_.load(); });
    }
    Launched* job = worker_job_.load();
    if (job == nullptr) return;  // quit
    run_forward(*job);
    {
      std::lock_guard<std::mutex> l(worker_mu_);
      worker_job_.store(nullptr);
    }
    worker_cv_.notify_all();
  }
}

void Engine::worker_submit(Launched* job) {
  {
    std::lock_guard<std::mutex> l(worker_mu_);
    worker_job_.store(job);
  }
  worker_cv_.notify_all();
}

void Engine::worker_wait() {
  const auto budget = backend_.computes_on_host() ? std::chrono::microseconds(200) : std::chrono::microseconds(std::chrono::seconds(10));
  if (spin_until([&] { return worker_job_.load() == nullptr; }, budget)) return;
  std::unique_lock<std::mutex> l(worker_mu_);
  worker_cv_.wait(l, [&] { return worker_job_.load() == nullptr; });
}

void Engine::loop() {
  // Async scheduling: forward N runs on the worker thread. At the join N's drawn ids are appended
  // (take_tokens_early), N+1 is planned and launched from them, and only then does N's
  // bookkeeping (logprobs, detokenization, stop strings, events) run, while N+1 is on the
  // device. Planning after the join keeps admission as prompt as the synchronous loop's: a
  // request that arrived while N ran is in N+1. A pass whose ids cannot be taken early (host
  // sampling, prompt logprobs, constraints, drafts) completes before N+1 is planned.
  std::unique_ptr<Launched> cur;
  while (true) {
    {
      std::unique_lock<std::mutex> l(sig_->mu);
      bool idle = !cur && running_.empty() && waiting_.empty();
      if (idle && !stop_) {
        sig_->cv.wait(l, [&] {
          if (stop_ || sig_->pending) return true;
          std::lock_guard<std::mutex> il(in_mu_);
          return !incoming_.empty();
        });
      }
      sig_->pending = false;
    }
    if (stop_ && !cur) break;
    if (!cfg_.async_scheduling) {
      step();
      continue;
    }
    try {
      std::unique_ptr<Launched> done;
      if (cur) {
        worker_wait();
        done = std::move(cur);
        if (!take_tokens_early(*done)) {
          complete(*done);
          done.reset();
        }
      }
      Planned next;
      if (!stop_ && begin_iteration()) next = plan_next();
      if (!next.items.empty()) {
        cur = launch(std::move(next));
        worker_submit(cur.get());
        if (done) ++metrics_.early_launches;
      }
      // A sequence N's bookkeeping ends by a stop string (not foreseen at the join) wastes its
      // row in N+1, whose complete() skips it; its pages, freed now, are written by N+1 before
      // any later pass.
      if (done) complete(*done);
      flush_outbox();  // N's tokens reach the clients while N+1 runs
    } catch (const std::exception& e) {
      if (cur) {
        worker_wait();
        for (auto& it : cur->items) --it.s->in_flight;
        cur.reset();
      }
      fail_running(e.what());
    }
    flush_outbox();
    drop_finished();
    publish_stats();
  }
}

bool Engine::begin_iteration() {
  drain_incoming();
  // Cancellations (running and waiting): finish them; drop_finished removes them.
  for (auto& s : running_)
    if (!s->done && s->stream->cancelled()) {
      EngineEvent ev;
      finish(*s, ev, FinishReason::kAbort);
    }
  for (auto& s : waiting_)
    if (!s->done && s->stream->cancelled()) {
      EngineEvent ev;
      finish(*s, ev, FinishReason::kAbort);
    }
  drop_finished();
  if (running_.empty() && waiting_.empty()) {
    last_forward_end_.reset();
    return false;
  }
  return true;
}

void Engine::fail_running(const std::string& what) {
  std::fprintf(stderr, "engine: step failed: %s\n", what.c_str());
  for (auto& s : running_) {
    if (s->done) continue;
    EngineEvent ev;
    ev.error = what;
    finish(*s, ev, FinishReason::kError);
  }
  running_.clear();
  last_forward_end_.reset();
}

bool Engine::step() {
  if (!begin_iteration()) {
    flush_outbox();
    publish_stats();
    return false;
  }
  try {
    Planned p = plan_next();
    if (!p.items.empty()) {
      auto l = launch(std::move(p));
      run_forward(*l);
      complete(*l);
    }
  } catch (const std::exception& e) {
    fail_running(e.what());
  }
  flush_outbox();
  drop_finished();
  publish_stats();
  return true;
}

void Engine::drop_finished() {
  // A finished sequence still in a forward pass stays until that pass is joined.
  auto gone = [](const std::unique_ptr<Sequence>& s) { return !s || (s->done && !s->in_flight); };
  std::erase_if(running_, gone);
  std::erase_if(waiting_, gone);
}

Engine::Planned Engine::plan_next() {
  // The scheduler's view of each live sequence. Finished ones, and those whose last token
  // (taken early from the pass just joined) ends them once that pass completes, are left out.
  auto view_of = [&](const Sequence& s) {
    SchedSeq v{int64_t(s.id), s.num_computed, int32_t(s.tokens.size())};
    // Prompt logprobs take a [vocab] host logits row per prompt position: bound a step's rows.
    if (s.sp.prompt_logprobs >= 0 && s.prompt_lp_next < s.prompt_len) v.max_chunk = kMaxPromptLogprobRows;
    return v;
  };
  // 1. Capacity: admit from the front of the queue.
  {
    std::vector<SchedSeq> view;
    for (const auto& s : running_)
      if (!s->done && !s->ending) view.push_back(view_of(*s));
    std::vector<size_t> cand;
    std::vector<int32_t> lengths;
    size_t slots = size_t(std::max(0, cfg_.max_num_seqs - int(view.size())));
    for (size_t i = 0; i < waiting_.size() && cand.size() < slots; ++i) {
      if (waiting_[i]->done) continue;
      cand.push_back(i);
      lengths.push_back(int32_t(waiting_[i]->tokens.size()));
    }
    int admit = plan_admission(view, lengths, *kv_, cfg_.max_num_seqs);
    for (int k = 0; k < admit; ++k) {
      Sequence& s = *waiting_[cand[k]];
      // Start after the longest cached prefix (the last token is always computed). Prompt
      // logprobs need every prompt position's logits, so those requests compute it all.
      if (cfg_.enable_prefix_caching && s.sp.prompt_logprobs < 0) {
        const int32_t hit = kv_->match_prefix(int64_t(s.id), s.tokens.data(), int32_t(s.tokens.size()));
        s.num_computed = hit;
        metrics_.prefix_cache_queries += int64_t(s.tokens.size());
        metrics_.prefix_cache_hits += hit;
        if (s.cached_tokens < 0) s.cached_tokens = std::min<int32_t>(hit, s.prompt_len);
      }
      running_.push_back(std::move(waiting_[cand[k]]));
    }
    if (admit > 0) std::erase_if(waiting_, [](const std::unique_ptr<Sequence>& s) { return !s; });
  }

  // 2. Micro-batch: plan on a snapshot, then apply (victims' pages freed first).
  std::vector<Sequence*> seqs;
  std::vector<SchedSeq> view;
  for (const auto& s : running_)
    if (!s->done && !s->ending) {
      seqs.push_back(s.get());
      view.push_back(view_of(*s));
      s->draft.clear();
      // A constrained sequence drafts while its constraint is inactive (free text): each drawn
      // token then still goes through rejects() (complete()).
      if (cfg_.speculative.enabled() && view.back().decoding() && !(s->sp.constraint && s->sp.constraint->active())) {
        // Drafts past max_tokens or max_model_len would be wasted: the verified token after
        // them could not be emitted.
        const int room = std::min(s->sp.max_tokens - s->output_len(), max_model_len_ - int(s->tokens.size())) - 1;
        const int k = std::min(room, cfg_.speculative.adaptive ? s->draft_len.next()
                                                                : cfg_.speculative.num_speculative_tokens);
        const auto d0 = Clock::now();
        if (k > 0 && drafter_) {
          if (s->eagle) s->draft = drafter_->propose(*s->eagle, k);
        }
        else if (k > 0)
          s->draft = ngram_propose(s->tokens, k, cfg_.speculative.prompt_lookup_min, cfg_.speculative.prompt_lookup_max);
        metrics_.spec_draft_us += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - d0).count();
        view.back().num_draft = int32_t(s->draft.size());
      }
    }
  Planned out;
  StepPlan plan = plan_step(view, *kv_, cfg_.max_num_batched_tokens);
  if (plan.fail >= 0) {
    EngineEvent ev;
    ev.error = "the KV cache cannot hold this request";
    finish(*seqs[plan.fail], ev, FinishReason::kError);
    return out;
  }
  if (cfg_.speculative.enabled() && cfg_.speculative.adaptive) gate_drafts_by_cost(seqs, view, plan);
  for (int v : plan.preempt) kv_->free(seqs[v]->id);
  for (const StepRow& r : plan.rows) {
    Sequence* s = seqs[r.seq];
    if (!kv_->prepare(s->id, s->num_computed, r.n_tokens))
      throw Error("scheduler: the pages planned for sequence " + std::to_string(s->id) + " are not free");
    out.items.push_back({s, r.n_tokens});
    // The scheduler may grant fewer drafts than asked (budget, pages); prefill rows have none.
    s->draft.resize(std::min<size_t>(s->draft.size(), size_t(r.n_tokens - 1)));
  }
  // Newest first in the plan, each pushed to the front: the oldest victim is first in line.
  for (int v : plan.preempt) {
    Sequence* s = seqs[v];
    s->num_computed = 0;
    ++metrics_.preemptions;
    for (auto& p : running_)
      if (p.get() == s) {
        waiting_.push_front(std::move(p));
        break;
      }
  }
  std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return !s; });
  return out;
}

void Engine::gate_drafts_by_cost(const std::vector<Sequence*>& seqs, const std::vector<SchedSeq>& view,
                                 StepPlan& plan) {
  // Only steps of decoding sequences: next to a prefill chunk a few draft rows cost next to
  // nothing (and such passes are not measured).
  int any = 0;
  for (const StepRow& r : plan.rows) {
    if (!view[size_t(r.seq)].decoding()) return;
    any += r.n_tokens - 1;
  }
  if (any == 0) return;
  const double proposed = double(metrics_.spec_draft_tokens.load()), accepted = double(metrics_.spec_accepted_tokens.load());
  const double engine_rate = (accepted + 1.0) / (proposed + 2.0);
  std::vector<int> drafts;
  std::vector<double> accept;
  for (const StepRow& r : plan.rows) {
    const Sequence& s = *seqs[size_t(r.seq)];
    drafts.push_back(r.n_tokens - 1);
    // Its own record, with two drafts' worth of the engine-wide rate as the prior.
    accept.push_back((double(s.spec_accepted) + 2.0 * engine_rate) / (double(s.spec_proposed) + 2.0));
  }
  const std::vector<int> keep = drafts_worth_verifying(int(plan.rows.size()), drafts, accept, pass_cost_);
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    metrics_.spec_gated_tokens += drafts[i] - keep[i];
    plan.rows[i].n_tokens = 1 + keep[i];
  }
}

std::unique_ptr<Engine::Launched> Engine::launch(Planned planned) {
  auto l = std::make_unique<Launched>();
  l->items = std::move(planned.items);
  ForwardBatch& batch = l->batch;
  // The batch owns copies of its page tables: the engine may prepare or free pages of these
  // sequences while the pass runs (KvManager's vectors may move).
  l->tables.resize(l->items.size() * 2);
  for (size_t i = 0; i < l->items.size(); ++i) {
    Sequence* s = l->items[i].s;
    const int32_t n = l->items[i].n;
    SeqBatchInfo info;
    info.first_token = int32_t(batch.tokens.size());
    info.n_tokens = n;
    info.start_pos = s->num_computed;
    for (int g = 0; g < 2; ++g) {
      auto& t = l->tables[2 * i + g];
      t = kv_->table(s->id, KvGroup(g));
      info.pages[g] = t.empty() ? nullptr : t.data();
      info.n_pages[g] = int32_t(t.size());
    }
    // A verify row (speculative decoding): the last sampled token, then the drafts.
    const int32_t real = n - int32_t(s->draft.size());
    l->decode_only &= real == 1 && s->num_computed + 1 == int32_t(s->tokens.size());
    batch.tokens.insert(batch.tokens.end(), s->tokens.begin() + s->num_computed,
                        s->tokens.begin() + s->num_computed + real);
    batch.tokens.insert(batch.tokens.end(), s->draft.begin(), s->draft.end());
    batch.seqs.push_back(info);
    if (s->sp.prompt_logprobs >= 0) {
      // the logits at prompt position p give the logprob of prompt token p + 1
      const int32_t from = std::max(s->num_computed, s->prompt_lp_next - 1);
      const int32_t to = std::min(s->num_computed + n, s->prompt_len - 1);
      for (int32_t p = from; p < to; ++p) l->prompt_rows.push_back({s, p, info.first_token + (p - s->num_computed)});
    }
    if (s->num_computed + real == int32_t(s->tokens.size())) {
      // One logit row per draft plus the one after the last: row j scores the token that
      // follows the drafts up to d_j.
      for (int32_t j = int32_t(s->draft.size()); j >= 0; --j) {
        batch.logit_rows.push_back(int32_t(batch.tokens.size()) - 1 - j);
        l->row_seq.push_back(s);
      }
    }
    // Each prompt token counts once, as vLLM counts it: a recompute after preemption is not a
    // new prompt (it shows in num_preemptions_total instead).
    if (const int32_t prompt_done = std::min<int32_t>(s->num_computed + n, s->prompt_len); prompt_done > s->prompt_counted) {
      l->prompt_tokens += prompt_done - s->prompt_counted;
      s->prompt_counted = prompt_done;
    }
    s->num_computed += n;
    ++s->in_flight;
  }
  // Prompt-logprob rows come after the sampled rows.
  for (const auto& pr : l->prompt_rows) batch.logit_rows.push_back(pr.batch_index);
  if (drafter_) {  // every token's taps: the drafter commits the rows that stand after verification
    batch.tap_layers = eagle_taps_;
    if (drafter_->device_taps()) {
      batch.taps_on_device = true;
    } else {
      l->taps.resize(batch.tokens.size() * size_t(eagle_tap_width_));
      batch.tap_out = l->taps.data();
    }
  }
  // When no row needs its logits on the host (prompt logprobs; top logprobs, penalties, logit_bias
  // or an active structured-output constraint on a backend that does not handle them), the
  // backend draws the tokens itself (on the device for CUDA: ids come back instead of [rows,
  // vocab] logits, with the drawn tokens' logprobs and top lists where a row asks for them), with
  // this step's uniform from each request's generator, as sample_token would use it. An active
  // constraint's state has taken every earlier token by then (a masked row's token is given to it
  // at the join, take_tokens_early, or in complete() before the next plan). Batch-invariant mode: a non-greedy row is always drawn on the host (the device sampler
  // agrees with the host only up to float rounding), so which path draws a row's token never
  // depends on its companions; greedy rows are an exact argmax on either path.
  const int rows = int(l->row_seq.size());
  if (cfg_.test_fail_at_output_token > 0)  // fails as the backend would, in complete()
    for (const Sequence* q : l->row_seq)
      if (q->output_len() + 1 == cfg_.test_fail_at_output_token)
        l->error = std::make_exception_ptr(
            Error("injected fault: GPTOSS_TEST_FAIL_AT_OUTPUT_TOKEN=" + std::to_string(cfg_.test_fail_at_output_token)));
  l->toks.resize(rows);
  // A sequence's rows (1 + drafts, contiguous) go to the backend or the host together.
  auto backend_may_draw = [&](const Sequence* s, int n_rows, bool masked) {
    return (s->sp.logprobs < 0 || (s->sp.logprobs == 0 && backend_.samples_logprobs()) ||
            (s->sp.logprobs <= kMaxTopLogprobs && backend_.samples_top_logprobs())) &&
           (!cfg_.batch_invariant || s->sp.temperature < 1e-5f) &&
           ((!changes_logits(s->sp) && !masked) || backend_.applies_logit_changes()) &&
           !(masked && n_rows > 1);  // a masked row has no drafts after it (one mask a sequence)
  };
  // Rows the backend may not draw (top logprobs past kMaxTopLogprobs, or on a backend that gives
  // none; logit_bias, penalties and structured-output masks on a backend that does not apply them): all of them drawn on the host from [rows, vocab]
  // logits, or, when the backend keeps chosen rows' logits (Backend::keeps_logits), the backend
  // draws the others and only those rows' logits come to the host. A masked row the backend draws
  // takes its constraint's allowed tokens (allowed_row; a constraint that allows none is left to
  // the host, which ends the request with an error).
  std::vector<uint8_t> on_host(size_t(rows), 0);
  std::vector<int32_t> allowed_row(size_t(rows), -1);
  int n_host = 0;
  const size_t mask_words = allowed_words(vocab_);
  for (int r = 0; r < rows;) {
    Sequence* s = l->row_seq[r];
    int end = r;
    while (end < rows && l->row_seq[end] == s) ++end;
    const bool masked = s->sp.constraint && s->sp.constraint->active();
    bool host = !backend_may_draw(s, end - r, masked);
    if (!host && masked) {
      const size_t at = l->allowed.size();
      l->allowed.resize(at + mask_words);
      if (s->sp.constraint->allowed_tokens(l->allowed.data() + at, vocab_)) {
        allowed_row[size_t(r)] = int32_t(at / mask_words);
      } else {
        l->allowed.resize(at);
        host = true;
      }
    }
    for (; r < end; ++r) n_host += on_host[size_t(r)] = host;
  }
  l->backend_samples = rows > 0 && l->prompt_rows.empty() && (n_host == 0 || (backend_.keeps_logits() && n_host < rows));
  l->kept.clear();
  if (l->backend_samples && n_host > 0) {
    l->kept.assign(size_t(rows), -1);
    for (int r = 0, k = 0; r < rows; ++r)
      if (on_host[size_t(r)]) l->kept[size_t(r)] = k++;
    logits_.resize(size_t(n_host) * size_t(vocab_));
  }
  if (l->backend_samples) {
    // Each row's uniform is the one the host sampler would take for that position. They are
    // drawn from a copy of the generator: complete() advances the request's own generator by
    // the tokens actually emitted (a rejected draft's later rows take no draw).
    l->how.resize(rows);
    if (std::any_of(l->row_seq.begin(), l->row_seq.end(), [](const Sequence* s) { return s->sp.logprobs >= 0; }))
      l->lps.assign(size_t(rows), 0.0f);
    for (int r = 0; r < rows;) {
      Sequence* s = l->row_seq[r];
      std::mt19937_64 peek = s->rng;
      const int first = r;
      for (; r < rows && l->row_seq[r] == s; ++r) {
        l->how[r] = row_sampling(s->sp, uniform01(peek));
        l->how[r].keep_logits = !l->kept.empty() && l->kept[size_t(r)] >= 0;
        l->how[r].allowed_row = allowed_row[size_t(r)];
        if (!l->how[r].keep_logits && s->sp.logprobs > 0) {
          l->how[r].top_logprobs = s->sp.logprobs;
          l->tops.resize(size_t(rows));  // the backend's top lists (only when a row it draws asks)
        }
        if (l->how[r].keep_logits || !changes_logits(s->sp)) continue;
        // The penalties of a draft's row see the drafts before it, as complete()'s host draw does
        // (counts are up to date here: take_tokens_early counts the tokens it appends).
        if (r > first) ++s->counts[s->draft[size_t(r - first - 1)]];
        l->how[r].adds_begin = int32_t(l->adds.size());
        logit_adds(s->sp, s->counts, vocab_, l->adds);
        l->how[r].adds_count = int32_t(l->adds.size()) - l->how[r].adds_begin;
      }
      if (!l->how[first].keep_logits && changes_logits(s->sp))
        for (int i = 0; i < r - first - 1; ++i)
          if (--s->counts[s->draft[size_t(i)]] == 0) s->counts.erase(s->draft[size_t(i)]);
    }
  } else {
    // One pass at a time uses the host logits (N's are consumed before N+1 is launched).
    logits_.resize(batch.logit_rows.size() * size_t(vocab_));
  }
  l->begin = Clock::now();
  if (last_forward_end_)
    metrics_.step_host_s.observe(std::chrono::duration<double>(l->begin - *last_forward_end_).count());
  return l;
}

void Engine::run_forward(Launched& l) {
  if (l.error) {  // an injected fault (see EngineConfig::test_fail_at_output_token)
    l.end = Clock::now();
    return;
  }
  try {
    if (l.backend_samples)
      backend_.forward_sample(l.batch, l.how.data(), l.toks.data(), l.lps.empty() ? nullptr : l.lps.data(),
                              l.kept.empty() ? nullptr : logits_.data(),
                              LogitChanges{l.adds.empty() ? nullptr : l.adds.data(),
                                           l.allowed.empty() ? nullptr : l.allowed.data()},
                              l.tops.empty() ? nullptr : l.tops.data());
    else
      backend_.forward(l.batch, logits_.data());
  } catch (...) {
    l.error = std::current_exception();
  }
  l.end = Clock::now();
}

void Engine::complete(Launched& l) {
  for (auto& it : l.items) --it.s->in_flight;
  if (l.error) std::rethrow_exception(l.error);
  last_forward_end_ = l.end;
  metrics_.step_forward_s.observe(std::chrono::duration<double>(l.end - l.begin).count());
  if (l.decode_only) pass_cost_.record(int(l.batch.tokens.size()), std::chrono::duration<double>(l.end - l.begin).count());
  ++metrics_.steps;
  metrics_.prompt_tokens += l.prompt_tokens;
  // The pages this pass wrote are complete: offer them to the prefix cache (take_tokens_early
  // did when it took the tokens). A sequence cancelled or preempted meanwhile has no pages left
  // and is skipped.
  if (!l.tokens_taken)
    for (size_t i = 0; i < l.items.size(); ++i)
      if (!l.items[i].s->done) commit_pages(l, i);

  // Sample and verify (sequences in parallel: each has its own generator), then stream and
  // finish in order. A sequence cancelled while the pass ran is finished already; one preempted
  // meanwhile still takes its tokens (valid: its pages were intact during the pass) and
  // recomputes later. A sequence's rows are consecutive: 1 + its drafts (speculative decoding).
  // Row j's token is drawn as plain decoding would draw it at that position; drafts are accepted
  // while they equal the drawn token, and the first token that differs (or the one after the
  // last draft) ends the sequence's tokens for this step (engine/speculative.h: why this is the
  // speculative-sampling rule and leaves the output unchanged).
  // An active constraint's row is masked first (so its logprobs are those of the allowed
  // tokens); a constraint that allows nothing ends its request with an error. An inactive
  // constraint's token was drawn without the mask: one it refuses is dropped and its position
  // computed again by the next step, drawn then from the masked row (rejection sampling: the
  // masked distribution exactly). A constrained sequence drafts only while inactive, and its
  // step's tokens end at a refused one (not emitted) or one that changes the constraint's phase.
  const int rows = int(l.row_seq.size());
  std::vector<int> group_first;
  for (int r = 0; r < rows; ++r)
    if (r == 0 || l.row_seq[r] != l.row_seq[r - 1]) group_first.push_back(r);
  const int groups = int(group_first.size());
  group_first.push_back(rows);
  std::vector<TokenLogprob> lps(rows);
  std::vector<uint8_t> no_token(size_t(rows), 0);
  std::vector<int> emitted(groups, 0);  // tokens this step gives each sequence
  std::vector<uint8_t> redraw(size_t(groups), 0);  // its token refused by its constraint: draw again
  // A group is drawn on the host when the whole step is, or when its rows are kept ones (a
  // sequence's rows are all kept or none: the same sampling parameters).
  auto host_row = [&](int r) { return !l.backend_samples ? r : l.kept.empty() ? -1 : l.kept[size_t(r)]; };
  const bool any_host = !l.backend_samples || !l.kept.empty();
#pragma omp parallel for schedule(dynamic, 1) if (groups > 1 && any_host)
  for (int g = 0; g < groups; ++g) {
    Sequence& s = *l.row_seq[group_first[g]];
    if (s.done) continue;
    const int n_rows = group_first[g + 1] - group_first[g];
    const bool host = host_row(group_first[g]) >= 0;
    int j = 0;
    for (; j < n_rows; ++j) {
      const int r = group_first[g] + j;
      float* row = host ? logits_.data() + size_t(host_row(r)) * vocab_ : nullptr;
      // Masked: on the host now, or by the backend (allowed_row): either way not a draw to check.
      const bool masked = s.sp.constraint && (host ? s.sp.constraint->active() : l.how[size_t(r)].allowed_row >= 0);
      if (host) {
        if (masked && !s.sp.constraint->mask_logits(row, vocab_)) {
          no_token[size_t(r)] = 1;
          break;
        }
        // Penalties see the drafts accepted before this position, as they would in plain decoding.
        if (j > 0) ++s.counts[s.draft[j - 1]];
        l.toks[r] = sample_token(row, vocab_, s.sp, s.counts, s.rng);
      }
      if (host && s.sp.logprobs >= 0) {
        lps[r] = compute_logprobs(row, vocab_, l.toks[r], s.sp.logprobs);
      } else if (s.sp.logprobs >= 0) {  // the backend's, for the token it drew (and its top list)
        lps[r].token = l.toks[r];
        lps[r].logprob = l.lps[size_t(r)];
        for (int k = 0; k < s.sp.logprobs; ++k)
          lps[r].top.emplace_back(l.tops[size_t(r)].ids[k], l.tops[size_t(r)].logprobs[k]);
      }
      // (A token taken early was checked then, and its constraint has taken it since.)
      if (s.sp.constraint && !masked && !l.tokens_taken && s.sp.constraint->rejects(l.toks[r])) {
        redraw[size_t(g)] = 1;
        break;
      }
      // A token that changes the constraint's phase (a message's end) is the step's last: the
      // rows after it were drawn unmasked, as if the phase went on.
      if (j < n_rows - 1 && s.sp.constraint && !s.sp.constraint->stays_inactive(l.toks[r])) break;
      if (j == n_rows - 1 || l.toks[r] != s.draft[j]) break;
    }
    emitted[g] = j + 1;
    if (host)
      for (int i = 0; i < std::min(j, n_rows - 1); ++i)
        if (--s.counts[s.draft[i]] == 0) s.counts.erase(s.draft[i]);
  }
  if (!l.prompt_rows.empty()) {
    std::vector<TokenLogprob> plps(l.prompt_rows.size());
    const float* base = logits_.data() + size_t(rows) * vocab_;
#pragma omp parallel for schedule(static) if (l.prompt_rows.size() > 1)
    for (int i = 0; i < int(l.prompt_rows.size()); ++i) {
      const auto& pr = l.prompt_rows[i];
      plps[i] = compute_logprobs(base + size_t(i) * vocab_, vocab_, pr.s->tokens[pr.pos + 1], pr.s->sp.prompt_logprobs);
    }
    for (size_t i = 0; i < l.prompt_rows.size(); ++i) {
      l.prompt_rows[i].s->prompt_lps.push_back(std::move(plps[i]));
      l.prompt_rows[i].s->prompt_lp_next = l.prompt_rows[i].pos + 2;
    }
    // Prompt-logprob steps grow the host logits to ~100 MB: give that back rather than keep it.
    std::vector<float>().swap(logits_);
  }
  for (int g = 0; g < groups; ++g) {
    Sequence& s = *l.row_seq[group_first[g]];
    if (s.done) continue;
    if (host_row(group_first[g]) < 0 && !l.tokens_taken)
      s.rng.discard(emitted[g]);  // the draws launch() took from a copy
    // A refused token is drawn but not emitted: its position is computed again by the next step
    // (the rollback below) and drawn then from the masked row.
    const int n_emit = emitted[g] - redraw[size_t(g)];
    const int drafts = group_first[g + 1] - group_first[g] - 1;
    for (int j = 0; j < n_emit && !s.done; ++j) {
      const int r = group_first[g] + j;
      EngineEvent ev;
      if (no_token[size_t(r)]) {
        ev.error = "the structured output constraint allows no token";
        finish(s, ev, FinishReason::kError);
        break;
      }
      append_token(s, l.toks[r], s.sp.logprobs >= 0 ? &lps[r] : nullptr, ev, l.tokens_taken);
    }
    if (redraw[size_t(g)] && !s.done) {
      s.sp.constraint->mask_next();
      ++metrics_.constraint_redraws;
      if (!s.sp.constraint->active()) {  // a redraw it would not mask could repeat forever
        EngineEvent ev;
        ev.error = "the structured output constraint refused a token it does not mask";
        finish(s, ev, FinishReason::kError);
        continue;
      }
    }
    if (drafts > 0) {
      int accepted = 0;  // the emitted tokens that equal their drafts (all but a last bonus token)
      while (accepted < std::min(n_emit, drafts) && l.toks[group_first[g] + accepted] == s.draft[accepted]) ++accepted;
      metrics_.spec_draft_tokens += drafts;
      metrics_.spec_accepted_tokens += accepted;
      s.spec_proposed += drafts;
      s.spec_accepted += accepted;
      s.draft_len.update(drafts, accepted);
    }
    // Roll back the KV of rejected drafts (and of a refused token's row): positions from the
    // last emitted token on are recomputed by the next step (that token is its input), so K/V
    // written there for rejected drafts is never read.
    if ((drafts > 0 || redraw[size_t(g)]) && !s.done && s.num_computed > int32_t(s.tokens.size()) - 1) {
      s.num_computed = int32_t(s.tokens.size()) - 1;
      kv_->truncate(int64_t(s.id), s.num_computed);
    }
    s.draft.clear();
  }
  if (drafter_) {
    const auto d0 = Clock::now();
    commit_drafts(l);
    metrics_.spec_draft_us += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - d0).count();
  }
}

void Engine::commit_drafts(Launched& l) {
  // The Eagle3 head takes the rows of this pass whose tokens stand: position p needs the
  // target's taps at p (computed here, on the true context: rejected drafts lie past the last
  // emitted token) and the token at p + 1 (known for every p before the last token).
  const size_t width = size_t(eagle_tap_width_);
  for (size_t i = 0; i < l.items.size(); ++i) {
    Sequence& s = *l.items[i].s;
    if (s.done) {
      s.eagle.reset();
      continue;
    }
    // Drafting paused (adaptive K, drafts kept missing): the head is not run until the step
    // before the probe, whose rows restart its cache there (commit's gap rule). So a head whose
    // drafts miss costs a few rows per pause, not one per token.
    if (cfg_.speculative.adaptive && s.draft_len.pause_left() > 0) continue;
    const SeqBatchInfo& info = l.batch.seqs[i];
    const int32_t end = std::min<int32_t>(info.start_pos + info.n_tokens, int32_t(s.tokens.size()) - 1);
    if (end > info.start_pos) {
      if (!s.eagle) s.eagle = drafter_->new_seq();
      Eagle3Taps taps;
      if (l.batch.taps_on_device)
        taps.batch_token = info.first_token;
      else
        taps.host = l.taps.data() + size_t(info.first_token) * width;
      drafter_->commit(*s.eagle, info.start_pos, end - info.start_pos, s.tokens.data() + info.start_pos + 1, taps);
    }
  }
}

bool Engine::take_tokens_early(Launched& l) {
  if (l.error || !l.backend_samples || !l.kept.empty() || !l.prompt_rows.empty() || drafter_) return false;
  const size_t rows = l.row_seq.size();
  // A constrained row's token is taken when the backend drew it masked (allowed_row: it is
  // allowed), or unmasked where the constraint stays inactive after it (no redraw, no phase
  // change the drafts or the mask would have to follow).
  for (size_t r = 0; r < rows; ++r) {
    const auto& c = l.row_seq[r]->sp.constraint;
    if ((r > 0 && l.row_seq[r] == l.row_seq[r - 1]) ||
        (c && l.how[r].allowed_row < 0 && !c->stays_inactive(l.toks[r])))
      return false;
  }
  for (size_t r = 0; r < rows; ++r) {
    Sequence& s = *l.row_seq[r];
    if (s.done) continue;
    s.tokens.push_back(l.toks[r]);
    ++s.counts[l.toks[r]];  // the next plan's penalties see it (append_token does not count it again)
    // And the next plan's mask: the constraint takes it now (append_token does not again).
    s.constraint_broken = s.sp.constraint && !s.sp.constraint->accept(l.toks[r]);
    s.rng.discard(1);  // the draw launch() took from a copy
    // complete() ends it (append_token's checks, a stop string aside): no row in the next plan.
    s.ending = is_stop_token(s, l.toks[r]) || at_length_limit(s) || s.constraint_broken;
  }
  // The pages this pass wrote are offered to the prefix cache now, as complete() would offer
  // them, before the next plan's prepare() can free a sliding page below the window; an ending
  // sequence's pages go back (finish() then finds none), so the next plan has them.
  for (size_t i = 0; i < l.items.size(); ++i) {
    Sequence& s = *l.items[i].s;
    if (s.done) continue;
    commit_pages(l, i);
    if (s.ending) kv_->free(int64_t(s.id));
  }
  l.tokens_taken = true;
  last_forward_end_ = l.end;  // the next launch's host gap counts from this pass (complete() sets it again)
  return true;
}

void Engine::commit_pages(const Launched& l, size_t i) {
  if (!cfg_.enable_prefix_caching) return;
  // Only positions of known tokens that this pass computed: a verify row's drafts are not tokens
  // yet, and a pass launched since (take_tokens_early) may still be writing the next.
  const Sequence& s = *l.items[i].s;
  kv_->commit(int64_t(s.id), s.tokens.data(),
              std::min<int32_t>(l.batch.seqs[i].start_pos + l.items[i].n, int32_t(s.tokens.size())));
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
    st.kv_pages_used[g] = kv_->num_used(KvGroup(g));
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
