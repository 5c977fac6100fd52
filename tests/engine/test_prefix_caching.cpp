// The engine with prefix caching over the fake backend, which stores each position's token in
// the pages it is handed and checks them back: a wrong shared page, a cached page reused after
// eviction, or a page written by two sequences changes outputs or throws.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "engine/engine.h"
#include "fake_backend.h"

using namespace gptoss;
using gptoss::testing::FakeBackend;

namespace {

struct Out {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  int cached_tokens = -1;
};

// A request's tokens and its final event's fields. wait > 0: waits for each event (the engine's
// own loop runs the request); 0: takes what the stream holds (step() ran it).
Out drain(RequestStream& s, std::chrono::milliseconds wait = std::chrono::milliseconds(0)) {
  Out o;
  while (auto ev = s.next(wait)) {
    o.tokens.insert(o.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->finished) {
      o.reason = ev->finish_reason;
      o.cached_tokens = ev->cached_tokens;
      return o;
    }
  }
  if (wait.count() > 0) ADD_FAILURE() << "timed out waiting for an event";
  return o;
}

void run_idle(Engine& e) {
  for (int i = 0; i < 1000000 && e.step(); ++i) {
  }
}

std::vector<int32_t> tokens_of(int len, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back((i * 7 + salt * 13 + 1) % 62);
  return p;
}

EngineConfig cfg(bool caching) {
  EngineConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 16;
  c.page_size = 4;
  c.kv_cache_tokens = 4096;
  c.max_model_len = 512;
  c.enable_prefix_caching = caching;
  return c;
}

using test::greedy;

using test::expect_pools_balanced;

// A two-turn chat: turn 2's prompt is turn 1's prompt and answer plus a new message.
struct TwoTurns {
  Out first, second;
  int64_t prompt_computed = 0, hits = 0, queries = 0;
};

TwoTurns two_turns(bool caching) {
  FakeBackend be;
  Engine e(be, cfg(caching));
  auto p1 = tokens_of(50, 1);
  TwoTurns r;
  auto s1 = e.submit(p1, greedy(20));
  run_idle(e);
  r.first = drain(*s1);
  auto p2 = p1;
  p2.insert(p2.end(), r.first.tokens.begin(), r.first.tokens.end());
  auto more = tokens_of(10, 2);
  p2.insert(p2.end(), more.begin(), more.end());
  auto s2 = e.submit(p2, greedy(20));
  run_idle(e);
  r.second = drain(*s2);
  // Tokens the backend computed (prompt_tokens_total counts each prompt token once, cached or
  // not, as tests/server's metrics contract says).
  r.prompt_computed = be.forwarded_tokens;
  r.hits = e.metrics().prefix_cache_hits.load();
  r.queries = e.metrics().prefix_cache_queries.load();
  expect_pools_balanced(e);
  return r;
}

}  // namespace

TEST(PrefixCaching, SecondTurnSkipsTheCachedPrefixWithTheSameOutput) {
  TwoTurns off = two_turns(false), on = two_turns(true);
  ASSERT_EQ(on.first.tokens.size(), 20u);
  EXPECT_EQ(on.first.tokens, off.first.tokens);
  EXPECT_EQ(on.second.tokens, off.second.tokens);
  EXPECT_EQ(on.first.cached_tokens, 0);
  EXPECT_EQ(off.second.cached_tokens, 0);
  // Turn 1 computed positions 0..68 (the 20th token is never fed back): 17 complete pages.
  EXPECT_EQ(on.second.cached_tokens, 68);
  EXPECT_EQ(on.hits, 68);
  EXPECT_EQ(on.queries, 50 + 80);
  EXPECT_EQ(off.hits, 0);
  EXPECT_EQ(on.prompt_computed, off.prompt_computed - 68);
}

// Through the engine's loop, synchronous and async. A whole 50-token prompt in one pass, then a
// second request sharing its first 40 tokens: the sliding-window pages near position 40 were
// written by that pass and are below the window once the first decode step is prepared. With
// async scheduling the pass's pages are offered to the cache when its tokens are taken early,
// before the next plan's prepare() frees them (offered after it, the second request found 0).
TEST(PrefixCaching, SharedPrefixHitsTheCacheThroughTheAsyncLoop) {
  for (int mode = 0; mode < 3; ++mode) {  // step(), the loop, the async loop
    FakeBackend be;
    EngineConfig c = cfg(true);
    c.max_num_batched_tokens = 64;
    c.async_scheduling = mode == 2;
    Engine e(be, c);
    if (mode > 0) e.start();
    auto p1 = tokens_of(50, 1);
    auto p2 = std::vector<int32_t>(p1.begin(), p1.begin() + 40);
    auto tail = tokens_of(10, 2);
    p2.insert(p2.end(), tail.begin(), tail.end());
    Out o[2];
    for (int k = 0; k < 2; ++k) {
      auto s = e.submit(k ? p2 : p1, greedy(6));
      if (mode == 0) run_idle(e);
      o[k] = drain(*s, std::chrono::milliseconds(mode > 0 ? 60000 : 0));
    }
    if (mode > 0) e.stop();
    EXPECT_EQ(o[0].cached_tokens, 0) << mode;
    EXPECT_EQ(o[1].cached_tokens, 40) << mode;
    EXPECT_EQ(o[1].tokens.size(), 6u) << mode;
    expect_pools_balanced(e);
  }
}

// Many requests sharing a long prefix under a KV cache small enough to preempt, some cancelled
// part-way: every finished request's tokens equal those of an engine without caching, and the
// pools balance at the end.
TEST(PrefixCaching, PreemptionAndCancellationReleaseReferences) {
  auto run = [](bool caching, int64_t* preempted, int64_t* hits) {
    FakeBackend be;
    EngineConfig c = cfg(caching);
    c.max_num_seqs = 6;
    c.kv_cache_tokens = 160;  // 40 pages of 4 for 6 sequences of up to ~90 positions
    c.max_model_len = 128;
    Engine e(be, c);
    auto shared = tokens_of(40, 3);
    std::vector<std::shared_ptr<RequestStream>> ss;
    for (int i = 0; i < 12; ++i) {
      auto p = shared;
      p.resize(20 + (i * 7) % 21);  // shares 20..40 tokens
      auto tail = tokens_of(3 + i % 5, 10 + i);
      p.insert(p.end(), tail.begin(), tail.end());
      ss.push_back(e.submit(p, greedy(40)));
    }
    std::vector<Out> out(ss.size());
    for (int step = 0; e.step(); ++step) {
      if (step == 30) ss[3]->cancel();
      if (step == 60) ss[8]->cancel();
      for (size_t i = 0; i < ss.size(); ++i) {
        Out o = drain(*ss[i]);
        out[i].tokens.insert(out[i].tokens.end(), o.tokens.begin(), o.tokens.end());
        if (o.reason != FinishReason::kNone) out[i].reason = o.reason;
      }
    }
    expect_pools_balanced(e);
    *preempted = e.metrics().preemptions.load();
    *hits = e.metrics().prefix_cache_hits.load();
    return out;
  };
  int64_t pre_on = 0, pre_off = 0, hits_on = 0, hits_off = 0;
  auto on = run(true, &pre_on, &hits_on);
  auto off = run(false, &pre_off, &hits_off);
  EXPECT_GT(pre_on, 0);
  EXPECT_GT(hits_on, 0);
  EXPECT_EQ(hits_off, 0);
  for (size_t i = 0; i < on.size(); ++i) {
    if (i == 3 || i == 8) {
      EXPECT_EQ(on[i].reason, FinishReason::kAbort) << i;
      continue;
    }
    EXPECT_EQ(on[i].reason, FinishReason::kLength) << i;
    EXPECT_EQ(on[i].tokens, off[i].tokens) << i;
    EXPECT_EQ(on[i].tokens.size(), 40u) << i;
  }
}

TEST(PrefixCaching, PromptLogprobsComputeTheWholePrompt) {
  FakeBackend be;
  Engine e(be, cfg(true));
  auto p = tokens_of(30, 4);
  auto a = e.submit(p, greedy(3));
  run_idle(e);
  EXPECT_EQ(drain(*a).cached_tokens, 0);
  SamplingParams sp = greedy(3);
  sp.prompt_logprobs = 0;
  auto b = e.submit(p, sp);
  run_idle(e);
  EXPECT_EQ(drain(*b).cached_tokens, 0);
  auto c = e.submit(p, greedy(3));
  run_idle(e);
  EXPECT_EQ(drain(*c).cached_tokens, 28);
  expect_pools_balanced(e);
}
