// The engine over the exact CPU backend on the tiny fixture model (tests/data/tiny-gptoss):
// deterministic serving under load and KV exhaustion.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "model/weights.h"

using namespace gptoss;

namespace {

const std::string kFixture = std::string(GPTOSS_TEST_DATA) + "/tiny-gptoss";

std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  int len = 5 + (i * 13) % 20;
  for (int k = 0; k < len; ++k) p.push_back((k * 31 + i * 17 + 3) % 500);
  return p;
}

// Runs the requests through one engine, all submitted at once (or one after another) and
// returns each one's tokens; `preemptions` gets the engine's count.
std::vector<std::vector<int32_t>> serve(Backend& be, EngineConfig c, int n, int max_tokens, bool one_at_a_time,
                                        int64_t* preemptions = nullptr, bool threaded = false) {
  Engine e(be, c);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  std::vector<std::vector<int32_t>> out(n);
  auto drain = [&](RequestStream& s, std::vector<int32_t>& toks) {
    while (auto ev = s.next(std::chrono::milliseconds(0))) {
      toks.insert(toks.end(), ev->tokens.begin(), ev->tokens.end());
      if (ev->finished) { EXPECT_EQ(ev->finish_reason, FinishReason::kLength); }
    }
  };
  if (one_at_a_time) {
    for (int i = 0; i < n; ++i) {
      auto s = e.submit(prompt_of(i), sp);
      while (e.step()) {
      }
      drain(*s, out[i]);
    }
  } else if (threaded) {
    // the engine's own loop, async scheduling (a pass's bookkeeping while the next one runs)
    e.start();
    std::vector<std::shared_ptr<RequestStream>> ss;
    for (int i = 0; i < n; ++i) ss.push_back(e.submit(prompt_of(i), sp));
    for (int i = 0; i < n; ++i)
      while (true) {
        auto ev = ss[i]->next(std::chrono::milliseconds(60000));
        if (!ev) {
          ADD_FAILURE() << "request " << i << " timed out";
          break;
        }
        out[i].insert(out[i].end(), ev->tokens.begin(), ev->tokens.end());
        if (ev->finished) break;
      }
    e.stop();
  } else {
    std::vector<std::shared_ptr<RequestStream>> ss;
    for (int i = 0; i < n; ++i) ss.push_back(e.submit(prompt_of(i), sp));
    while (e.step()) {
    }
    for (int i = 0; i < n; ++i) drain(*ss[i], out[i]);
  }
  if (preemptions) *preemptions = e.metrics().preemptions.load();
  EXPECT_EQ(e.stats().kv_pages_used[0], 0);
  EXPECT_EQ(e.num_active(), 0);
  return out;
}

}  // namespace

// 64 concurrent greedy requests in batch-invariant mode with a KV cache that forces preemption
// give the tokens of an ample cache and of the same requests run one at a time; every request
// gets all its tokens.
TEST(EngineCpu, BatchInvariantUnderPreemption) {
  auto be = make_cpu_backend(ModelWeights::load(kFixture), 2);
  const int n = 64, max_tokens = 48;
  EngineConfig c;
  c.max_num_seqs = 64;
  c.max_num_batched_tokens = 256;
  c.max_model_len = 256;
  c.batch_invariant = true;
  EngineConfig tight = c, ample = c;
  tight.kv_cache_tokens = 320;  // 20 pages of 16 for 64 sequences of up to 72 positions
  ample.kv_cache_tokens = 64 * 256;
  int64_t preempted = 0, preempted_ample = 0, preempted_threaded = 0;
  auto squeezed = serve(*be, tight, n, max_tokens, false, &preempted);
  EngineConfig tight_async = tight;
  tight_async.async_scheduling = true;
  auto overlapped = serve(*be, tight_async, n, max_tokens, false, &preempted_threaded, true);
  auto roomy = serve(*be, ample, n, max_tokens, false, &preempted_ample);
  auto alone = serve(*be, ample, n, max_tokens, true);
  std::printf("preemptions: %lld\n", (long long)preempted);
  EXPECT_GT(preempted, 10);
  EXPECT_EQ(preempted_ample, 0);
  EXPECT_GT(preempted_threaded, 0);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(int(squeezed[i].size()), max_tokens) << i;
    EXPECT_EQ(squeezed[i], roomy[i]) << i;
    EXPECT_EQ(squeezed[i], alone[i]) << i;
    EXPECT_EQ(overlapped[i], alone[i]) << i;
  }
  // the model is not a constant: requests differ
  EXPECT_NE(alone[0], alone[1]);
}

// Prefix caching on the real CPU model: a multi-turn chat (turn 2 = turn 1's prompt and answer
// plus a new message) and concurrent requests sharing a prefix give the same greedy tokens with
// and without the cache, and the second turn reuses turn 1's pages.
TEST(EngineCpu, PrefixCachingKeepsGreedyOutputs) {
  auto be = make_cpu_backend(ModelWeights::load(kFixture), 2);
  auto run = [&](bool caching, int* cached_second) {
    EngineConfig c;
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 64;  // several prefill chunks per prompt
    c.max_model_len = 512;
    c.kv_cache_tokens = 4 * 512;
    c.enable_prefix_caching = caching;
    Engine e(*be, c);
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 24;
    sp.ignore_eos = true;
    auto collect = [&](RequestStream& s, int* cached = nullptr) {
      std::vector<int32_t> t;
      while (auto ev = s.next(std::chrono::milliseconds(0))) {
        t.insert(t.end(), ev->tokens.begin(), ev->tokens.end());
        if (ev->finished && cached) *cached = ev->cached_tokens;
      }
      return t;
    };
    std::vector<int32_t> p1;
    for (int k = 0; k < 150; ++k) p1.push_back((k * 37 + 11) % 500);
    auto s1 = e.submit(p1, sp);
    while (e.step()) {
    }
    std::vector<std::vector<int32_t>> out{collect(*s1)};
    auto p2 = p1;
    p2.insert(p2.end(), out[0].begin(), out[0].end());
    for (int k = 0; k < 9; ++k) p2.push_back((k * 5 + 7) % 500);
    // turn 2 and three others sharing 40..140 tokens of turn 1, all at once
    std::vector<std::shared_ptr<RequestStream>> ss{e.submit(p2, sp)};
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> p(p1.begin(), p1.begin() + 40 + 50 * i);
      p.push_back(499 - i);
      ss.push_back(e.submit(p, sp));
    }
    while (e.step()) {
    }
    out.push_back(collect(*ss[0], cached_second));
    for (int i = 1; i < 4; ++i) out.push_back(collect(*ss[i]));
    EXPECT_EQ(e.stats().kv_pages_used[0], 0);
    EXPECT_EQ(e.stats().kv_pages_used[1], 0);
    return out;
  };
  int cached_on = -1, cached_off = -1;
  auto on = run(true, &cached_on), off = run(false, &cached_off);
  ASSERT_EQ(on.size(), off.size());
  for (size_t i = 0; i < on.size(); ++i) {
    EXPECT_EQ(on[i].size(), 24u) << i;
    EXPECT_EQ(on[i], off[i]) << i;
  }
  EXPECT_EQ(cached_off, 0);
  EXPECT_EQ(cached_on, 160);  // turn 1 computed 150 + 23 positions: 10 complete pages of 16
  EXPECT_NE(on[2], on[3]);
}
