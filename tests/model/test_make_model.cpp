#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/solo_sequence.h"
#include "model/make_model.h"
#include "model/weights.h"
#include "test_util.h"

namespace gptoss {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

TEST(MakeModel, SameSeedSameFiles) {
  auto a = test::temp_dir("mm-a"), b = test::temp_dir("mm-b"), c = test::temp_dir("mm-c");
  auto cfg = GptOssConfig::preset("tiny");
  cfg.vocab = 4096;
  make_random_model(cfg, a, 42, 1 << 19);
  make_random_model(cfg, b, 42, 1 << 19);
  make_random_model(cfg, c, 43, 1 << 19);
  int files = 0;
  for (auto& e : fs::directory_iterator(a)) {
    auto name = e.path().filename();
    ASSERT_TRUE(fs::exists(fs::path(b) / name)) << name;
    EXPECT_EQ(read_all(e.path()), read_all(fs::path(b) / name)) << name;
    if (e.path().extension() == ".safetensors") {
      EXPECT_NE(read_all(e.path()), read_all(fs::path(c) / name)) << "seed must matter: " << name;
      ++files;
    }
  }
  EXPECT_GE(files, 2) << "1 MB shards must split the tiny model";
}

TEST(MakeModel, LoadsAndRuns) {
  auto d = test::temp_dir("mm-run");
  make_random_model(GptOssConfig::preset("tiny"), d, 7);
  auto w = ModelWeights::load(d);
  EXPECT_EQ(w->config.vocab, 201088);
  EXPECT_TRUE(w->config.layer_sliding[0]);
  EXPECT_FALSE(w->config.layer_sliding[1]);
  auto be = make_cpu_backend(w);
  SoloSequence seq(*be, 40);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 33; ++i) prompt.push_back((i * 7919) % 200000);
  auto logits = seq.append(prompt, false);
  double ss = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    ss += double(v) * v;
  }
  EXPECT_GT(ss, 0.0);
}

TEST(MakeModel, ConfigRoundTrips) {
  for (auto name : {"tiny", "20b", "120b"}) {
    auto c = GptOssConfig::preset(name);
    auto back = GptOssConfig::from_json(c.to_json(), name);
    EXPECT_EQ(back.hidden, c.hidden);
    EXPECT_EQ(back.num_layers, c.num_layers);
    EXPECT_EQ(back.num_experts, c.num_experts);
    EXPECT_EQ(back.layer_sliding, c.layer_sliding);
    EXPECT_DOUBLE_EQ(back.rope.factor, c.rope.factor);
  }
  EXPECT_EQ(GptOssConfig::preset("120b").num_layers, 36);
  EXPECT_EQ(GptOssConfig::preset("20b").num_experts, 32);
  EXPECT_THROW(GptOssConfig::preset("7b"), Error);
}

}  // namespace
}  // namespace gptoss
