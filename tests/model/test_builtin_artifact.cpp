// The built-in model's compact artifact (model/builtin_artifact.h): a checkpoint compacted to
// the rows of some tokens plus one shared row, then expanded, must equal the original wherever
// the original's rows were kept, use the shared row everywhere else, and compute the same logits.
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/solo_sequence.h"
#include "common/error.h"
#include "model/builtin_artifact.h"
#include "model/make_model.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace gptoss {
namespace {

namespace fs = std::filesystem;

constexpr int kShared = 1;  // the token whose rows become the shared row (never in `seen`)

bool is_seen(int id) { return id % 3 == 0; }

// Writes the artifact for checkpoint `dir`: rows of the tokens is_seen() keeps, row kShared as
// the shared one. `drop`: a tensor to leave out; `unsorted`: swap two ids.
void compact(const std::string& dir, const std::string& out, const std::string& drop = "", bool unsorted = false) {
  Checkpoint ck(dir);
  std::ifstream cf(fs::path(dir) / "config.json");
  std::string cfg((std::istreambuf_iterator<char>(cf)), {});
  auto vocab = nlohmann::json::parse(cfg)["vocab_size"].get<int>();
  std::vector<int32_t> ids;
  for (int i = 0; i < vocab; ++i)
    if (is_seen(i)) ids.push_back(i);
  if (unsorted) std::swap(ids[3], ids[4]);
  std::vector<TensorSpec> specs;
  specs.push_back({"builtin.config", DType::U8, {int64_t(cfg.size())}});
  specs.push_back({"builtin.token_ids", DType::I32, {int64_t(ids.size())}});
  for (const auto& n : ck.names()) {
    const auto& t = ck.get(n);
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight")
      specs.push_back({n.substr(0, n.size() - 7) + ".rows", t.dtype, {int64_t(ids.size()) + 1, t.shape[1]}});
    else
      specs.push_back({n, t.dtype, t.shape});
  }
  std::erase_if(specs, [&](const TensorSpec& s) { return s.name == drop; });
  write_safetensors(out, specs, [&](const TensorSpec& s, uint8_t* p) {
    if (s.name == "builtin.config") return void(std::memcpy(p, cfg.data(), cfg.size()));
    if (s.name == "builtin.token_ids") return void(std::memcpy(p, ids.data(), ids.size() * 4));
    if (s.name.ends_with(".rows")) {
      const auto& full = ck.get(s.name.substr(0, s.name.size() - 5) + ".weight");
      size_t row = size_t(full.shape[1]) * 2;
      for (size_t j = 0; j < ids.size(); ++j) std::memcpy(p + j * row, full.data + size_t(ids[j]) * row, row);
      std::memcpy(p + ids.size() * row, full.data + size_t(kShared) * row, row);
      return;
    }
    const auto& t = ck.get(s.name);
    std::memcpy(p, t.data, t.nbytes);
  });
}

struct BuiltinArtifact : ::testing::Test {
  static void SetUpTestSuite() {
    dir = test::temp_dir("builtin-src");
    auto cfg = GptOssConfig::preset("tiny");
    cfg.vocab = 3000;
    make_random_model(cfg, dir, 11);
  }
  static inline std::string dir;
};

TEST_F(BuiltinArtifact, ExpansionRestoresTheCheckpoint) {
  auto work = test::temp_dir("builtin-rt");
  compact(dir, work + "/a.safetensors");
  expand_builtin_artifact(work + "/a.safetensors", work + "/out");
  auto cfg_of = [](const fs::path& p) { return nlohmann::json::parse(std::ifstream(p / "config.json")); };
  EXPECT_EQ(cfg_of(dir), cfg_of(work + "/out"));
  Checkpoint a(dir), b(work + "/out");
  EXPECT_EQ(a.names(), b.names());
  for (const auto& n : a.names()) {
    const auto &ta = a.get(n), &tb = b.get(n);
    ASSERT_EQ(ta.dtype, tb.dtype) << n;
    ASSERT_EQ(ta.shape, tb.shape) << n;
    if (n != "model.embed_tokens.weight" && n != "lm_head.weight") {
      EXPECT_EQ(0, std::memcmp(ta.data, tb.data, ta.nbytes)) << n;
      continue;
    }
    size_t row = size_t(ta.shape[1]) * 2;
    for (int64_t r = 0; r < ta.shape[0]; ++r) {
      int64_t src = is_seen(int(r)) ? r : kShared;
      ASSERT_EQ(0, std::memcmp(ta.data + size_t(src) * row, tb.data + size_t(r) * row, row)) << n << " row " << r;
    }
  }
}

TEST_F(BuiltinArtifact, ExpandedModelComputesTheSameLogits) {
  auto work = test::temp_dir("builtin-logits");
  compact(dir, work + "/a.safetensors");
  expand_builtin_artifact(work + "/a.safetensors", work + "/out");
  std::vector<int32_t> prompt;  // seen tokens and the shared one, whose rows are unchanged
  for (int i = 0; i < 40; ++i) prompt.push_back(i % 5 == 4 ? kShared : (i * 37 % 900) * 3);
  auto run = [&](const std::string& d) {
    auto be = make_cpu_backend(ModelWeights::load(d));
    SoloSequence seq(*be, 64);
    return seq.append(prompt, false);
  };
  auto la = run(dir), lb = run(work + "/out");
  ASSERT_EQ(la.size(), lb.size());
  for (size_t v = 0; v < la.size(); ++v) {
    // Seen tokens keep their logit; every other token scores like the shared row's token.
    float want = is_seen(int(v)) || int(v) == kShared ? la[v] : la[kShared];
    ASSERT_EQ(want, lb[v]) << "token " << v;
  }
}

TEST_F(BuiltinArtifact, MalformedArtifactsAreRefusedByName) {
  auto work = test::temp_dir("builtin-bad");
  compact(dir, work + "/nolm.safetensors", "lm_head.rows");
  try {
    expand_builtin_artifact(work + "/nolm.safetensors", work + "/o1");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.rows"), std::string::npos) << e.what();
  }
  compact(dir, work + "/unsorted.safetensors", "", /*unsorted=*/true);
  try {
    expand_builtin_artifact(work + "/unsorted.safetensors", work + "/o2");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ascending"), std::string::npos) << e.what();
  }
  compact(dir, work + "/noconfig.safetensors", "builtin.config");
  EXPECT_THROW(expand_builtin_artifact(work + "/noconfig.safetensors", work + "/o3"), Error);
}

}  // namespace
}  // namespace gptoss
