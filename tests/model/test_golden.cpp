// The CPU backend against Hugging Face transformers' own float32 output on the tiny fixture.
#include <nlohmann/json.hpp>

#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "backend/decode_batch.h"
#include "backend/solo_sequence.h"
#include "common/error.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace gptoss {
namespace {

const std::string kFixture = std::string(GPTOSS_TEST_DATA) + "/tiny-gptoss";

struct Golden {
  std::vector<std::vector<int32_t>> prompts, greedy;
  std::unique_ptr<SafetensorsFile> logits;
};

Golden load_golden() {
  Golden g;
  std::ifstream f(kFixture + "/golden.json");
  auto j = nlohmann::json::parse(f);
  g.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  g.greedy = j["greedy_continuations"].get<std::vector<std::vector<int32_t>>>();
  g.logits = std::make_unique<SafetensorsFile>(kFixture + "/golden_logits.safetensors");
  return g;
}

int argmax(const float* v, int n) { return int(std::max_element(v, v + n) - v); }

TEST(Golden, PrefillLogitsMatchTransformers) {
  Golden g = load_golden();
  auto w = ModelWeights::load(kFixture);
  auto be = make_cpu_backend(w);
  const int V = w->config.vocab;
  ASSERT_EQ(g.prompts.size(), 3u);
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    SoloSequence seq(*be, int(g.prompts[i].size()));
    auto logits = seq.append(g.prompts[i], true);
    const TensorView* ref = g.logits->find("logits_" + std::to_string(i));
    ASSERT_NE(ref, nullptr);
    ASSERT_EQ(ref->shape, (std::vector<int64_t>{int64_t(g.prompts[i].size()), V}));
    double err = test::rel_error(logits.data(), reinterpret_cast<const float*>(ref->data), logits.size());
    // Both sides are float32; they differ only in summation order and libm: measured 1.3e-7 to
    // 2.1e-7 (2026-11-30). 1e-6 leaves 5x for other compilers' vectorization; any difference in
    // the math (RoPE, sinks, window, routing, clamp) moves logits by >1e-3.
    EXPECT_LE(err, 1e-6) << "prompt " << i;
    RecordProperty("rel_error_" + std::to_string(i), std::to_string(err));
    std::printf("prompt %zu (%zu tokens): relative error %.3g\n", i, g.prompts[i].size(), err);
  }
}

TEST(Golden, GreedyContinuationsMatchTransformers) {
  Golden g = load_golden();
  auto w = ModelWeights::load(kFixture);
  auto be = make_cpu_backend(w);
  const int V = w->config.vocab;
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    const auto& want = g.greedy[i];
    SoloSequence seq(*be, int(g.prompts[i].size() + want.size()));
    auto logits = seq.append(g.prompts[i], false);
    std::vector<int32_t> got;
    for (size_t s = 0; s < want.size(); ++s) {
      int t = argmax(logits.data(), V);
      got.push_back(t);
      logits = seq.append({t}, false);
    }
    EXPECT_EQ(got, want) << "prompt " << i;
  }
}

// The three prompts decoding together (DecodeBatch): each step's ids read before the next is
// launched, and pipelined (launch_greedy, the backend's default: each pass run at its launch, the
// tokens of the next taken from its ids), give transformers' greedy continuations.
TEST(Golden, BatchedAndPipelinedGreedyMatchTransformers) {
  Golden g = load_golden();
  auto w = ModelWeights::load(kFixture);
  auto be = make_cpu_backend(w);
  const int S = int(g.prompts.size()), steps = int(g.greedy[0].size()) - 1, per = 8;
  KvCacheConfig kv;
  kv.page_size = 16;
  kv.num_pages[kKvFull] = kv.num_pages[kKvSliding] = S * per;
  for (bool pipelined : {false, true}) {
    be->init_kv_cache(kv);
    std::vector<std::vector<int32_t>> pages(S);
    for (int q = 0; q < S; ++q)
      for (int i = 0; i < per; ++i) pages[q].push_back(q + S * i);  // interleaved
    DecodeBatch batch(*be, pages);
    for (int q = 0; q < S; ++q) batch.prefill(q, g.prompts[q]);
    for (int q = 0; q < S; ++q) EXPECT_EQ(batch.next()[q], g.greedy[q][0]);
    const auto ids = batch.decode(steps, pipelined);
    for (int q = 0; q < S; ++q)
      for (int i = 0; i < steps; ++i)
        EXPECT_EQ(ids[i][q], g.greedy[q][i + 1]) << (pipelined ? "pipelined" : "step by step") << ", prompt " << q
                                                 << ", step " << i;
  }
}

// launch_greedy refuses what it cannot pipeline, with a clear error.
TEST(Golden, PipelinedGreedyRefusesBadUse) {
  auto w = ModelWeights::load(kFixture);
  auto be = make_cpu_backend(w);
  SoloSequence seq(*be, 32);  // sizes the cache: pages 0 and 1
  const int32_t pages[2] = {0, 1};
  auto one = [&](int pos) {
    ForwardBatch fb;
    fb.tokens = {5};
    SeqBatchInfo s;
    s.n_tokens = 1;
    s.start_pos = pos;
    for (int gr = 0; gr < 2; ++gr) {
      s.pages[gr] = pages;
      s.n_pages[gr] = 2;
    }
    fb.seqs.push_back(s);
    fb.logit_rows.push_back(0);
    return fb;
  };
  EXPECT_THROW(be->launch_greedy(one(0), true), Error);  // no pass before it
  ForwardBatch two_tokens = one(0);
  two_tokens.tokens = {5, 6};
  two_tokens.seqs[0].n_tokens = 2;
  two_tokens.logit_rows = {1};
  EXPECT_THROW(be->launch_greedy(two_tokens, false), Error);  // not one token a sequence
  int32_t id = -1;
  EXPECT_THROW(be->finish_greedy(&id), Error);  // nothing launched
  be->launch_greedy(one(0), false);
  be->launch_greedy(one(1), true);
  EXPECT_THROW(be->launch_greedy(one(2), true), Error);  // a third in flight
  be->finish_greedy(&id);
  EXPECT_GE(id, 0);
  be->finish_greedy(&id);
  EXPECT_GE(id, 0);
}

// Decoding one token at a time through the KV cache must give the logits of a full prefill,
// across the sliding-window boundary (window 8 in the fixture; 45 tokens crosses it 5 times),
// and for prefill chunks of awkward sizes.
TEST(KvCache, IncrementalDecodeEqualsFullPrefill) {
  Golden g = load_golden();
  auto w = ModelWeights::load(kFixture);
  auto be = make_cpu_backend(w);
  const int V = w->config.vocab;
  const auto& prompt = g.prompts[2];
  ASSERT_GT(int(prompt.size()), 2 * w->config.sliding_window);
  std::vector<float> full;
  {
    SoloSequence seq(*be, int(prompt.size()));
    full = seq.append(prompt, true);
  }
  for (int chunk : {1, 3, 7, 9, 16}) {
    SoloSequence seq(*be, int(prompt.size()), /*page_size=*/chunk == 3 ? 4 : 16);
    std::vector<float> inc;
    for (size_t p = 0; p < prompt.size(); p += chunk) {
      std::vector<int32_t> part(prompt.begin() + p, prompt.begin() + std::min(prompt.size(), p + chunk));
      auto l = seq.append(part, true);
      inc.insert(inc.end(), l.begin(), l.end());
    }
    ASSERT_EQ(inc.size(), full.size());
    double err = test::rel_error(inc.data(), full.data(), full.size());
    // Exact: every token row is computed on its own with a fixed summation order (see
    // docs/ARCHITECTURE.md), so chunking a prefill cannot change a bit (measured: 0).
    EXPECT_EQ(err, 0.0) << "chunk " << chunk;
    for (size_t r = 0; r < prompt.size(); ++r)
      EXPECT_EQ(argmax(&inc[r * V], V), argmax(&full[r * V], V)) << "chunk " << chunk << " row " << r;
  }
}

// Several sequences in one forward pass give each the logits it gets alone.
TEST(Batch, SequencesInOneForwardMatchAlone) {
  Golden g = load_golden();
  auto w = ModelWeights::load(kFixture);
  auto be = make_cpu_backend(w);
  const int V = w->config.vocab;
  std::vector<std::vector<float>> alone;
  for (auto& p : g.prompts) {
    SoloSequence seq(*be, int(p.size()));
    alone.push_back(seq.append(p, true));
  }
  // One batch: three sequences with disjoint pages.
  const int ps = 8;
  KvCacheConfig kv;
  kv.page_size = ps;
  kv.num_pages[0] = kv.num_pages[1] = 32;
  be->init_kv_cache(kv);
  ForwardBatch fb;
  std::vector<std::vector<int32_t>> tables(3);
  int next_page = 0;
  for (size_t i = 0; i < 3; ++i) {
    const auto& p = g.prompts[i];
    int pages = int((p.size() + ps - 1) / ps);
    // Allocate pages in reverse so sequences interleave in the pool.
    for (int k = 0; k < pages; ++k) tables[i].push_back(31 - next_page++);
    SeqBatchInfo s;
    s.first_token = int(fb.tokens.size());
    s.n_tokens = int(p.size());
    s.start_pos = 0;
    for (int gidx = 0; gidx < 2; ++gidx) {
      s.pages[gidx] = tables[i].data();
      s.n_pages[gidx] = pages;
    }
    fb.seqs.push_back(s);
    for (size_t t = 0; t < p.size(); ++t) fb.logit_rows.push_back(int(fb.tokens.size() + t));
    fb.tokens.insert(fb.tokens.end(), p.begin(), p.end());
  }
  std::vector<float> logits(fb.logit_rows.size() * V);
  be->forward(fb, logits.data());
  size_t row = 0;
  for (size_t i = 0; i < 3; ++i) {
    for (size_t t = 0; t < g.prompts[i].size(); ++t, ++row)
      for (int v = 0; v < V; ++v) ASSERT_EQ(logits[row * V + v], alone[i][t * V + v]) << "seq " << i << " tok " << t;
  }
}

TEST(KvCache, Fp8CacheStaysClose) {
  Golden g = load_golden();
  auto w = ModelWeights::load(kFixture);
  auto be = make_cpu_backend(w);
  const auto& prompt = g.prompts[2];
  SoloSequence a(*be, int(prompt.size()));
  auto ref = a.append(prompt, true);
  SoloSequence b(*be, int(prompt.size()), 16, DType::F8_E4M3);
  auto got = b.append(prompt, true);
  double err = test::rel_error(got.data(), ref.data(), ref.size());
  std::printf("fp8 cache: relative error %.3g\n", err);
  EXPECT_GT(err, 0.0);  // the rounding is really applied
  // e4m3 keeps 3 mantissa bits (rounding up to 1/16 of each K/V element): measured 1.3e-2 on
  // this prompt; 2.5e-2 (2x) still fails a cache stored or read in the wrong format.
  EXPECT_LE(err, 2.5e-2);
}

}  // namespace
}  // namespace gptoss
