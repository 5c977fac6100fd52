// The CPU backend against transformers on tests/data/tiny-gptoss-clamp: a fixture whose MLP
// activations reach the swiglu clamp and whose router has exact ties on the top-k boundary
// (two experts with identical router rows per layer). Made by tests/tools/make_golden.py,
// which records in golden.json how often the clamp fired and every tie with the expert
// torch.topk chose; this test first checks the fixture really exercises both.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "backend/solo_sequence.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace gptoss {
namespace {

const std::string kClampFixture = std::string(GPTOSS_TEST_DATA) + "/tiny-gptoss-clamp";

// Relative L2 error allowed against transformers' float32 logits. The tiny-gptoss golden
// measures ~2e-7 and allows 1e-6; activations here are larger and clamped (a value at the limit
// is exact on both sides, but larger sums round more), so allow 10x that until this fixture's
// own figure is measured (the test prints it). The clamp limit off by one (7 -> 8) or a tie
// sent to the other expert moves logits by far more (WithoutTheClampTheLogitsMiss shows the
// size of the clamp's effect).
constexpr double kLogitsTol = 1e-5;

struct ClampGolden {
  nlohmann::json meta;
  std::unique_ptr<SafetensorsFile> logits;
};

ClampGolden load_clamp_golden() {
  ClampGolden g;
  std::ifstream f(kClampFixture + "/golden.json");
  g.meta = nlohmann::json::parse(f);
  g.logits = std::make_unique<SafetensorsFile>(kClampFixture + "/golden_logits.safetensors");
  return g;
}

#define SKIP_WITHOUT_FIXTURE()                                                                               \
  if (!std::filesystem::exists(kClampFixture + "/golden.json"))                                             \
  GTEST_SKIP() << "tests/data/tiny-gptoss-clamp is absent: generate it on a machine with torch and "          \
                  "transformers (python3 tests/tools/make_golden.py OUT --only tiny-gptoss-clamp) and copy " \
                  "OUT/tiny-gptoss-clamp to tests/data (see tests/data/README.md)"

// torch.topk on the CPU has no consistent tie rule (the fixture's run: 10 of 16 boundary ties to
// the lower expert index, 6 to the higher; tests/tools/topk_ties.py shows it varies with the
// pattern), while the engine always takes the lower index (as a stable sort does, and as torch
// did on CUDA for every boundary tie topk_ties.py measured). So rows from the first tie that
// transformers resolved toward the higher expert on are left out: that tie routes the token
// elsewhere, and through attention every later row. Rows before it must match.
int rows_comparable(const ClampGolden& g, size_t prompt) {
  int rows = int(g.meta["prompts"][prompt].size());
  for (const auto& t : g.meta["router_ties"]) {
    if (t["prompt"].get<size_t>() != prompt) continue;
    const auto tied = t["tied_experts"].get<std::vector<int>>();
    const auto topk = t["topk"].get<std::vector<int>>();
    const bool lower = std::find(topk.begin(), topk.end(), std::min(tied[0], tied[1])) != topk.end();
    if (!lower) rows = std::min(rows, t["row"].get<int>());
  }
  return rows;
}

double prefill_error(const ModelWeights& w, const ClampGolden& g, size_t i, std::vector<float>* out = nullptr) {
  auto be = make_cpu_backend(std::make_shared<const ModelWeights>(w));
  const auto prompt = g.meta["prompts"][i].get<std::vector<int32_t>>();
  SoloSequence seq(*be, int(prompt.size()));
  auto logits = seq.append(prompt, true);
  const TensorView* ref = g.logits->find("logits_" + std::to_string(i));
  EXPECT_NE(ref, nullptr);
  if (!ref) return INFINITY;
  EXPECT_EQ(ref->shape, (std::vector<int64_t>{int64_t(prompt.size()), w.config.vocab}));
  if (out) *out = logits;
  const size_t n = size_t(rows_comparable(g, i)) * w.config.vocab;
  if (n == 0) return 0.0;
  return test::rel_error(logits.data(), reinterpret_cast<const float*>(ref->data), n);
}

TEST(GoldenClamp, FixtureExercisesTheClampAndRouterTies) {
  SKIP_WITHOUT_FIXTURE();
  ClampGolden g = load_clamp_golden();
  const auto& c = g.meta.at("swiglu_clamp");
  EXPECT_EQ(c.at("limit"), 7.0);
  EXPECT_GT(c.at("gate_above_limit").get<int>(), 0);
  EXPECT_GT(c.at("up_outside_limit").get<int>(), 0);
  EXPECT_GT(g.meta.at("router_ties").size(), 0u);
  // At least one prompt keeps rows past a tie torch resolved to the lower index, so the engine's
  // rule is exercised against transformers (see rows_comparable).
  int lower_ties_compared = 0;
  for (const auto& t : g.meta["router_ties"]) {
    const auto tied = t["tied_experts"].get<std::vector<int>>();
    const auto topk = t["topk"].get<std::vector<int>>();
    const bool lower = std::find(topk.begin(), topk.end(), std::min(tied[0], tied[1])) != topk.end();
    if (lower && t["row"].get<int>() < rows_comparable(g, t["prompt"].get<size_t>())) ++lower_ties_compared;
  }
  EXPECT_GT(lower_ties_compared, 0);
  std::printf("torch's tie rule in this run: %s; ties compared: %d\n",
              g.meta.at("router_tie_rule").get<std::string>().c_str(), lower_ties_compared);
  std::printf("fixture: %d gate and %d up values past the clamp in %d routed pairs; %zu router ties\n",
              c["gate_above_limit"].get<int>(), c["up_outside_limit"].get<int>(), c["routed_pairs"].get<int>(),
              g.meta["router_ties"].size());
}

TEST(GoldenClamp, PrefillLogitsAndGreedyMatchTransformers) {
  SKIP_WITHOUT_FIXTURE();
  ClampGolden g = load_clamp_golden();
  auto w = ModelWeights::load(kClampFixture);
  EXPECT_EQ(w->config.swiglu_limit, 7.0f);
  for (size_t i = 0; i < g.meta["prompts"].size(); ++i) {
    double err = prefill_error(*w, g, i);
    EXPECT_LE(err, kLogitsTol) << "prompt " << i;
    std::printf("prompt %zu: relative error %.3g\n", i, err);
  }
  // No greedy comparison here: the continuations pass through more tied routings, which the
  // fixture does not record and torch resolves either way (prompt 0 parts at its third step);
  // tests/data/tiny-gptoss's golden checks greedy decoding through the KV cache.
}

// The fixture separates: without the clamp (limit raised out of reach) the same weights miss
// transformers by far more than the tolerance, so the match above depends on the clamp.
TEST(GoldenClamp, WithoutTheClampTheLogitsMiss) {
  SKIP_WITHOUT_FIXTURE();
  ClampGolden g = load_clamp_golden();
  ModelWeights unclamped = *ModelWeights::load(kClampFixture);
  unclamped.config.swiglu_limit = 1e30f;
  double err = prefill_error(unclamped, g, 2);
  EXPECT_GT(err, 100 * kLogitsTol);
  std::printf("without the clamp: relative error %.3g\n", err);
}

}  // namespace
}  // namespace gptoss
