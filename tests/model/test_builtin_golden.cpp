// The trained built-in model (models/builtin/) on the CPU backend against Hugging Face
// transformers' float32 output for the same expanded checkpoint (tests/data/builtin-golden, made
// by tools/train_builtin/golden.py in the training run). Skipped until both are committed.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "backend/solo_sequence.h"
#include "model/builtin_artifact.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace gptoss {
namespace {

namespace fs = std::filesystem;

const std::string kGolden = std::string(GPTOSS_TEST_DATA) + "/builtin-golden";
const std::string kArtifact = std::string(GPTOSS_TEST_DATA) + "/../../models/builtin/gptoss-builtin.safetensors";

TEST(BuiltinGolden, LogitsAndGreedyTokensMatchTransformers) {
  if (!fs::exists(kArtifact) || !fs::exists(kGolden + "/golden.json"))
    GTEST_SKIP() << "no trained built-in model or no golden files (tools/train_builtin/README.md)";
  auto dir = test::temp_dir("builtin-golden");
  expand_builtin_artifact(kArtifact, dir);
  auto j = nlohmann::json::parse(std::ifstream(kGolden + "/golden.json"));
  auto prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  auto greedy = j["greedy_continuations"].get<std::vector<std::vector<int32_t>>>();
  auto columns = j["columns"].get<std::vector<int32_t>>();
  SafetensorsFile ref_file(kGolden + "/golden_logits.safetensors");
  auto be = make_cpu_backend(ModelWeights::load(dir));
  const size_t V = 201088;
  ASSERT_FALSE(prompts.empty());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const TensorView* ref = ref_file.find("logits_" + std::to_string(i));
    ASSERT_NE(ref, nullptr);
    ASSERT_EQ(ref->shape, (std::vector<int64_t>{int64_t(prompts[i].size()), int64_t(columns.size())}));
    SoloSequence seq(*be, int(prompts[i].size() + greedy[i].size()));
    auto all = seq.append(prompts[i], true);
    ASSERT_EQ(all.size(), prompts[i].size() * V);
    std::vector<float> got;
    for (size_t r = 0; r < prompts[i].size(); ++r)
      for (int32_t c : columns) got.push_back(all[r * V + size_t(c)]);
    double err = test::rel_error(got.data(), reinterpret_cast<const float*>(ref->data), got.size());
    std::printf("prompt %zu (%zu tokens): relative error %.3g\n", i, prompts[i].size(), err);
    EXPECT_LE(err, 1e-4) << "prompt " << i;
    // Greedy decoding through the KV cache (no EOS stop), as transformers' generate did.
    std::vector<float> last(all.end() - long(V), all.end());
    std::vector<int32_t> tokens;
    for (size_t s = 0; s < greedy[i].size(); ++s) {
      int t = int(std::max_element(last.begin(), last.end()) - last.begin());
      tokens.push_back(t);
      last = seq.append({t}, false);
    }
    EXPECT_EQ(tokens, greedy[i]) << "prompt " << i;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gptoss
