// Speculative decoding (n-gram drafts) in the engine over the exact CPU backend on the tiny
// fixture model: greedy outputs equal plain decoding alone and batched, seeded sampled outputs
// are reproduced, sampled token frequencies match plain decoding, and the KV rollback of
// rejected drafts never leaks pages.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include <unistd.h>

#include "engine_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "model/make_model.h"
#include "model/weights.h"

using namespace gptoss;

namespace {

const std::string kFixture = std::string(GPTOSS_TEST_DATA) + "/tiny-gptoss";

Backend& backend() {
  static auto be = make_cpu_backend(ModelWeights::load(kFixture), 2);
  return *be;
}

// Prompts with repeats (so that prompt lookup finds matches) and some without.
std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  const int len = 6 + (i * 7) % 19;
  const int period = 2 + i % 5;
  for (int k = 0; k < len; ++k)
    p.push_back(i % 4 == 3 ? (k * 31 + i * 17 + 3) % 500 : ((k % period) * 37 + i * 11) % 500);
  return p;
}

EngineConfig config(int k) {
  EngineConfig c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 512;
  c.max_model_len = 256;
  if (k > 0) c.speculative = parse_speculative_config(
      R"({"method":"ngram","num_speculative_tokens":)" + std::to_string(k) + R"(,"prompt_lookup_max":3})");
  return c;
}

struct SpecRun {
  std::vector<std::vector<int32_t>> tokens;
  int64_t drafted = 0, accepted = 0, redraws = 0;
};

// Submits every request at once and steps the engine until idle. After each step, every
// running sequence has computed all its tokens but the last, and the full-attention pool holds
// exactly the pages those positions need: rejected drafts' pages were given back.
// The CPU backend as one that applies no logit changes: the engine draws penalized and biased
// rows on the host (sample_token) instead of handing their changes to forward_sample.
struct HostAddsBackend : Backend {
  Backend& b;
  explicit HostAddsBackend(Backend& inner) : b(inner) {}
  std::string name() const override { return b.name(); }
  const GptOssConfig& config() const override { return b.config(); }
  void init_kv_cache(const KvCacheConfig& kv) override { b.init_kv_cache(kv); }
  const KvCacheConfig& kv_config() const override { return b.kv_config(); }
  void forward(const ForwardBatch& batch, float* logits) override { b.forward(batch, logits); }
  bool applies_logit_changes() const override { return false; }
};

SpecRun serve(EngineConfig c, const std::vector<std::vector<int32_t>>& prompts, const std::vector<SamplingParams>& sps,
              bool check_pages = true, bool host_adds = false) {
  HostAddsBackend host(backend());
  Engine e(host_adds ? static_cast<Backend&>(host) : backend(), c);
  SpecRun out;
  out.tokens.resize(prompts.size());
  std::vector<std::shared_ptr<RequestStream>> ss;
  std::vector<bool> done(prompts.size(), false);
  for (size_t i = 0; i < prompts.size(); ++i) ss.push_back(e.submit(prompts[i], sps[i]));
  int steps = 0;
  while (e.step()) {
    int expect_pages = 0;
    for (size_t i = 0; i < ss.size(); ++i) {
      while (auto ev = ss[i]->next(std::chrono::milliseconds(0))) {
        out.tokens[i].insert(out.tokens[i].end(), ev->tokens.begin(), ev->tokens.end());
        if (ev->finished) done[i] = true;
      }
      const int computed = int(prompts[i].size() + out.tokens[i].size()) - 1;
      if (!done[i] && !out.tokens[i].empty()) expect_pages += (computed + c.page_size - 1) / c.page_size;
    }
    // the budget holds every prompt: from the first step on all running sequences decode
    if (check_pages) { EXPECT_EQ(e.stats().kv_pages_used[kKvFull], expect_pages) << "step " << steps; }
    ++steps;
  }
  EXPECT_EQ(e.stats().kv_pages_used[kKvFull], 0);
  EXPECT_EQ(e.stats().kv_pages_used[kKvSliding], 0);
  EXPECT_EQ(e.num_active(), 0);
  out.drafted = e.metrics().spec_draft_tokens.load();
  out.accepted = e.metrics().spec_accepted_tokens.load();
  out.redraws = e.metrics().constraint_redraws.load();
  return out;
}

using test::greedy;

}  // namespace

// On a loop model (model/make_model.h LoopSpec: greedy output walks a cycle of tokens) n-gram
// drafts are right: nearly every draft is accepted, and the output is the cycle, as plain
// decoding gives it. This is the text the GPU benchmark of issue 13 runs at real shapes.
TEST(SpeculativeEngineCpu, LoopModelAcceptsNearlyEveryDraft) {
  const auto dir = std::filesystem::temp_directory_path() / ("gptoss-spec-loop-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  LoopSpec loop;
  loop.tokens = 6;
  make_random_model(GptOssConfig::preset("tiny"), dir.string(), 3, size_t(4) << 30, loop);
  auto be = make_cpu_backend(ModelWeights::load(dir.string()), 2);
  std::vector<int32_t> prompt;
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < loop.tokens; ++i) prompt.push_back(loop.first_id + i);
  auto run = [&](int k, int64_t* drafted, int64_t* accepted) {
    Engine e(*be, config(k));
    auto st = e.submit(prompt, greedy(40));
    while (e.step()) {
    }
    std::vector<int32_t> out;
    while (auto ev = st->next(std::chrono::milliseconds(0))) out.insert(out.end(), ev->tokens.begin(), ev->tokens.end());
    if (drafted) *drafted = e.metrics().spec_draft_tokens.load();
    if (accepted) *accepted = e.metrics().spec_accepted_tokens.load();
    return out;
  };
  const auto plain = run(0, nullptr, nullptr);
  ASSERT_EQ(plain.size(), 40u);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], loop.first_id + int(i) % loop.tokens) << i;
  for (int k : {1, 4}) {
    int64_t drafted = 0, accepted = 0;
    EXPECT_EQ(run(k, &drafted, &accepted), plain) << "K=" << k;
    std::printf("loop model, K=%d: %lld drafts, %lld accepted\n", k, (long long)drafted, (long long)accepted);
    EXPECT_GT(drafted, 0) << k;
    EXPECT_GE(double(accepted), 0.9 * double(drafted)) << k;
  }
  std::filesystem::remove_all(dir);
}

TEST(SpeculativeConfig, ParsesAndRefuses) {
  auto c = parse_speculative_config(
      R"({"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2})");
  EXPECT_EQ(c.method, "ngram");
  EXPECT_EQ(c.num_speculative_tokens, 4);
  EXPECT_EQ(c.prompt_lookup_max, 4);
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_TRUE(c.enabled());
  auto msg = [](const std::string& j) {
    try {
      parse_speculative_config(j);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(R"({"method":"medusa","num_speculative_tokens":1})").find("not implemented"),
            std::string::npos);
  EXPECT_NE(msg("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(msg(R"({"method":"ngram"})").find("num_speculative_tokens"), std::string::npos);
  EXPECT_NE(msg(R"({"method":"ngram","num_speculative_tokens":0})").find("[1, 16]"), std::string::npos);
  EXPECT_NE(msg(R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_mx":3})").find("unknown key"),
            std::string::npos);
  EXPECT_NE(msg(R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":5,"prompt_lookup_max":3})")
                .find("larger than"),
            std::string::npos);
  EXPECT_NE(msg(R"({"method":"draft_model","num_speculative_tokens":2})").find("unknown method"), std::string::npos);
}

TEST(NgramDrafter, ProposesTheContinuationOfTheLatestLongestMatch) {
  // suffix [7 8]: latest earlier occurrence at 5 -> continuation 9 1 ...
  std::vector<int32_t> ctx{7, 8, 1, 2, 3, 7, 8, 9, 1, 7, 8};
  EXPECT_EQ(ngram_propose(ctx, 3, 1, 3), (std::vector<int32_t>{9, 1, 7}));
  EXPECT_EQ(ngram_propose(ctx, 1, 1, 3), (std::vector<int32_t>{9}));
  // a longer n-gram wins over a later shorter one: [3 4] occurs at 0 (then 5), 4 alone later (then 6)
  std::vector<int32_t> c2{3, 4, 5, 4, 6, 3, 4};
  EXPECT_EQ(ngram_propose(c2, 2, 1, 2), (std::vector<int32_t>{5, 4}));
  EXPECT_EQ(ngram_propose(c2, 2, 1, 1), (std::vector<int32_t>{6, 3}));
  // continuation cut at the end of the context
  std::vector<int32_t> c3{1, 2, 1};
  EXPECT_EQ(ngram_propose(c3, 4, 1, 3), (std::vector<int32_t>{2, 1}));
  // nothing recurs
  EXPECT_TRUE(ngram_propose({1, 2, 3, 4}, 4, 1, 3).empty());
  EXPECT_TRUE(ngram_propose({5, 5}, 4, 2, 3).empty());
  EXPECT_TRUE(ngram_propose({}, 4, 1, 3).empty());
}

TEST(AdaptiveDraftLength, BacksOffOnMissesAndRecovers) {
  AdaptiveDraftLength a(4);
  EXPECT_EQ(a.next(), 4);
  a.update(4, 0);
  EXPECT_EQ(a.next(), 2);
  a.update(2, 0);
  EXPECT_EQ(a.next(), 1);
  a.update(1, 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a.next(), 0) << i;  // paused 8 steps
  EXPECT_EQ(a.next(), 1);                                  // one probe
  a.update(1, 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(a.next(), 0) << i;  // the pause doubles
  EXPECT_EQ(a.next(), 1);
  a.update(1, 1);  // a hit: grows again
  EXPECT_EQ(a.next(), 2);
  a.update(2, 2);
  a.update(3, 3);
  a.update(4, 4);
  EXPECT_EQ(a.next(), 4);  // capped at the configured K
  a.update(4, 1);          // a partial hit keeps K
  EXPECT_EQ(a.next(), 4);
}

// The pass cost model: an average per token count (mostly the recent passes), and for a count not
// measured the nearest smaller one's (so larger passes look no dearer until tried).
TEST(PassCostModel, AveragesByCountAndGuessesUpward) {
  PassCostModel c;
  EXPECT_LT(c.estimate(8), 0.0);
  c.record(8, 5.6e-3);
  c.record(16, 8.2e-3);
  EXPECT_DOUBLE_EQ(c.estimate(8), 5.6e-3);
  EXPECT_DOUBLE_EQ(c.estimate(12), 5.6e-3);
  EXPECT_DOUBLE_EQ(c.estimate(16), 8.2e-3);
  EXPECT_DOUBLE_EQ(c.estimate(40), 8.2e-3);
  EXPECT_LT(c.estimate(4), 0.0);
  c.record(8, 6.6e-3);
  EXPECT_NEAR(c.estimate(8), 0.8 * 5.6e-3 + 0.2 * 6.6e-3, 1e-12);
  c.record(0, 1.0);   // ignored
  c.record(5, -1.0);  // ignored
  EXPECT_LT(c.estimate(5), 0.0);
}

// The cost gate with the H200's 120b figures at 8 streams (5.6 ms a pass of 8 tokens, 8.2 ms
// from 9 to 16): one draft among 8 sequences costs more than it returns; a draft for each of
// them pays; an unknown base cost keeps everything; an unmeasured larger pass is tried; and the
// kept drafts are the best ones, a prefix of each sequence's.
TEST(DraftsWorthVerifying, KeepsTheDraftsThatPayForTheirRows) {
  PassCostModel c;
  c.record(8, 5.6e-3);
  for (int n = 9; n <= 16; ++n) c.record(n, 8.2e-3);
  std::vector<int> one(8, 0);
  one[3] = 1;
  EXPECT_EQ(drafts_worth_verifying(8, one, std::vector<double>(8, 0.86), c), std::vector<int>(8, 0));
  const std::vector<int> each(8, 1);
  EXPECT_EQ(drafts_worth_verifying(8, each, std::vector<double>(8, 0.86), c), each);
  // Low acceptance: (8 + 8 x 0.3) / 8.2 ms < 8 / 5.6 ms.
  EXPECT_EQ(drafts_worth_verifying(8, each, std::vector<double>(8, 0.3), c), std::vector<int>(8, 0));

  PassCostModel unknown;
  EXPECT_EQ(drafts_worth_verifying(8, one, std::vector<double>(8, 0.1), unknown), one);
  PassCostModel base_only;
  base_only.record(8, 5.6e-3);
  EXPECT_EQ(drafts_worth_verifying(8, each, std::vector<double>(8, 0.2), base_only), each);

  // Two sequences of 3 drafts, accepted always / half the time; passes of 2-4 tokens cost 1,
  // 5-8 cost 2: the two sure drafts of the first are worth it, nothing more.
  PassCostModel steps;
  for (int n = 2; n <= 4; ++n) steps.record(n, 1.0);
  for (int n = 5; n <= 8; ++n) steps.record(n, 2.0);
  EXPECT_EQ(drafts_worth_verifying(2, {3, 3}, {1.0, 0.5}, steps), (std::vector<int>{2, 0}));
  // Costs flat to 8 tokens: all six, each sequence's in order.
  PassCostModel flat;
  for (int n = 2; n <= 8; ++n) flat.record(n, 1.0);
  EXPECT_EQ(drafts_worth_verifying(2, {3, 3}, {1.0, 0.5}, flat), (std::vector<int>{3, 3}));
  // No drafts: nothing to keep.
  EXPECT_EQ(drafts_worth_verifying(2, {0, 0}, {1.0, 1.0}, flat), (std::vector<int>{0, 0}));
}

// Greedy: K = 1..4 give plain decoding's tokens, each request alone and all 16 in one batch,
// and the drafts were really verified (some accepted, some rejected).
TEST(SpeculativeEngineCpu, GreedyEqualsPlainAloneAndBatched) {
  const int n = 16, max_tokens = 40;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(prompt_of(i));
  std::vector<SamplingParams> sps(n, greedy(max_tokens));
  const SpecRun plain = serve(config(0), prompts, sps);
  EXPECT_EQ(plain.drafted, 0);
  for (int k = 1; k <= 4; ++k) {
    const SpecRun batched = serve(config(k), prompts, sps);
    std::printf("K=%d: %lld drafts, %lld accepted\n", k, (long long)batched.drafted, (long long)batched.accepted);
    EXPECT_GT(batched.accepted, 0) << k;
    EXPECT_LT(batched.accepted, batched.drafted) << k;
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(int(batched.tokens[i].size()), max_tokens) << "K=" << k << " request " << i;
      EXPECT_EQ(batched.tokens[i], plain.tokens[i]) << "K=" << k << " request " << i;
    }
    for (int i = k - 1; i < n; i += 4) {  // alone (a quarter of them per K: keeps the test fast)
      const SpecRun alone = serve(config(k), {prompts[i]}, {sps[i]});
      EXPECT_EQ(alone.tokens[0], plain.tokens[i]) << "K=" << k << " request " << i << " alone";
    }
  }
}

// Batched with plain rows: sequences whose drafts found nothing, prompts still prefilling in
// chunks (a small token budget), stop tokens and max_tokens reached inside an accepted draft.
TEST(SpeculativeEngineCpu, GreedyEqualsPlainWithPrefillChunksAndStops) {
  const int n = 16;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> sps;
  for (int i = 0; i < n; ++i) {
    prompts.push_back(prompt_of(i + 3));
    for (int r = 0; r < i * 3; ++r) prompts.back().push_back((r * 7 + i) % 300);  // longer prompts
    SamplingParams sp = greedy(5 + i * 3);
    sps.push_back(sp);
  }
  EngineConfig pc = config(0), sc = config(4);
  pc.max_num_batched_tokens = sc.max_num_batched_tokens = 32;  // prefill spread over steps
  // Engine-wide stop ids taken from plain outputs, so that some requests stop mid-draft.
  const SpecRun plain0 = serve(config(0), prompts, sps, false);
  pc.stop_token_ids = sc.stop_token_ids = {plain0.tokens[2][3], plain0.tokens[9][11]};
  for (auto& sp : sps) sp.ignore_eos = false;
  // serve() checks page counts assuming whole prompts in the first step: use the engine directly.
  // With async_scheduling the engine's own loop runs (start()): verify passes complete before the
  // next is planned, plain passes launch the next early.
  auto run = [&](EngineConfig c, int64_t* accepted) {
    Engine e(backend(), c);
    if (c.async_scheduling) e.start();
    std::vector<std::shared_ptr<RequestStream>> ss;
    for (int i = 0; i < n; ++i) ss.push_back(e.submit(prompts[i], sps[i]));
    if (!c.async_scheduling)
      while (e.step()) {
      }
    std::vector<std::pair<std::vector<int32_t>, FinishReason>> out(n);
    for (int i = 0; i < n; ++i)
      while (auto ev = ss[i]->next(std::chrono::milliseconds(c.async_scheduling ? 60000 : 0))) {
        out[i].first.insert(out[i].first.end(), ev->tokens.begin(), ev->tokens.end());
        if (ev->finished) {
          out[i].second = ev->finish_reason;
          break;
        }
      }
    if (c.async_scheduling) e.stop();
    EXPECT_EQ(e.stats().kv_pages_used[kKvFull], 0);
    EXPECT_EQ(e.stats().kv_pages_used[kKvSliding], 0);
    if (accepted) *accepted = e.metrics().spec_accepted_tokens.load();
    return out;
  };
  int64_t accepted = 0, accepted_async = 0;
  auto plain = run(pc, nullptr);
  auto spec = run(sc, &accepted);
  EngineConfig ac = sc;
  ac.async_scheduling = true;
  auto spec_async = run(ac, &accepted_async);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(accepted_async, 0);
  int stopped = 0;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(spec[i].first, plain[i].first) << i;
    EXPECT_EQ(spec[i].second, plain[i].second) << i;
    EXPECT_EQ(spec_async[i].first, plain[i].first) << i;
    EXPECT_EQ(spec_async[i].second, plain[i].second) << i;
    stopped += plain[i].second == FinishReason::kStop;
  }
  EXPECT_GT(stopped, 0);
}

namespace {
// A structured-output-like constraint: in free text ids = 1 (mod 3) are refused (drawn unmasked,
// refused, drawn again masked), and an id = 0 (mod 4) changes its phase: the next two tokens
// are masked to ids = 0 (mod 5), as a harmony header is masked to a few tokens.
class ModuloConstraint : public structured::TokenConstraint {
 public:
  bool redraw = false;
  int masked_left = 0;
  std::vector<int32_t> seen;
  bool active() const override { return redraw || masked_left > 0; }
  bool allowed_tokens(uint64_t* words, int vocab) override {
    std::fill(words, words + allowed_words(vocab), uint64_t(0));
    for (int i = 0; i < vocab; ++i)
      if (masked_left > 0 ? i % 5 == 0 : i % 3 != 1) words[i / 64] |= uint64_t(1) << (i % 64);
    return true;
  }
  bool accept(int32_t t) override {
    const bool was_masked = masked_left > 0;
    redraw = false;
    seen.push_back(t);
    if (was_masked) {
      --masked_left;
      return t % 5 == 0;
    }
    if (t % 4 == 0) masked_left = 2;
    return t % 3 != 1;
  }
  bool rejects(int32_t t) const override { return t % 3 == 1; }
  void mask_next() override { redraw = true; }
  bool stays_inactive(int32_t t) const override { return !active() && t % 3 != 1 && t % 4 != 0; }
};
}  // namespace

// A constrained sequence drafts while its constraint is inactive: a refused token ends the
// step's tokens before it (drawn again masked next step), a phase-changing one ends them after
// it. Greedy and seeded outputs equal plain decoding's under the same constraint, every token
// allowed, and the constraint sees exactly the output.
TEST(SpeculativeEngineCpu, ConstrainedSequencesDraftInFreeText) {
  const int n = 8;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(prompt_of(i));
  for (float temperature : {0.0f, 0.4f}) {
    auto params = [&](std::vector<std::shared_ptr<ModuloConstraint>>& cs) {
      std::vector<SamplingParams> sps;
      cs.clear();
      for (int i = 0; i < n; ++i) {
        SamplingParams sp = greedy(30);
        sp.temperature = temperature;
        sp.top_k = 3;
        sp.seed = 500 + i;
        cs.push_back(std::make_shared<ModuloConstraint>());
        if (i % 4 != 3) sp.constraint = cs.back();  // and some plain requests beside them
        sps.push_back(sp);
      }
      return sps;
    };
    std::vector<std::shared_ptr<ModuloConstraint>> cp, cs;
    // (No per-step page count: a first token refused leaves a sequence with pages and no output.)
    const SpecRun plain = serve(config(0), prompts, params(cp), false);
    EngineConfig sc = config(3);
    sc.speculative.adaptive = false;
    const SpecRun spec = serve(sc, prompts, params(cs), false);
    std::printf("constrained, T=%.1f K=3: %lld drafts, %lld accepted\n", temperature, (long long)spec.drafted,
                (long long)spec.accepted);
    EXPECT_GT(spec.accepted, 0);
    EXPECT_GT(spec.redraws, 0);
    EXPECT_EQ(spec.redraws, plain.redraws) << "the same draws refused";
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "T=" << temperature << " request " << i;
      EXPECT_EQ(spec.tokens[i].size(), 30u) << "T=" << temperature << " request " << i << ": ended early";
      if (i % 4 == 3) continue;
      EXPECT_EQ(cs[size_t(i)]->seen, spec.tokens[i]) << i;
    }
  }
}

// Sampled and seeded: speculation draws one uniform per emitted token in position order, so a
// seeded request gives the same tokens as plain decoding (with host sampling: logprobs asked,
// and with the backend's sampler), and penalties see accepted drafts.
TEST(SpeculativeEngineCpu, SeededSamplingReproducesPlain) {
  const int n = 16;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> sps;
  for (int i = 0; i < n; ++i) {
    prompts.push_back(prompt_of(i));
    SamplingParams sp;
    sp.temperature = 0.4f;
    sp.top_k = 3;
    sp.seed = 1000 + i;
    sp.max_tokens = 32;
    sp.ignore_eos = true;
    if (i % 3 == 1) sp.logprobs = 1;             // host sampling
    if (i % 3 == 2) sp.frequency_penalty = 0.3f; // host sampling with penalties
    sps.push_back(sp);
  }
  const SpecRun plain = serve(config(0), prompts, sps);
  EngineConfig sc = config(3);
  sc.speculative.adaptive = false;
  const SpecRun spec = serve(sc, prompts, sps);
  std::printf("sampled K=3: %lld drafts, %lld accepted\n", (long long)spec.drafted, (long long)spec.accepted);
  EXPECT_GT(spec.accepted, 0);
  for (int i = 0; i < n; ++i) EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << i;
  // The penalized rows drawn by the backend with their logit changes (above: the draft rows'
  // penalties count the drafts before them) against the host's own penalties, plain and speculative.
  const SpecRun plain_host = serve(config(0), prompts, sps, true, true);
  const SpecRun spec_host = serve(sc, prompts, sps, true, true);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(plain_host.tokens[i], plain.tokens[i]) << i;
    EXPECT_EQ(spec_host.tokens[i], plain.tokens[i]) << i;
  }
  // the backend-sampler path alone (no row in the batch needs host logits)
  std::vector<SamplingParams> dev(sps.begin(), sps.end());
  for (auto& sp : dev) sp.logprobs = -1, sp.frequency_penalty = 0;
  const SpecRun plain_dev = serve(config(0), prompts, dev);
  const SpecRun spec_dev = serve(sc, prompts, dev);
  for (int i = 0; i < n; ++i) EXPECT_EQ(spec_dev.tokens[i], plain_dev.tokens[i]) << i;
}

// Penalties with many draft rows: prompts that end inside the loop the model falls into
// greedily, so drafts come at every step, and a penalty mild enough to leave the loop likely.
// A draft row's penalties count the drafts before it (they are tokens by then if it is used):
// the backend drawing them with its logit changes gives what the host's penalties give, with
// and without speculation, greedy and seeded.
TEST(SpeculativeEngineCpu, PenaltiesOnDraftRowsMatchTheHost) {
  std::vector<int32_t> prompt = prompt_of(1);
  const SpecRun loop = serve(config(0), {prompt}, {greedy(40)});
  prompt.insert(prompt.end(), loop.tokens[0].begin(), loop.tokens[0].end());
  const int n = 12;
  std::vector<std::vector<int32_t>> prompts(n, prompt);
  std::vector<SamplingParams> sps(n);
  for (int i = 0; i < n; ++i) {
    sps[i].temperature = i % 3 == 0 ? 0.0f : 0.5f;
    sps[i].seed = 500 + i;
    sps[i].max_tokens = 24;
    sps[i].ignore_eos = true;
    if (i % 2 == 0) sps[i].frequency_penalty = 0.01f * float(1 + i % 4);
    else sps[i].presence_penalty = 0.02f * float(1 + i % 3);
    if (i % 4 == 1) sps[i].logit_bias = {{loop.tokens[0][1], -0.05f}};
  }
  EngineConfig pc = config(0), sc = config(4);
  sc.speculative.adaptive = false;
  pc.enable_prefix_caching = sc.enable_prefix_caching = false;  // serve() counts each sequence's pages
  pc.max_num_batched_tokens = sc.max_num_batched_tokens = 4096;  // every prompt prefills in the first step
  const SpecRun plain = serve(pc, prompts, sps);
  const SpecRun spec = serve(sc, prompts, sps);
  const SpecRun spec_host = serve(sc, prompts, sps, true, true);
  std::printf("penalized K=4: %lld drafts, %lld accepted\n", (long long)spec.drafted, (long long)spec.accepted);
  EXPECT_GT(spec.accepted, 10);  // draft rows after accepted drafts, where the counts matter
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << i;
    EXPECT_EQ(spec_host.tokens[i], plain.tokens[i]) << i;
  }
}

// Sampled, different seeds for the two runs: the distribution of each output position's token
// over many requests is the same with and without speculation (chi-square test of homogeneity,
// p = 0.001 per position, pooled sparse tokens).
TEST(SpeculativeEngineCpu, SampledTokenFrequenciesMatchPlain) {
  const int n = 256, max_tokens = 8;
  // The prompt ends inside the loop the model falls into greedily, so drafts are found (and
  // often, not always, accepted) at every position.
  std::vector<int32_t> prompt = prompt_of(1);
  const SpecRun loop = serve(config(0), {prompt}, {greedy(40)});
  prompt.insert(prompt.end(), loop.tokens[0].begin(), loop.tokens[0].end());
  std::vector<std::vector<int32_t>> prompts(n, prompt);
  std::vector<SamplingParams> sps_plain(n), sps_spec(n);
  for (int i = 0; i < n; ++i) {
    SamplingParams sp;
    sp.temperature = 0.3f;
    sp.top_k = 3;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = true;
    sp.seed = 1 + i;
    sps_plain[i] = sp;
    sp.seed = 100001 + i;
    sps_spec[i] = sp;
  }
  EngineConfig pc = config(0), sc = config(4);
  sc.speculative.adaptive = false;  // verify drafts at every step, hits and misses
  pc.max_num_seqs = sc.max_num_seqs = 64;
  // identical prompts share prefix-cache pages: off here, so that serve() can count each
  // sequence's pages exactly (the other tests run with it on)
  pc.enable_prefix_caching = sc.enable_prefix_caching = false;
  pc.max_num_batched_tokens = sc.max_num_batched_tokens = 4096;  // every admitted prompt prefills in one step
  const SpecRun plain = serve(pc, prompts, sps_plain);
  const SpecRun spec = serve(sc, prompts, sps_spec);
  std::printf("sampled K=4: %lld drafts, %lld accepted\n", (long long)spec.drafted, (long long)spec.accepted);
  EXPECT_GT(spec.accepted, 50);
  EXPECT_LT(spec.accepted, spec.drafted);
  int distinct_positions = 0;
  for (int t = 0; t < max_tokens; ++t) {
    std::map<int32_t, std::pair<int, int>> counts;
    for (int i = 0; i < n; ++i) {
      ++counts[plain.tokens[i][t]].first;
      ++counts[spec.tokens[i][t]].second;
    }
    // pool tokens seen fewer than 10 times in both runs together into one category
    std::vector<std::pair<int, int>> cats;
    std::pair<int, int> rare{0, 0};
    for (auto& [tok, c] : counts) {
      if (c.first + c.second < 10) {
        rare.first += c.first;
        rare.second += c.second;
      } else {
        cats.push_back(c);
      }
    }
    if (rare.first + rare.second > 0) cats.push_back(rare);
    if (cats.size() < 2) continue;
    ++distinct_positions;
    double chi2 = 0;
    for (auto [a, b] : cats) {
      const double e = (a + b) / 2.0;  // equal sample sizes
      chi2 += (a - e) * (a - e) / e + (b - e) * (b - e) / e;
    }
    // the chi-square critical value at p = 0.001 (Wilson-Hilferty; z = 3.09)
    const double df = double(cats.size()) - 1, h = 2.0 / (9.0 * df);
    const double crit = df * std::pow(1.0 - h + 3.09 * std::sqrt(h), 3.0);
    std::printf("position %d: chi2 %.2f, df %.0f, critical %.2f\n", t, chi2, df, crit);
    EXPECT_LT(chi2, crit) << "position " << t << " df " << df;
  }
  EXPECT_GE(distinct_positions, 4);  // the test is not vacuous: positions really vary
  // and with the same seeds, the very same tokens (many drafts accepted and rejected here)
  const SpecRun plain_same_seeds = serve(pc, prompts, sps_spec);
  for (int i = 0; i < n; ++i) EXPECT_EQ(spec.tokens[i], plain_same_seeds.tokens[i]) << i;
}
