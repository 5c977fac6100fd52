#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/warm_up.h"
#include "fake_backend.h"

using namespace gptoss;
using gptoss::testing::FakeBackend;

namespace {

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  int prompt_tokens = 0, completion_tokens = 0;
  std::string stop_string;
  int32_t stop_token = -1;
  std::vector<TokenLogprob> logprobs;
};

Result collect(RequestStream& s) {
  Result r;
  for (int i = 0; i < 100000; ++i) {
    auto ev = s.next(std::chrono::milliseconds(5000));
    if (!ev) {
      ADD_FAILURE() << "timed out waiting for an event";
      return r;
    }
    r.tokens.insert(r.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    r.logprobs.insert(r.logprobs.end(), ev->logprobs.begin(), ev->logprobs.end());
    r.text += ev->text;
    if (ev->finished) {
      r.reason = ev->finish_reason;
      r.prompt_tokens = ev->prompt_tokens;
      r.completion_tokens = ev->completion_tokens;
      r.stop_string = ev->stop_string;
      r.stop_token = ev->stop_token;
      return r;
    }
  }
  ADD_FAILURE() << "no end";
  return r;
}

void run_idle(Engine& e) {
  for (int i = 0; i < 1000000 && e.step(); ++i) {
  }
}

std::vector<int32_t> prompt_of(int len, int salt, int vocab = 64) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back((i * 7 + salt * 13 + 1) % (vocab - 2));
  return p;
}

std::string letter(int32_t t) { return std::string(1, char('a' + t % 26)); }

EngineConfig small_cfg() {
  EngineConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 16;
  c.page_size = 4;
  c.kv_cache_tokens = 4096;
  c.max_model_len = 512;
  return c;
}

// host_adds: on a backend that applies no logit changes (penalties and logit_bias drawn on the host).
Result run_alone(const std::vector<int32_t>& prompt, const SamplingParams& sp, EngineConfig cfg = small_cfg(),
                 bool host_adds = false) {
  FakeBackend be;
  be.applies_adds = !host_adds;
  cfg.max_num_seqs = 1;
  Engine e(be, cfg);
  auto s = e.submit(prompt, sp);
  run_idle(e);
  return collect(*s);
}

}  // namespace

TEST(Engine, SingleGreedyRequest) {
  FakeBackend be;
  Engine e(be, small_cfg());
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 10;
  auto s = e.submit(prompt_of(5, 1), sp);
  run_idle(e);
  Result r = collect(*s);
  EXPECT_EQ(r.reason, FinishReason::kLength);
  EXPECT_EQ(r.tokens.size(), 10u);
  EXPECT_EQ(r.completion_tokens, 10);
  EXPECT_EQ(r.prompt_tokens, 5);
  EXPECT_EQ(e.stats().kv_pages_used[0], 0);
  EXPECT_EQ(e.stats().kv_pages_used[1], 0);
  EXPECT_EQ(e.num_active(), 0);
}

TEST(Engine, RejectsBadRequests) {
  FakeBackend be;
  Engine e(be, small_cfg());
  SamplingParams sp;
  EXPECT_THROW(e.submit({}, sp), Error);
  EXPECT_THROW(e.submit(prompt_of(512, 1), sp), Error);
  EXPECT_THROW(e.submit({1, 2, 64}, sp), Error);
  EXPECT_THROW(e.submit({1, 2, -1}, sp), Error);
  sp.max_tokens = 0;
  EXPECT_THROW(e.submit({1, 2}, sp), Error);
}

TEST(Engine, BudgetHoldsEveryDecode) {
  FakeBackend be;
  EngineConfig c = small_cfg();
  c.max_num_seqs = 17;  // budget 16
  EXPECT_THROW(Engine(be, c), Error);
  c.max_num_seqs = 16;
  EXPECT_NO_THROW(Engine(be, c));
}

// A budget of 0 takes the backend's default (serve passes 0 unless --max-num-batched-tokens is
// given), raised to max_num_seqs where that is more.
TEST(Engine, BudgetZeroTakesTheBackendDefault) {
  FakeBackend be;
  EngineConfig c = small_cfg();
  c.max_num_batched_tokens = 0;
  c.kv_cache_tokens = 1 << 16;
  EXPECT_EQ(Engine(be, c).config().max_num_batched_tokens, be.default_max_num_batched_tokens());
  be.default_budget = 8192;
  EXPECT_EQ(Engine(be, c).config().max_num_batched_tokens, 8192);
  c.max_num_seqs = 9000;
  EXPECT_EQ(Engine(be, c).config().max_num_batched_tokens, 9000);
}

TEST(Engine, StopsAtMaxModelLen) {
  FakeBackend be;
  EngineConfig c = small_cfg();
  c.max_model_len = 20;
  Engine e(be, c);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 1000;
  sp.ignore_eos = true;
  auto s = e.submit(prompt_of(15, 2), sp);
  run_idle(e);
  Result r = collect(*s);
  EXPECT_EQ(r.reason, FinishReason::kLength);
  EXPECT_EQ(r.completion_tokens, 5);
}

// Many requests of mixed lengths, greedy and seeded sampling, at max_num_seqs 4 and a 16-token
// budget (chunked prefill): each must produce what it produces alone.
TEST(Engine, BatchedEqualsAlone) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> sps;
  for (int i = 0; i < 20; ++i) {
    prompts.push_back(prompt_of(1 + (i * 11) % 45, i));
    SamplingParams sp;
    sp.max_tokens = 5 + (i * 7) % 30;
    sp.ignore_eos = true;
    if (i % 2) {
      sp.temperature = 0;
    } else {
      sp.temperature = 0.9f;
      sp.top_p = 0.95f;
      sp.seed = 1000 + i;
    }
    sps.push_back(sp);
  }
  FakeBackend be;
  Engine e(be, small_cfg());
  std::vector<std::shared_ptr<RequestStream>> ss;
  for (int i = 0; i < 20; ++i) ss.push_back(e.submit(prompts[i], sps[i]));
  run_idle(e);
  EXPECT_LE(be.max_batch_tokens, 16);
  EXPECT_LE(be.max_batch_seqs, 4);
  EXPECT_GT(be.max_batch_seqs, 1);
  for (int i = 0; i < 20; ++i) {
    Result r = collect(*ss[i]);
    Result alone = run_alone(prompts[i], sps[i]);
    EXPECT_EQ(r.tokens, alone.tokens) << i;
    EXPECT_EQ(int(r.tokens.size()), sps[i].max_tokens);
  }
  EXPECT_EQ(e.stats().kv_pages_used[0], 0);
}

TEST(Engine, PreemptionWhenKvRunsOut) {
  EngineConfig c = small_cfg();
  c.kv_cache_tokens = 96;  // 24 pages of 4: not enough for 4 sequences of ~60 positions
  c.max_model_len = 90;
  std::vector<std::vector<int32_t>> prompts;
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 50;
  sp.ignore_eos = true;
  FakeBackend be;
  Engine e(be, c);
  std::vector<std::shared_ptr<RequestStream>> ss;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(prompt_of(10 + i, i));
    ss.push_back(e.submit(prompts.back(), sp));
  }
  run_idle(e);
  EXPECT_GT(e.metrics().preemptions.load(), 0);
  for (int i = 0; i < 6; ++i) {
    Result r = collect(*ss[i]);
    EXPECT_EQ(r.tokens, run_alone(prompts[i], sp, c).tokens) << i;
    EXPECT_EQ(r.completion_tokens, 50);
  }
  EXPECT_EQ(e.stats().kv_pages_used[0], 0);
  EXPECT_EQ(e.stats().kv_pages_used[1], 0);
}

TEST(Engine, SeededSamplingSurvivesPreemption) {
  EngineConfig c = small_cfg();
  c.kv_cache_tokens = 96;
  c.max_model_len = 90;
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 20;
  sp.max_tokens = 50;
  sp.ignore_eos = true;
  FakeBackend be;
  Engine e(be, c);
  std::vector<std::shared_ptr<RequestStream>> ss;
  std::vector<SamplingParams> sps;
  for (int i = 0; i < 6; ++i) {
    SamplingParams x = sp;
    x.seed = 77 + i;
    sps.push_back(x);
    ss.push_back(e.submit(prompt_of(10 + i, i), x));
  }
  run_idle(e);
  EXPECT_GT(e.metrics().preemptions.load(), 0);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(collect(*ss[i]).tokens, run_alone(prompt_of(10 + i, i), sps[i], c).tokens) << i;
}

TEST(Engine, CancelFreesSlot) {
  FakeBackend be;
  EngineConfig c = small_cfg();
  c.max_num_seqs = 1;
  Engine e(be, c);
  SamplingParams sp;
  sp.max_tokens = 400;
  sp.ignore_eos = true;
  auto a = e.submit(prompt_of(5, 1), sp);
  auto b = e.submit(prompt_of(5, 2), sp);
  for (int i = 0; i < 5; ++i) e.step();
  EXPECT_EQ(e.stats().running, 1);
  EXPECT_EQ(e.stats().waiting, 1);
  a->cancel();
  e.step();
  auto ra = collect(*a);
  EXPECT_EQ(ra.reason, FinishReason::kAbort);
  EXPECT_EQ(e.stats().running, 1);  // b took the slot
  EXPECT_EQ(e.stats().waiting, 0);
  b->cancel();
  run_idle(e);
  EXPECT_EQ(collect(*b).reason, FinishReason::kAbort);
  EXPECT_EQ(e.stats().kv_pages_used[0], 0);
  EXPECT_EQ(e.num_active(), 0);
}

TEST(Engine, StopTokenAndStopStrings) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 30;
  sp.ignore_eos = true;
  EngineConfig c = small_cfg();
  c.token_text = letter;
  Result base = run_alone(prompt_of(6, 3), sp, c);
  ASSERT_EQ(base.tokens.size(), 30u);
  ASSERT_EQ(base.text.size(), 30u);
  // stop token: the 5th generated token
  SamplingParams st = sp;
  st.stop_token_ids = {base.tokens[4]};
  Result r = run_alone(prompt_of(6, 3), st, c);
  size_t first = std::find(base.tokens.begin(), base.tokens.end(), base.tokens[4]) - base.tokens.begin();
  EXPECT_EQ(r.reason, FinishReason::kStop);
  EXPECT_EQ(r.stop_token, base.tokens[4]);
  EXPECT_EQ(r.tokens.size(), first + 1);
  EXPECT_EQ(r.text, base.text.substr(0, first));  // the stop token's text is not output
  // engine-wide end token
  EngineConfig c2 = c;
  c2.stop_token_ids = {base.tokens[4]};
  SamplingParams noign = sp;
  noign.ignore_eos = false;
  EXPECT_EQ(run_alone(prompt_of(6, 3), noign, c2).tokens.size(), first + 1);
  // stop string spanning tokens 10..12
  SamplingParams ss = sp;
  std::string stop = base.text.substr(10, 3);
  ss.stop = {"zzzzzzzzzz", stop};
  Result rs = run_alone(prompt_of(6, 3), ss, c);
  size_t pos = base.text.find(stop);
  EXPECT_EQ(rs.reason, FinishReason::kStop);
  EXPECT_EQ(rs.stop_string, stop);
  EXPECT_EQ(rs.text, base.text.substr(0, pos));
  EXPECT_EQ(rs.tokens.size(), pos + 3);
  // streaming never emits text that the stop string later cuts
  FakeBackend be;
  Engine e(be, c);
  auto s = e.submit(prompt_of(6, 3), ss);
  run_idle(e);
  std::string streamed;
  for (int i = 0; i < 100; ++i) {
    auto ev = s->next(std::chrono::milliseconds(1000));
    ASSERT_TRUE(ev);
    streamed += ev->text;
    EXPECT_EQ(base.text.substr(0, streamed.size()), streamed);
    if (ev->finished) break;
  }
  EXPECT_EQ(streamed, base.text.substr(0, pos));
}

TEST(Engine, Logprobs) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 4;
  sp.logprobs = 3;
  Result r = run_alone(prompt_of(6, 4), sp);
  ASSERT_EQ(r.logprobs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.logprobs[i].token, r.tokens[i]);
    ASSERT_EQ(r.logprobs[i].top.size(), 3u);
    EXPECT_EQ(r.logprobs[i].top[0].first, r.tokens[i]);  // greedy = best
    EXPECT_LE(r.logprobs[i].logprob, 0.0f);
  }
}

// The engine's own loop (start()) under 32 client threads, synchronous and async scheduling.
TEST(Engine, ThreadedManyClients) {
  for (bool async : {false, true}) {
    FakeBackend be;
    EngineConfig c = small_cfg();
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 64;
    c.async_scheduling = async;
    Engine e(be, c);
    e.start();
    const int N = 32;
    std::vector<Result> res(N);
    std::vector<std::thread> th;
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 12;
    sp.ignore_eos = true;
    for (int i = 0; i < N; ++i)
      th.emplace_back([&, i] {
        auto s = e.submit(prompt_of(3 + i % 20, i), sp);
        res[i] = collect(*s);
      });
    for (auto& t : th) t.join();
    for (int i = 0; i < N; ++i) {
      EXPECT_EQ(res[i].tokens, run_alone(prompt_of(3 + i % 20, i), sp).tokens) << i << (async ? " async" : "");
    }
    e.stop();
    EXPECT_EQ(e.num_active(), 0);
  }
}

TEST(Engine, StopAbortsPending) {
  FakeBackend be;
  Engine e(be, small_cfg());
  SamplingParams sp;
  sp.max_tokens = 400;
  sp.ignore_eos = true;
  auto a = e.submit(prompt_of(5, 1), sp);
  e.step();
  e.stop();
  EXPECT_EQ(collect(*a).reason, FinishReason::kAbort);
}

TEST(Engine, KvCacheBytesBudget) {
  FakeBackend be;
  EngineConfig c = small_cfg();
  c.kv_cache_tokens = 0;
  c.kv_cache_bytes = size_t(1) << 20;
  Engine e(be, c);
  const auto& kc = e.kv_config();
  size_t used = size_t(kc.num_pages[0]) * kv_page_bytes(be.config(), kKvFull, c.page_size, DType::BF16) +
                size_t(kc.num_pages[1]) * kv_page_bytes(be.config(), kKvSliding, c.page_size, DType::BF16);
  EXPECT_LE(used, c.kv_cache_bytes);
  EXPECT_GT(kc.num_pages[0], 100);
}

// Rows that need no logits on the host let the backend draw the tokens (forward_sample), and
// a request asking only for its tokens' logprobs (no top list) takes them from the backend too
// where it gives them (Backend::samples_logprobs); top logprobs or penalties keep sampling on the
// host. A seeded request gets the same tokens every way, and the same logprobs.
TEST(Engine, BackendSamplesUnlessLogitsAreNeeded) {
  for (float temperature : {0.0f, 0.9f}) {
    SamplingParams plain;
    plain.temperature = temperature;
    plain.top_p = 0.9f;
    plain.seed = 11;
    plain.max_tokens = 6;
    SamplingParams with_lp = plain;
    with_lp.logprobs = 0;
    SamplingParams with_top = plain;
    with_top.logprobs = 1;
    auto prompt = prompt_of(7, 3);
    auto run = [&](FakeBackend& be, const SamplingParams& sp) {
      Engine e(be, small_cfg());
      auto s = e.submit(prompt, sp);
      run_idle(e);
      return collect(*s);
    };
    FakeBackend a, b, c, d, f;
    d.sampled_logprobs = false;  // as a tensor-parallel group
    f.samples_top = false;       // a backend that gives no top lists
    const Result ra = run(a, plain), rb = run(b, with_lp), rc = run(c, with_top), rd = run(d, with_lp),
                 rf = run(f, with_top);
    EXPECT_EQ(a.sample_calls, 6) << temperature;
    EXPECT_EQ(b.sample_calls, 6) << temperature;
    EXPECT_EQ(c.sample_calls, 6) << temperature;  // the top list from the backend
    EXPECT_EQ(d.sample_calls, 0) << temperature;
    EXPECT_EQ(f.sample_calls, 0) << temperature;  // on the host
    EXPECT_EQ(rc.tokens, rf.tokens) << temperature;
    ASSERT_EQ(rf.logprobs.size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(rc.logprobs[i].logprob, rf.logprobs[i].logprob) << i;
      EXPECT_EQ(rc.logprobs[i].top, rf.logprobs[i].top) << i;
    }
    EXPECT_EQ(ra.tokens, rb.tokens) << temperature;
    EXPECT_EQ(ra.tokens, rc.tokens) << temperature;
    EXPECT_EQ(ra.tokens, rd.tokens) << temperature;
    ASSERT_EQ(rb.logprobs.size(), 6u);
    ASSERT_EQ(rc.logprobs.size(), 6u);
    ASSERT_EQ(rd.logprobs.size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(rb.logprobs[i].token, ra.tokens[i]);
      EXPECT_EQ(rb.logprobs[i].logprob, rc.logprobs[i].logprob) << i;  // the same row_logsumexp
      EXPECT_EQ(rd.logprobs[i].logprob, rc.logprobs[i].logprob) << i;
      EXPECT_LT(rb.logprobs[i].logprob, 0.0f);
      EXPECT_TRUE(rb.logprobs[i].top.empty());
      EXPECT_EQ(rc.logprobs[i].top.size(), 1u);
    }
  }
}

// A batch mixing rows the backend may draw with rows that need their logits on the host (top
// logprobs past kMaxTopLogprobs; top logprobs, penalties and logit_bias on a backend that gives
// no top lists and applies no logit changes): the backend draws the former and keeps only the
// latter's logits for the host (Backend::keeps_logits), or, on a backend that keeps none, every
// row is drawn on the host. A backend that applies logit changes and gives top lists
// (Backend::applies_logit_changes, samples_top_logprobs) draws the penalized, biased and top-list
// rows itself. Each request's tokens and logprobs equal those it gets alone, every way.
TEST(Engine, MixedBatchKeepsOnlyTheHostRowsLogits) {
  for (bool keeps : {true, false})
    for (bool adds : {true, false})
      for (int async = 0; async < 2; ++async) {
        std::vector<SamplingParams> sps(5);
        for (size_t i = 0; i < sps.size(); ++i) {
          sps[i].temperature = i % 2 ? 0.8f : 0.0f;
          sps[i].seed = 21 + i;
          sps[i].max_tokens = 12;
          sps[i].ignore_eos = true;  // every request's 12 rows
        }
        sps[1].presence_penalty = 0.7f;
        sps[2].logprobs = 2;
        sps[3].logit_bias = {{5, 3.0f}};
        sps[4].logprobs = kMaxTopLogprobs + 5;  // on the host whatever the backend gives
        FakeBackend be;
        be.keeps_rows = keeps;
        be.applies_adds = adds;
        be.samples_top = adds;
        EngineConfig cfg = small_cfg();
        cfg.async_scheduling = async;
        cfg.max_num_seqs = 5;  // all at once
        Engine e(be, cfg);
        std::vector<std::shared_ptr<RequestStream>> streams;
        for (size_t i = 0; i < sps.size(); ++i) streams.push_back(e.submit(prompt_of(6 + int(i), 5 + int(i)), sps[i]));
        if (async) e.start();
        else run_idle(e);
        const std::string how = std::string(keeps ? " kept rows" : " all on the host") + (adds ? ", adds" : "") +
                                (async ? ", async" : "");
        for (size_t i = 0; i < sps.size(); ++i) {
          Result r = collect(*streams[i]);
          Result alone = run_alone(prompt_of(6 + int(i), 5 + int(i)), sps[i]);
          EXPECT_EQ(r.tokens, alone.tokens) << "request " << i << how;
          ASSERT_EQ(r.logprobs.size(), alone.logprobs.size());
          for (size_t j = 0; j < r.logprobs.size(); ++j) {
            EXPECT_EQ(r.logprobs[j].logprob, alone.logprobs[j].logprob) << i;
            EXPECT_EQ(r.logprobs[j].top, alone.logprobs[j].top) << i;
          }
        }
        e.stop();
        const int host_requests = adds ? 1 : 4;  // 25 top logprobs always; the others on a backend without
        if (keeps) {
          EXPECT_GT(be.sample_calls, 0) << how;
          // The host requests' rows, in the steps that also hold a request the backend draws (a
          // step of host rows alone is drawn on the host whole).
          EXPECT_GT(be.kept_rows, adds ? 6 : 12) << how;
          EXPECT_LE(be.kept_rows, host_requests * 12) << how;
        } else {
          EXPECT_EQ(be.kept_rows, 0) << how;
        }
        // With adds, the penalized, biased and top-list requests' rows are the backend's wherever it draws.
        if (adds && keeps) {
          EXPECT_GE(be.adjusted_rows, 11) << how;
          EXPECT_GE(be.top_rows, 11) << how;
        } else if (!adds) {
          EXPECT_EQ(be.adjusted_rows, 0) << how;
          EXPECT_EQ(be.top_rows, 0) << how;
        }
      }
}

// Prompt logprobs (completions echo): one per prompt token after the first, each the
// log-softmax at the position before it, all sent once although the prompt is prefilled in
// chunks over several steps.
TEST(Engine, PromptLogprobs) {
  const std::vector<int32_t> prompt = prompt_of(40, 9);  // budget 16: three prefill chunks
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 3;
  sp.prompt_logprobs = 2;
  FakeBackend be;
  Engine e(be, small_cfg());
  auto s = e.submit(prompt, sp);
  std::vector<TokenLogprob> plps;
  int events_with_prompt_lps = 0;
  run_idle(e);
  for (int i = 0; i < 10; ++i) {
    auto ev = s->next(std::chrono::milliseconds(1000));
    ASSERT_TRUE(ev);
    if (!ev->prompt_logprobs.empty()) ++events_with_prompt_lps;
    plps.insert(plps.end(), ev->prompt_logprobs.begin(), ev->prompt_logprobs.end());
    if (ev->finished) break;
  }
  EXPECT_EQ(events_with_prompt_lps, 1);
  ASSERT_EQ(plps.size(), prompt.size() - 1);
  for (size_t k = 1; k < prompt.size(); k += 5) {
    EXPECT_EQ(plps[k - 1].token, prompt[k]);
    // The distribution after prompt[0..k): what a request for that prefix sees first.
    SamplingParams one;
    one.temperature = 0;
    one.max_tokens = 1;
    one.logprobs = 2;
    Result r = run_alone(std::vector<int32_t>(prompt.begin(), prompt.begin() + k), one);
    ASSERT_EQ(r.logprobs.size(), 1u);
    EXPECT_EQ(plps[k - 1].top, r.logprobs[0].top) << k;
  }
  // The sampled tokens do not change.
  SamplingParams plain = sp;
  plain.prompt_logprobs = -1;
  EXPECT_EQ(run_alone(prompt, sp).tokens, run_alone(prompt, plain).tokens);
}

// logit_bias honoured on either path: a backend that applies logit changes draws the row itself
// (every pass a forward_sample with the row's entries); one that does not leaves it to the host
// (no forward_sample at all: the request is its pass's only row).
TEST(Engine, LogitBiasOnEitherPath) {
  for (bool adds : {true, false}) {
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 4;
    sp.logit_bias = {{5, 100.0f}};
    FakeBackend be;
    be.applies_adds = adds;
    EngineConfig cfg = small_cfg();
    Engine e(be, cfg);
    auto s = e.submit(prompt_of(6, 2), sp);
    run_idle(e);
    Result r = collect(*s);
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{5, 5, 5, 5})) << adds;
    EXPECT_EQ(be.sample_calls, adds ? 4 : 0) << adds;
    EXPECT_EQ(be.adjusted_rows, adds ? 4 : 0) << adds;
    sp.logit_bias = {{64, 1.0f}};
    EXPECT_THROW(e.submit(prompt_of(6, 2), sp), Error);  // outside the vocabulary
  }
}

namespace {
// Events a stream has ready now (the engine ran synchronously through step()).
std::vector<EngineEvent> ready_events(RequestStream& s) {
  std::vector<EngineEvent> out;
  while (auto ev = s.next(std::chrono::milliseconds(0))) out.push_back(std::move(*ev));
  return out;
}
}  // namespace

// Stall-free batching: while a long prompt is prefilled in budget-sized chunks, every decoding
// stream still gets exactly one token per step.
TEST(Engine, LongPromptDoesNotStallDecodes) {
  FakeBackend be;
  Engine e(be, small_cfg());  // budget 16
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 200;
  sp.ignore_eos = true;
  std::vector<std::shared_ptr<RequestStream>> dec;
  for (int i = 0; i < 3; ++i) dec.push_back(e.submit(prompt_of(3, i), sp));
  for (int i = 0; i < 2; ++i) e.step();
  for (auto& s : dec) ASSERT_FALSE(ready_events(*s).empty());
  SamplingParams one = sp;
  one.max_tokens = 1;
  auto longp = e.submit(prompt_of(200, 9), one);
  int steps = 0;
  while (!longp->finished() && steps < 100) {
    ASSERT_TRUE(e.step());
    ++steps;
    for (auto& s : dec) {
      auto evs = ready_events(*s);
      ASSERT_EQ(evs.size(), 1u) << "step " << steps;
      EXPECT_EQ(evs[0].tokens.size(), 1u);
    }
  }
  // 200 prompt tokens at 16 - 3 a step
  EXPECT_EQ(steps, (200 + 12) / 13);
  EXPECT_LE(be.max_batch_tokens, 16);
  for (auto& s : dec) s->cancel();
  run_idle(e);
}

// 8 prompts of 40 tokens arrive at once under a 64-token budget: prefills are packed FCFS, so
// first tokens come one or two requests a step (median at step 4), where sharing the budget
// among all eight would give none before step 5.
TEST(Engine, SimultaneousPromptsGetFirstTokensInTurn) {
  FakeBackend be;
  EngineConfig c = small_cfg();
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  Engine e(be, c);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 4;
  sp.ignore_eos = true;
  std::vector<std::shared_ptr<RequestStream>> ss;
  for (int i = 0; i < 8; ++i) ss.push_back(e.submit(prompt_of(40, i), sp));
  std::vector<int> first(8, 0);
  for (int step = 1; step <= 20 && e.step(); ++step)
    for (int i = 0; i < 8; ++i)
      if (!ready_events(*ss[i]).empty() && first[i] == 0) first[i] = step;
  // step 1: #0 whole + 24 of #1; step 2: 1 decode, rest of #1, #2, 7 of #3; step 3: 3 decodes,
  // rest of #3, 28 of #4; step 4: 4 decodes, rest of #4, #5, 8 of #6; step 5: 5 decodes, rest
  // of #6, 27 of #7; step 6: rest of #7.
  EXPECT_EQ(first, (std::vector<int>{1, 2, 2, 3, 4, 4, 5, 6}));
  run_idle(e);
}

// The host/device split of each step is measured: one forward time per pass, one host gap per
// pass that followed another without the engine going idle.
TEST(Engine, StepTimingHistograms) {
  FakeBackend be;
  be.delay_us = 200;
  Engine e(be, small_cfg());
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 5;
  auto s = e.submit(prompt_of(5, 1), sp);
  run_idle(e);
  EXPECT_EQ(collect(*s).tokens.size(), 5u);
  EXPECT_EQ(e.metrics().step_forward_s.count(), 5u);
  EXPECT_EQ(e.metrics().step_host_s.count(), 4u);
  auto s2 = e.submit(prompt_of(5, 2), sp);  // after idling: the gap is not a step's host time
  run_idle(e);
  EXPECT_EQ(e.metrics().step_forward_s.count(), 10u);
  EXPECT_EQ(e.metrics().step_host_s.count(), 8u);
  std::string text;
  e.metrics().step_host_s.render("h", "help", text);
  EXPECT_NE(text.find("h_count 8"), std::string::npos) << text;
}

// Batch-invariant mode: which path draws a row's token depends on that row alone. Greedy rows
// without logprobs still let the backend draw; a sampled (temperature > 0) row is drawn on the
// host, also when it is alone in the batch; and a seeded request's tokens are the same.
TEST(Engine, BatchInvariantDrawsSampledRowsOnTheHost) {
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 6;
  SamplingParams sampled = greedy;
  sampled.temperature = 0.8f;
  sampled.seed = 5;
  auto prompt = prompt_of(7, 3);
  for (bool inv : {false, true}) {
    EngineConfig c = small_cfg();
    c.batch_invariant = inv;
    FakeBackend a, b;
    Result ra, rb;
    {
      Engine e(a, c);
      auto s = e.submit(prompt, greedy);
      run_idle(e);
      ra = collect(*s);
    }
    {
      Engine e(b, c);
      auto s = e.submit(prompt, sampled);
      run_idle(e);
      rb = collect(*s);
    }
    EXPECT_EQ(a.sample_calls, 6) << inv;
    EXPECT_EQ(b.sample_calls, inv ? 0 : 6) << inv;
    EXPECT_EQ(ra.tokens, run_alone(prompt, greedy).tokens);
    EXPECT_EQ(rb.tokens, run_alone(prompt, sampled).tokens);
  }
}

// Runs the requests at once through the engine's own loop (start(); the fake backend's passes
// take 300 us), then checks each against its run alone (tokens, text, end, one logprob a token
// where asked) and that the engine ends with no request and no page. Returns the engine's metrics.
namespace {
struct Overlapped {
  int64_t early_launches = 0, preemptions = 0;
  std::vector<Result> got;
};
Overlapped run_overlapped_against_alone(const EngineConfig& c, const std::vector<std::vector<int32_t>>& prompts,
                                        const std::vector<SamplingParams>& sps, bool alone_host_adds = false) {
  Overlapped o;
  FakeBackend be;
  be.delay_us = 300;
  Engine e(be, c);
  e.start();
  std::vector<std::shared_ptr<RequestStream>> ss;
  for (size_t i = 0; i < prompts.size(); ++i) ss.push_back(e.submit(prompts[i], sps[i]));
  for (auto& s : ss) o.got.push_back(collect(*s));
  e.stop();
  o.early_launches = e.metrics().early_launches.load();
  o.preemptions = e.metrics().preemptions.load();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Result alone = run_alone(prompts[i], sps[i], c, alone_host_adds);
    EXPECT_EQ(o.got[i].tokens, alone.tokens) << i;
    EXPECT_EQ(o.got[i].text, alone.text) << i;
    EXPECT_EQ(o.got[i].reason, alone.reason) << i;
    EXPECT_EQ(o.got[i].logprobs.size(), sps[i].logprobs >= 0 ? o.got[i].tokens.size() : 0u) << i;
  }
  EXPECT_EQ(e.stats().kv_pages_used[0], 0);
  EXPECT_EQ(e.stats().kv_pages_used[1], 0);
  EXPECT_EQ(e.num_active(), 0);
  return o;
}

// The async tests' setting: a KV cache small enough to preempt sequences in flight.
EngineConfig overlapped_cfg() {
  EngineConfig c = small_cfg();
  c.kv_cache_tokens = 96;
  c.max_model_len = 90;
  c.async_scheduling = true;
  return c;
}
// n requests of assorted lengths: every third greedy, the others seeded at temperature 0.9.
void mixed_requests(int n, std::vector<std::vector<int32_t>>& prompts, std::vector<SamplingParams>& sps) {
  for (int i = 0; i < n; ++i) {
    prompts.push_back(prompt_of(1 + (i * 11) % 30, i));
    SamplingParams sp;
    sp.max_tokens = 5 + (i * 7) % 40;
    sp.ignore_eos = true;
    sp.temperature = i % 3 == 0 ? 0.0f : 0.9f;
    if (i % 3) sp.seed = 100 + i;
    sps.push_back(sp);
  }
}
// Requests `which` end at the fourth token of their run alone (a stop token the pass in flight
// cannot foresee).
void stop_at_fourth_token(std::initializer_list<int> which, const std::vector<std::vector<int32_t>>& prompts,
                          std::vector<SamplingParams>& sps, const EngineConfig& c) {
  for (int i : which) {
    Result base = run_alone(prompts[i], sps[i], c);
    ASSERT_GE(base.tokens.size(), 4u);
    sps[i].stop_token_ids = {base.tokens[3]};
  }
}
}  // namespace

// The async-scheduling loop (start(), EngineConfig::async_scheduling): forwards run on the
// worker, and a pass the host samples (top logprobs, prompt logprobs) completes before the next
// is planned. Mixed greedy, seeded and logprob requests with stop tokens, a KV
// cache that forces preemption (of sequences in flight, too): each request gets what it gets
// alone, and the pools end empty.
TEST(Engine, OverlappedLoopEqualsAlone) {
  const EngineConfig c = overlapped_cfg();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> sps;
  mixed_requests(16, prompts, sps);
  for (int i = 0; i < 16; ++i) {
    if (i % 4 == 1) sps[i].logprobs = 2;
    if (i % 5 == 3) sps[i].prompt_logprobs = 1;
  }
  stop_at_fourth_token({2, 7, 11}, prompts, sps, c);
  if (HasFatalFailure()) return;
  Overlapped o = run_overlapped_against_alone(c, prompts, sps);
  EXPECT_GT(o.early_launches, 10);  // passes without a host-sampled row launch early
  EXPECT_GT(o.preemptions, 0);
  EXPECT_EQ(o.got[2].reason, FinishReason::kStop);
}

// Penalties and logit_bias drawn by the backend (Backend::applies_logit_changes) in the async loop:
// passes launch early from the ids they take (take_tokens_early), so the next pass's penalties
// must count those ids before their events are written. Each request against its run alone
// with the host's penalties (sample_token), preemption included.
TEST(Engine, OverlappedPenaltiesDrawnByTheBackendEqualHostPenalties) {
  const EngineConfig c = overlapped_cfg();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> sps;
  mixed_requests(12, prompts, sps);
  for (int i = 0; i < 12; ++i) {
    // Strong enough to move most draws over the fake model's logits in [-4, 4).
    if (i % 2 == 0) sps[i].frequency_penalty = 1.5f;
    if (i % 3 == 1) sps[i].presence_penalty = 2.0f;
    if (i % 4 == 3) sps[i].logit_bias = {{7, 2.5f}, {9, -3.0f}};
  }
  Overlapped o = run_overlapped_against_alone(c, prompts, sps, true);
  EXPECT_GT(o.early_launches, 10);  // penalized rows no longer keep a pass from launching early
  EXPECT_GT(o.preemptions, 0);
}

// Cancelling requests while their pass is in flight: they end with kAbort, the others are
// unaffected, every page comes back.
TEST(Engine, OverlappedCancelInFlight) {
  EngineConfig c = small_cfg();
  c.async_scheduling = true;
  FakeBackend be;
  be.delay_us = 500;
  Engine e(be, c);
  e.start();
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 60;
  sp.ignore_eos = true;
  std::vector<std::shared_ptr<RequestStream>> ss;
  for (int i = 0; i < 6; ++i) ss.push_back(e.submit(prompt_of(4 + i, i), sp));
  // wait until the first ones stream, then cancel every other request
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(ss[i]->next(std::chrono::milliseconds(5000)));
  for (int i = 0; i < 6; i += 2) ss[i]->cancel();
  for (int i = 1; i < 6; i += 2) {
    Result r = collect(*ss[i]);
    Result alone = run_alone(prompt_of(4 + i, i), sp);
    // the first event of #1 was consumed above
    ASSERT_GE(alone.tokens.size(), r.tokens.size());
    EXPECT_TRUE(std::equal(r.tokens.rbegin(), r.tokens.rend(), alone.tokens.rbegin())) << i;
    EXPECT_EQ(r.reason, FinishReason::kLength);
  }
  for (int i = 0; i < 6; i += 2) {
    auto ev = ss[i]->next(std::chrono::milliseconds(5000));
    while (ev && !ev->finished) ev = ss[i]->next(std::chrono::milliseconds(5000));
    ASSERT_TRUE(ev) << i;
    EXPECT_TRUE(ev->finish_reason == FinishReason::kAbort || ev->finish_reason == FinishReason::kLength) << i;
  }
  for (int i = 0; i < 200 && e.num_active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  e.stop();
  EXPECT_EQ(e.num_active(), 0);
  EXPECT_EQ(e.stats().kv_pages_used[0], 0);
  EXPECT_EQ(e.stats().kv_pages_used[1], 0);
}

// Start-up refusals (as vLLM): an explicit max_model_len above the model's positions or above
// what the KV cache holds, or a KV cache too small for one sequence of max_model_len, is an
// error naming the limit; it is never quietly lowered.
TEST(Engine, RefusesAContextItCannotHold) {
  FakeBackend be;
  auto error_of = [&](EngineConfig c) -> std::string {
    try {
      Engine e(be, c);
    } catch (const Error& err) {
      return err.what();
    }
    return "";
  };
  EngineConfig c = small_cfg();
  c.max_model_len = be.config().max_position_embeddings + 1;
  c.kv_cache_tokens = int64_t(c.max_model_len) * 2;
  std::string e = error_of(c);
  EXPECT_NE(e.find("max_position_embeddings (" + std::to_string(be.config().max_position_embeddings) + ")"),
            std::string::npos) << e;

  c = small_cfg();
  c.kv_cache_tokens = 10;  // 3 pages of 4 = 12 positions
  c.max_model_len = 90;
  e = error_of(c);
  EXPECT_NE(e.find("holds 12 tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("--max-model-len 12 or less"), std::string::npos) << e;

  c.max_model_len = 0;  // the model's default, but the KV size was given: still refused
  EXPECT_NE(error_of(c), "");

  c = small_cfg();
  c.kv_cache_tokens = 0;
  c.kv_cache_bytes = kv_page_bytes(be.config(), kKvFull, c.page_size, DType::BF16) * 8 +
                     kv_page_bytes(be.config(), kKvSliding, c.page_size, DType::BF16) * 64;
  c.max_model_len = 400;  // explicit, above what that memory holds
  EXPECT_NE(error_of(c).find("does not fit the KV cache"), std::string::npos);

  // The defaults adapt: no max_model_len and no KV size given -> lowered to what fits.
  c.max_model_len = 0;
  Engine ok(be, c);
  EXPECT_LE(ok.max_model_len(), ok.kv_config().num_pages[kKvFull] * c.page_size);
  EXPECT_GE(ok.max_model_len(), 2);

  // An explicit length that fits is kept as asked.
  c = small_cfg();
  c.kv_cache_tokens = 100;
  c.max_model_len = 100;
  Engine exact(be, c);
  EXPECT_EQ(exact.max_model_len(), 100);
}

namespace {
// A toy constraint: inactive for the first `free` tokens, then only even ids below 10 may
// follow (or nothing at all when `allow_none`); records what it was fed.
class EvenIdsConstraint : public structured::TokenConstraint {
 public:
  int free = 0;
  bool allow_none = false;
  std::vector<int32_t> seen;
  bool active() const override { return int(seen.size()) >= free; }
  bool allowed_tokens(uint64_t* words, int vocab) override {
    std::fill(words, words + allowed_words(vocab), uint64_t(0));
    if (allow_none) return false;
    for (int i = 0; i < std::min(vocab, 10); i += 2) words[i / 64] |= uint64_t(1) << (i % 64);
    return true;
  }
  bool accept(int32_t t) override {
    bool ok = !active() || (t < 10 && t % 2 == 0);
    seen.push_back(t);
    return ok;
  }
};
}  // namespace

// A backend that applies logit changes draws the masked rows too (the constraint's
// allowed_tokens as the row's mask); one that does not leaves them to the host. Same tokens.
TEST(Engine, ConstraintMasksSamplingWhileActive) {
  std::vector<int32_t> reference[2];
  for (bool on_backend : {true, false})
  for (int async = 0; async < 2; ++async)
  for (int t = 0; t < 2; ++t) {
    const float temperature = t ? 1.0f : 0.0f;
    FakeBackend be;
    be.applies_adds = on_backend;
    EngineConfig cfg = small_cfg();
    cfg.async_scheduling = async;  // overlapped passes: a pass launches after the previous completed
    Engine e(be, cfg);
    auto c = std::make_shared<EvenIdsConstraint>();
    c->free = 3;
    SamplingParams sp;
    sp.temperature = temperature;
    sp.seed = 5;
    sp.max_tokens = 12;
    sp.constraint = c;
    auto s = e.submit(prompt_of(6, 2), sp);
    if (async) e.start();
    else run_idle(e);
    Result r = collect(*s);
    e.stop();
    ASSERT_EQ(r.reason, FinishReason::kLength);
    ASSERT_EQ(r.tokens.size(), 12u);
    EXPECT_EQ(c->seen, r.tokens) << "every token is fed to the constraint";
    bool any_odd_free = false;
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      if (i < 3) any_odd_free |= r.tokens[i] >= 10 || r.tokens[i] % 2;
      else EXPECT_TRUE(r.tokens[i] < 10 && r.tokens[i] % 2 == 0) << i << ": " << r.tokens[i];
    }
    EXPECT_TRUE(any_odd_free) << "the unconstrained tokens are not masked";
    if (on_backend) {
      EXPECT_EQ(be.sample_calls, 12) << "every step drawn by the backend";
      EXPECT_EQ(be.masked_rows, 9) << "the active steps with their masks";
      // Masked rows' tokens are taken early, the constraint advanced before the next mask.
      if (async) {
        EXPECT_GE(e.metrics().early_launches.load(), 8);
      }
    } else {
      EXPECT_EQ(be.sample_calls, 3) << "inactive steps sample on the backend, active ones on the host";
      EXPECT_EQ(be.masked_rows, 0);
    }
    if (reference[t].empty()) {
      reference[t] = r.tokens;
    } else {
      EXPECT_EQ(r.tokens, reference[t]) << "backend " << on_backend << " async " << async << " T=" << temperature;
    }
  }
}

namespace {
// A toy constraint in the manner of structured output's free text: never active, but odd ids
// are refused (rejects); after mask_next() one draw is masked to even ids. `always_mask`: active
// on every step instead (the reference a greedy run must equal).
class NoOddIdsConstraint : public structured::TokenConstraint {
 public:
  bool always_mask = false;
  bool redraw = false;
  std::vector<int32_t> seen;
  bool active() const override { return always_mask || redraw; }
  bool allowed_tokens(uint64_t* words, int vocab) override {
    std::fill(words, words + allowed_words(vocab), uint64_t(0));
    for (int i = 0; i < vocab; i += 2) words[i / 64] |= uint64_t(1) << (i % 64);
    return true;
  }
  bool accept(int32_t t) override {
    redraw = false;
    seen.push_back(t);
    return t % 2 == 0;
  }
  bool rejects(int32_t t) const override { return t % 2 != 0; }
  void mask_next() override { redraw = true; }
  bool stays_inactive(int32_t t) const override { return !active() && t % 2 == 0; }
};
}  // namespace

// A token drawn without the mask that the constraint refuses is dropped and its position drawn
// again, masked: every token stands, the refused ones never reach the output or the constraint,
// and a greedy run equals one masked at every step (its K/V recomputed on the right context:
// the fake model's logits hash the whole context). With prefix caching, 4-token pages and
// overlapped passes, so redraws meet page boundaries and early-taken tokens.
TEST(Engine, ConstraintRedrawsARefusedUnmaskedToken) {
  for (int async = 0; async < 2; ++async)
    for (float temperature : {0.0f, 1.0f}) {
      std::vector<int32_t> reference;
      for (bool always : {true, false}) {
        FakeBackend be;
        EngineConfig cfg = small_cfg();
        cfg.async_scheduling = async;
        cfg.enable_prefix_caching = true;
        Engine e(be, cfg);
        auto c = std::make_shared<NoOddIdsConstraint>();
        c->always_mask = always;
        SamplingParams sp;
        sp.temperature = temperature;
        sp.seed = 9;
        sp.max_tokens = 40;
        sp.constraint = c;
        auto s = e.submit(prompt_of(7, 3), sp);
        // A second request beside it: its tokens are unaffected by the other's redraws.
        SamplingParams plain;
        plain.temperature = 0.0f;
        plain.max_tokens = 40;
        auto other = e.submit(prompt_of(5, 4), plain);
        if (async) e.start();
        else run_idle(e);
        Result r = collect(*s);
        Result o = collect(*other);
        e.stop();
        ASSERT_EQ(r.reason, FinishReason::kLength);
        ASSERT_EQ(r.tokens.size(), 40u);
        EXPECT_EQ(c->seen, r.tokens);
        for (int32_t t : r.tokens) EXPECT_EQ(t % 2, 0) << t;
        EXPECT_EQ(o.tokens, run_alone(prompt_of(5, 4), plain).tokens);
        if (always) {
          EXPECT_EQ(e.metrics().constraint_redraws.load(), 0);
          reference = r.tokens;
        } else {
          EXPECT_GT(e.metrics().constraint_redraws.load(), 5) << "about half the unmasked draws are odd";
          if (temperature == 0.0f) {
            EXPECT_EQ(r.tokens, reference) << "greedy: the argmax of the even ids either way";
          }
        }
      }
    }
}

// A constraint that refuses a token yet does not mask the redraw (a constraint bug) ends its
// request with an error instead of drawing the same token again forever.
TEST(Engine, ConstraintRefusingWithoutMaskingEndsWithAnError) {
  struct RefusesAll : structured::TokenConstraint {
    bool active() const override { return false; }
    bool allowed_tokens(uint64_t* words, int vocab) override {
      for (int i = 0; i < vocab; ++i) words[i / 64] |= uint64_t(1) << (i % 64);
      return true;
    }
    bool accept(int32_t) override { return true; }
    bool rejects(int32_t) const override { return true; }
  };
  FakeBackend be;
  Engine e(be, small_cfg());
  SamplingParams sp;
  sp.max_tokens = 5;
  sp.constraint = std::make_shared<RefusesAll>();
  auto s = e.submit(prompt_of(4, 1), sp);
  run_idle(e);
  Result r = collect(*s);
  EXPECT_EQ(r.reason, FinishReason::kError);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(e.num_active(), 0);
}

TEST(Engine, ConstraintAllowingNothingEndsWithAnError) {
  FakeBackend be;
  Engine e(be, small_cfg());
  auto c = std::make_shared<EvenIdsConstraint>();
  c->allow_none = true;
  SamplingParams sp;
  sp.max_tokens = 5;
  sp.constraint = c;
  auto s = e.submit(prompt_of(4, 1), sp);
  run_idle(e);
  Result r = collect(*s);
  EXPECT_EQ(r.reason, FinishReason::kError);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(e.num_active(), 0);
}

// The start-up warm-up (engine/warm_up.h): one decode pass at each batch size it names, every
// request ends with all its tokens, and nothing of it stays behind (pages, active requests,
// metrics).
TEST(Engine, WarmUpRunsEachBatchSizeAndLeavesNoTrace) {
  EXPECT_EQ(warm_up_batch_sizes(1), (std::vector<int>{1}));
  EXPECT_EQ(warm_up_batch_sizes(4), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(warm_up_batch_sizes(6), (std::vector<int>{1, 2, 4, 6}));
  // With the backend's decode buckets (the CUDA backend's): each below max_num_seqs, then
  // doublings of the largest.
  const std::vector<int> cuda = {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64};
  EXPECT_EQ(warm_up_batch_sizes(64, cuda), (std::vector<int>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64}));
  EXPECT_EQ(warm_up_batch_sizes(20, cuda), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(warm_up_batch_sizes(256, cuda), (std::vector<int>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 128, 256}));
  FakeBackend be;
  EngineConfig c = small_cfg();
  c.max_num_seqs = 6;
  Engine e(be, c);
  WarmUpResult w = warm_up(e, 8, 3);
  EXPECT_EQ(w.batch_sizes, (std::vector<int>{1, 2, 4, 6}));
  EXPECT_EQ(w.requests, 13);
  // (16 tokens a pass: the prompts of a batch shorten to fit one prefill pass.)
  EXPECT_EQ(w.tokens, 1 * (8 + 3) + 2 * (8 + 3) + 4 * (4 + 3) + 6 * (2 + 3));
  EXPECT_EQ(be.decode_batch_sizes, (std::set<int>{1, 2, 4, 6}));
  EXPECT_EQ(e.num_active(), 0);
  EXPECT_EQ(e.stats().kv_pages_used[0], 0);  // (full pages may stay cached for prefixes: not in use)
  EXPECT_EQ(e.stats().kv_pages_used[1], 0);
  EXPECT_EQ(e.metrics().requests_finished.load(), 0);
  EXPECT_EQ(e.metrics().generation_tokens.load(), 0);
  EXPECT_EQ(e.metrics().ttft_s.count(), 0u);
  // The engine serves as before.
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 5;
  auto s = e.submit(prompt_of(5, 1), sp);
  run_idle(e);
  EXPECT_EQ(collect(*s).tokens.size(), 5u);
  EXPECT_EQ(e.metrics().requests_finished.load(), 1);
}

// A backend with decode graphs (buckets, as the CUDA backend's) gets a greedy and a sampled batch
// at each size up to kWarmUpBothModesRows (its greedy passes there have graphs of their own), one
// above.
TEST(Engine, WarmUpRunsBothModesAtSmallBucketedSizes) {
  struct Bucketed : FakeBackend {
    std::vector<int> decode_batch_buckets() const override { return {1, 2, 4, 8, 16}; }
  } be;
  EngineConfig c = small_cfg();
  c.max_num_seqs = 16;
  Engine e(be, c);
  WarmUpResult w = warm_up(e, 4, 2);
  EXPECT_EQ(w.batch_sizes, (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(w.requests, 2 * (1 + 2 + 4 + 8) + 16);
  EXPECT_EQ(e.num_active(), 0);
}

// A context too short for the default prompt and tokens: the warm-up shortens both (down to the
// smallest context serve accepts, 2 tokens).
TEST(Engine, WarmUpFitsASmallContext) {
  for (int len : {8, 5, 2}) {
    FakeBackend be;
    EngineConfig c = small_cfg();
    c.max_model_len = len;
    Engine e(be, c);
    WarmUpResult w = warm_up(e);
    EXPECT_EQ(w.requests, 1 + 2 + 4) << len;
    EXPECT_EQ(w.tokens, 7 * len) << len;  // prompt + new tokens fill the context
    EXPECT_EQ(e.num_active(), 0) << len;
  }
}

// Async scheduling's early launch (Engine::take_tokens_early): passes the backend samples (greedy,
// seeded, the drawn token's logprob) launch the next pass from their drawn ids before their
// bookkeeping. Stop tokens and stop strings the pass in flight cannot foresee, max_tokens, a KV
// cache that forces preemption of sequences in flight: each request gets what it gets alone,
// every page comes back.
TEST(Engine, EarlyLaunchEqualsAlone) {
  EngineConfig c = overlapped_cfg();
  c.token_text = letter;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> sps;
  mixed_requests(12, prompts, sps);
  for (int i = 1; i < 12; i += 2) sps[i].logprobs = 0;
  stop_at_fourth_token({2, 7}, prompts, sps, c);
  if (HasFatalFailure()) return;
  for (int i : {4, 9}) {  // a stop string: its text from the third and fourth tokens
    Result base = run_alone(prompts[i], sps[i], c);
    ASSERT_GE(base.text.size(), 4u);
    sps[i].stop = {base.text.substr(2, 2)};
  }
  Overlapped o = run_overlapped_against_alone(c, prompts, sps);
  EXPECT_GT(o.early_launches, 10);
  EXPECT_GT(o.preemptions, 0);
  EXPECT_EQ(o.got[2].reason, FinishReason::kStop);
  EXPECT_EQ(o.got[4].reason, FinishReason::kStop);
  EXPECT_EQ(o.got[4].stop_string, sps[4].stop[0]);
}
