#include <algorithm>
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

// A loop model (LoopSpec): greedy decoding walks the cycle from wherever it enters it, on top of
// random layers; the cycle must fit the hidden size and the vocabulary.
TEST(MakeModel, LoopModelGreedyWalksTheCycle) {
  auto d = test::temp_dir("mm-loop");
  LoopSpec loop;
  loop.tokens = 8;
  make_random_model(GptOssConfig::preset("tiny"), d, 11, size_t(4) << 30, loop);
  auto be = make_cpu_backend(ModelWeights::load(d));
  SoloSequence seq(*be, 64);
  const int first = loop.first_id, n = loop.tokens;
  // Enter the cycle mid-way, after unrelated tokens.
  auto logits = seq.append({5, 77, 123, first + 5}, false);
  int expect = first + 6;
  for (int step = 0; step < 24; ++step) {
    const int got = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ASSERT_EQ(got, expect) << "step " << step;
    logits = seq.append({got}, false);
    expect = first + (got - first + 1) % n;
  }
  GptOssConfig c = GptOssConfig::preset("tiny");
  LoopSpec too_long;
  too_long.tokens = c.hidden + 1;
  EXPECT_THROW(too_long.check(c), Error);
  LoopSpec past_vocab;
  past_vocab.tokens = 8;
  past_vocab.first_id = c.vocab - 4;
  EXPECT_THROW(past_vocab.check(c), Error);
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
