#pragma once
// The engine: requests queue, and a scheduler loop runs one Backend::forward at a time over a
// batch mixing prefill chunks and decode tokens of many sequences (continuous batching,
// chunked prefill under a per-step token budget), with paged KV bookkeeping (kv/), preemption
// by recompute when KV pages run out, cancellation, and host-side sampling.
//
// Scheduling is two small steps per iteration, each a pure function (engine/scheduler.h) whose
// result the engine applies afterwards:
//  1. capacity (plan_admission): admit waiting requests FCFS while max_num_seqs and the KV pages
//     not yet promised to running sequences allow;
//  2. micro-batch (plan_step): within max_num_batched_tokens, every decoding sequence gets one
//     token (oldest first; when its page cannot be had, the newest running sequence not yet in
//     this step is preempted: its pages freed, it is requeued first in line to recompute prompt
//     + output), then prefilling sequences get chunks of their remaining tokens, oldest first.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "engine/eagle3_drafter.h"
#include "engine/metrics.h"
#include "engine/sampling.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "kv/kv_manager.h"

namespace gptoss {

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

// What a request's stream receives after each step that touched it.
struct EngineEvent {
  std::vector<int32_t> tokens;          // newly generated tokens (stop tokens included)
  std::vector<TokenLogprob> logprobs;   // one per token when SamplingParams::logprobs >= 0
  // SamplingParams::prompt_logprobs >= 0: the logprobs of the prompt's tokens after the first,
  // all in the event of the first generated token (empty in later events).
  std::vector<TokenLogprob> prompt_logprobs;
  std::string text;                     // newly decoded text (stop strings cut, prefixes held back)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_string;              // the stop string that ended it, if any
  int32_t stop_token = -1;              // the stop token that ended it, if any
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;                // prompt tokens whose KV came from the prefix cache
  std::string error;                    // kError
};

// Wakes the engine loop (shared with request streams so cancel() can poke it).
struct EngineSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool pending = false;
  void notify() {
    {
      std::lock_guard<std::mutex> l(mu);
      pending = true;
    }
    cv.notify_all();
  }
};

// The consumer side of one request. Thread-safe.
class RequestStream {
 public:
  uint64_t id() const { return id_; }
  // Next event, or nullopt after `timeout` without one.
  std::optional<EngineEvent> next(std::chrono::milliseconds timeout);
  // Asks the engine to stop this request; it frees its KV pages at the next step and sends a
  // final event with FinishReason::kAbort (unless it already finished).
  void cancel();
  bool cancelled() const { return cancelled_.load(); }
  bool finished() const { return finished_.load(); }
  // Calls `fn` after each event is queued (on the engine thread: it must return at once, e.g.
  // post to an event loop), so a consumer that does not block in next() learns when to look;
  // calls it at once if events are already queued. nullptr removes it.
  void set_listener(std::function<void()> fn);

  // engine side
  RequestStream(uint64_t id, std::shared_ptr<EngineSignal> sig) : id_(id), sig_(std::move(sig)) {}
  void push(EngineEvent ev);

 private:
  uint64_t id_;
  std::shared_ptr<EngineSignal> sig_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineEvent> q_;
  std::shared_ptr<const std::function<void()>> listener_;  // under mu_
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
};

struct EngineConfig {
  int max_num_seqs = 32;
  // The token budget of one forward pass: every decoding sequence's token plus prefill chunks
  // up to this many tokens in all (stall-free batching: bounds the step time, so running
  // streams keep their pace while prompts are prefilled).
  // 0: the backend's default (Backend::default_max_num_batched_tokens: 8192 on a large GPU,
  // else 2048), raised to max_num_seqs where that is more (`serve` passes 0 unless told).
  int max_num_batched_tokens = 2048;
  int max_model_len = 0;          // 0: the model's max_position_embeddings, lowered to what the KV
                                  // pool holds; an explicit one above either is refused (Error)
  int64_t kv_cache_tokens = 0;    // full-attention positions in the pool; 0: from the backend's
                                  // memory, or max_num_seqs * max_model_len (at most 256K positions
                                  // and ~1 GiB, at least one explicit max_model_len) when it has no
                                  // limit. An explicit one too small for max_model_len is refused.
  size_t kv_cache_bytes = 0;      // memory for the KV cache when kv_cache_tokens is 0 (0: the backend's kv_memory_available())
  int page_size = 16;
  std::vector<int32_t> stop_token_ids;  // end tokens for every request (harmony <|return|>, <|call|>, eos)
  // Bytes of a token's text ("" for special or unknown ids); null: no text and no stop strings.
  std::function<std::string(int32_t)> token_text;
  // Deterministic mode (`--batch-invariant`): a row's token must not depend on its batch
  // companions. The backend is asked for batch-invariant kernels (BackendOptions); the engine
  // draws every non-greedy row on the host (see Engine::launch).
  bool batch_invariant = false;
  // `--async-scheduling`: the loop started by start() runs forward N on a worker thread; at
  // its join N's drawn ids are appended, step N+1 is planned and launched, and N's bookkeeping
  // (logprobs, detokenization, stop strings, events) runs while N+1 is on the device (see
  // docs/ARCHITECTURE.md). On by default (`--no-async-scheduling`: the synchronous loop, each
  // pass's bookkeeping before the next is planned). step() is always synchronous.
  bool async_scheduling = true;
  // Test-only fault injection: a step that would sample a request's Nth output token throws
  // instead (as a failing backend would), so tests reach the error paths. 0: off. The engine
  // also takes it from the environment variable GPTOSS_TEST_FAIL_AT_OUTPUT_TOKEN.
  int test_fail_at_output_token = 0;
  // `--enable-prefix-caching` (default) / `--no-enable-prefix-caching`: completed KV pages are
  // kept, keyed by their token prefix, and a request whose prompt starts with a cached prefix
  // starts its prefill after it (kv/prefix_cache.h). Requests asking for prompt logprobs always
  // compute their whole prompt.
  bool enable_prefix_caching = true;
  // `--speculative-config`: n-gram (prompt lookup) or Eagle3 drafts verified K + 1 rows at a time per
  // decoding sequence (engine/speculative.h explains why the output is unchanged). With
  // async_scheduling a verify pass completes before the next is planned (its accepted length
  // decides the next rows).
  SpeculativeConfig speculative;
};

struct EngineStats {
  int running = 0;
  int waiting = 0;
  double kv_usage = 0;  // fraction of the fuller pool in use
  int kv_pages_used[2] = {0, 0};
  int kv_pages_total[2] = {0, 0};
};

class Engine {
 public:
  // `backend` must outlive the engine; the engine (re)initializes its KV cache.
  Engine(Backend& backend, EngineConfig cfg);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the scheduler loop on a thread until stop().
  void start();
  // Stops the loop; unfinished requests end with kAbort.
  void stop();

  // Queues a request. Throws gptoss::Error on an empty prompt, a prompt of max_model_len or
  // more tokens, token ids outside the vocabulary, or max_tokens < 1.
  std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt, const SamplingParams& sp);

  // Without start(): runs one scheduler iteration on the caller's thread; false when idle.
  bool step();

  int max_model_len() const { return max_model_len_; }
  int vocab() const { return vocab_; }
  // The backend's decode batch buckets (Backend::decode_batch_buckets), for the warm-up.
  std::vector<int> decode_batch_buckets() const { return backend_.decode_batch_buckets(); }
  const EngineConfig& config() const { return cfg_; }
  EngineStats stats() const;
  EngineMetrics& metrics() { return metrics_; }
  // Where the Eagle3 draft step runs ("host", "cuda"); empty without an Eagle3 head.
  std::string eagle3_head_where() const { return drafter_ ? drafter_->where() : std::string(); }
  int num_active() const { return active_.load(); }  // submitted and not yet finished
  const KvManagerConfig& kv_config() const { return kv_->config(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Sequence {
    uint64_t id = 0;
    std::shared_ptr<RequestStream> stream;
    std::vector<int32_t> tokens;  // prompt then output
    int prompt_len = 0;
    int32_t num_computed = 0;     // positions whose KV is cached
    int32_t prompt_counted = 0;   // prompt positions counted in metrics (not again on recompute)
    int32_t cached_tokens = -1;   // prompt tokens found in the prefix cache at first admission
    SamplingParams sp;
    std::mt19937_64 rng;
    std::unordered_map<int32_t, int> counts;
    int32_t prompt_lp_next = 1;   // next prompt token whose logprob is still to compute
    std::vector<TokenLogprob> prompt_lps;  // computed, sent with the first generated token
    std::string text;             // decoded output
    size_t text_sent = 0;
    Clock::time_point arrival, last_token;
    bool got_first = false;
    bool done = false;            // finished (dropped from the queues by drop_finished)
    // Forward passes holding it: at most two, when async scheduling launches N+1 before N's
    // bookkeeping (take_tokens_early).
    int in_flight = 0;
    bool ending = false;          // its last token (taken early) ends it when its pass completes
    // Its last token, taken early, was refused by its constraint's accept() (a bug): complete() ends it.
    bool constraint_broken = false;
    std::vector<int32_t> draft;   // speculative drafts verified by the pass planned/in flight
    AdaptiveDraftLength draft_len;
    int64_t spec_proposed = 0, spec_accepted = 0;  // its drafts verified so far, and accepted
    std::unique_ptr<Eagle3Head::Seq> eagle;  // the Eagle3 head's cache for this sequence (method eagle3; null: nothing committed)
    int output_len() const { return int(tokens.size()) - prompt_len; }
  };
  void loop();
  void drain_incoming();
  // One step in four parts: plan_next (admission, micro-batch plan, pages) -> launch (the
  // batch, owning copies of its page tables) -> run_forward (the backend call; on the worker
  // when overlapped) -> complete (sampling, tokens, streams).
  struct Planned {
    struct Item {
      Sequence* s;
      int32_t n;
    };
    std::vector<Item> items;
  };
  struct Launched {
    std::vector<Planned::Item> items;
    std::vector<Sequence*> row_seq;  // the sequence of each sampled logit row (1 + drafts rows in a row)
    ForwardBatch batch;
    std::vector<float> taps;  // the target's hidden-state taps for a host Eagle3 head (a device head keeps them on the device)
    std::vector<std::vector<int32_t>> tables;  // page tables the batch points into
    std::vector<RowSampling> how;
    // The logit changes (logit_bias, penalties) of rows the backend draws itself, which how[r]
    // indexes (Backend::applies_logit_changes).
    std::vector<LogitAdd> adds;
    // The allowed-token masks of the masked rows the backend draws ([masks][allowed_words(vocab)]),
    // which how[r].allowed_row indexes.
    std::vector<uint64_t> allowed;
    // backend_samples with rows it may not draw: row r's index among the rows whose logits the
    // backend kept for the host (logits_), -1 for a row it drew; empty when it drew every row.
    std::vector<int32_t> kept;
    std::vector<int32_t> toks;
    // backend_samples with a row asking for its token's logprob: the backend's logprob of each
    // drawn token (Backend::forward_sample), else empty; with a row asking for a top list, each
    // row's list (tops[r], its first top_logprobs entries).
    std::vector<float> lps;
    std::vector<TopLogprobs> tops;
    struct PromptRow {  // a prompt-logprob row: logits at `pos` score prompt token pos + 1
      Sequence* s;
      int32_t pos, batch_index;
    };
    std::vector<PromptRow> prompt_rows;  // logit rows after the sampled ones
    bool backend_samples = false;
    int64_t prompt_tokens = 0;
    bool decode_only = true;  // every row one decoding sequence's token (+ its drafts): a cost sample
    Clock::time_point begin, end;
    std::exception_ptr error;
    bool tokens_taken = false;  // take_tokens_early appended the drawn ids before complete()
  };
  bool begin_iteration();
  Planned plan_next();
  // Speculative decoding's cost gate: trims the drafts of `plan` (rows of `seqs`, their scheduler
  // view `view`) to those worth their pass's cost (drafts_worth_verifying).
  void gate_drafts_by_cost(const std::vector<Sequence*>& seqs, const std::vector<SchedSeq>& view, StepPlan& plan);
  std::unique_ptr<Launched> launch(Planned planned);
  void run_forward(Launched& l);
  void complete(Launched& l);
  void commit_drafts(Launched& l);  // feeds the Eagle3 head the rows that stand (method eagle3)
  void fail_running(const std::string& what);
  void drop_finished();
  // Events are queued while a step is worked out and pushed to their streams by flush_outbox,
  // after the next forward is launched when overlapped.
  void flush_outbox();
  void worker_main();
  void worker_submit(Launched* job);
  void worker_wait();
  void finish(Sequence& s, EngineEvent& ev, FinishReason r);
  // Async scheduling: appends a finished pass's drawn ids to their sequences (and advances their
  // generators), nothing else, so the next pass can launch before complete() does the rest.
  // Only for passes the backend sampled, one row a sequence, no constraint; false: not taken.
  // Marks `ending` the sequences whose new token ends them (stop token, max_tokens, max_model_len).
  bool take_tokens_early(Launched& l);
  bool is_stop_token(const Sequence& s, int32_t tok) const;
  // Its tokens reach max_tokens or max_model_len (append_token ends it with kLength).
  bool at_length_limit(const Sequence& s) const;
  // Offers the KV pages that pass l wrote for its item i to the prefix cache (KvManager::commit).
  void commit_pages(const Launched& l, size_t i);
  // appended: tok is already the last of s.tokens (take_tokens_early).
  void append_token(Sequence& s, int32_t tok, TokenLogprob* lp, EngineEvent& ev, bool appended = false);
  size_t safe_text_end(const Sequence& s) const;
  void publish_stats();

  Backend& backend_;
  EngineConfig cfg_;
  int vocab_ = 0;
  int max_model_len_ = 0;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<Eagle3Head> drafter_;  // method eagle3: the backend's own head, or the host one
  std::vector<int32_t> eagle_taps_;       // the target layers it reads (ForwardBatch::tap_layers)
  int eagle_tap_width_ = 0;               // floats of taps a token
  std::shared_ptr<EngineSignal> sig_ = std::make_shared<EngineSignal>();
  std::mutex in_mu_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  std::deque<std::unique_ptr<Sequence>> waiting_;   // engine thread only
  std::vector<std::unique_ptr<Sequence>> running_;  // engine thread only, admission order
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  std::vector<float> logits_;  // host logits of the pass being completed (reused)
  std::vector<std::pair<std::shared_ptr<RequestStream>, EngineEvent>> outbox_;  // engine thread only
  // Event delivery off the engine thread while the loop started by start() runs: flush_outbox
  // hands a step's events to this thread, which pushes them to their streams while the engine
  // plans and runs the next pass. Each push takes the stream's lock and wakes its consumer (the
  // HTTP layer posts to the connection's executor): ~5 us an event, at 64 streams the largest
  // part of the host time between two GPU passes when done in line. One thread, first in first
  // out, so each stream keeps its order. step() called directly (tests) pushes at once.
  void push_events(std::vector<std::pair<std::shared_ptr<RequestStream>, EngineEvent>>& evs);
  void deliver_main();
  std::thread deliver_;
  std::mutex deliver_mu_;
  std::condition_variable deliver_cv_;
  std::vector<std::pair<std::shared_ptr<RequestStream>, EngineEvent>> deliver_q_;  // under deliver_mu_
  bool deliver_quit_ = false;                                                      // under deliver_mu_
  bool deliver_async_ = false;  // engine thread: hand events to deliver_ (set while the loop runs)
  std::thread thread_;
  std::thread worker_;
  std::mutex worker_mu_;
  std::condition_variable worker_cv_;
  std::atomic<Launched*> worker_job_{nullptr};  // set by the engine, cleared by the worker when done
  std::atomic<bool> worker_quit_{false};
  // End of the previous forward pass while the engine stayed busy (host-time metric).
  std::optional<Clock::time_point> last_forward_end_;
  std::mt19937_64 seed_rng_{std::random_device{}()};
  std::mutex seed_mu_;
  mutable std::mutex stats_mu_;
  EngineStats stats_;
  EngineMetrics metrics_;
  PassCostModel pass_cost_;  // decode/verify pass times by token count (speculative cost gate)
};

}  // namespace gptoss
