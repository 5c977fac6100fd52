// A missing, truncated or mis-shaped checkpoint gets one clear error naming the file and
// tensor, never a crash.
#include <nlohmann/json.hpp>

#include <fstream>

#include "common/error.h"
#include "model/make_model.h"
#include "model/weights.h"
#include "test_util.h"

namespace gptoss {
namespace {

namespace fs = std::filesystem;

std::string fresh_model(const std::string& name) {
  std::string d = test::temp_dir(name);
  auto c = GptOssConfig::preset("tiny");
  c.vocab = 512;  // small shards, quick tests
  make_random_model(c, d, 1, /*shard_bytes=*/1 << 18);
  return d;
}

// Runs load() and returns the error message (fails the test if it does not throw).
std::string load_error(const std::string& dir) {
  try {
    ModelWeights::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "load(" << dir << ") did not fail";
  return "";
}

std::string first_shard(const std::string& dir) {
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") return e.path().string();
  return "";
}

// Rewrites one tensor's header entry of a safetensors file through `edit`.
void edit_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t hlen;
  std::memcpy(&hlen, bytes.data(), 8);
  auto h = nlohmann::json::parse(bytes.substr(8, hlen));
  edit(h);
  std::string hs = h.dump();
  while (hs.size() < hlen) hs.push_back(' ');
  ASSERT_EQ(hs.size(), hlen) << "edited header must keep its length";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), 8);
  out.write(hs.data(), std::streamsize(hs.size()));
  out.write(bytes.data() + 8 + hlen, std::streamsize(bytes.size() - 8 - hlen));
}

TEST(CheckpointErrors, FreshModelLoads) {
  auto d = fresh_model("ok");
  auto w = ModelWeights::load(d);
  EXPECT_EQ(w->config.num_layers, 2);
  EXPECT_EQ(w->layers.size(), 2u);
}

TEST(CheckpointErrors, MissingDirectory) {
  EXPECT_NE(load_error("/nonexistent/model").find("/nonexistent/model"), std::string::npos);
}

TEST(CheckpointErrors, MissingConfig) {
  auto d = fresh_model("noconfig");
  fs::remove(fs::path(d) / "config.json");
  EXPECT_NE(load_error(d).find("config.json"), std::string::npos);
}

TEST(CheckpointErrors, ConfigMissingKey) {
  auto d = fresh_model("badconfig");
  auto p = fs::path(d) / "config.json";
  auto j = nlohmann::json::parse(std::ifstream(p));
  j.erase("num_local_experts");
  std::ofstream(p) << j.dump();
  auto msg = load_error(d);
  EXPECT_NE(msg.find("num_local_experts"), std::string::npos) << msg;
}

TEST(CheckpointErrors, ConfigInvalidJson) {
  auto d = fresh_model("badjson");
  std::ofstream(fs::path(d) / "config.json") << "{\"hidden_size\": ";
  EXPECT_NE(load_error(d).find("invalid JSON"), std::string::npos);
}

TEST(CheckpointErrors, ShardListedButMissing) {
  auto d = fresh_model("noshard");
  auto shard = first_shard(d);
  fs::remove(shard);
  auto msg = load_error(d);
  EXPECT_NE(msg.find(fs::path(shard).filename().string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(CheckpointErrors, TruncatedShard) {
  auto d = fresh_model("trunc");
  auto shard = first_shard(d);
  fs::resize_file(shard, fs::file_size(shard) / 2);
  auto msg = load_error(d);
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(CheckpointErrors, TruncatedHeader) {
  auto d = fresh_model("trunchdr");
  auto shard = first_shard(d);
  fs::resize_file(shard, 20);
  auto msg = load_error(d);
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(CheckpointErrors, TensorWithWrongShape) {
  auto d = fresh_model("shape");
  std::string shard;
  // Find the shard holding layer 0's q_proj and swap its two dimensions.
  for (auto& e : fs::directory_iterator(d))
    if (e.path().extension() == ".safetensors") {
      SafetensorsFile f(e.path().string());
      if (f.find("model.layers.0.self_attn.k_proj.weight")) shard = e.path().string();
    }
  ASSERT_FALSE(shard.empty());
  edit_header(shard, [](nlohmann::json& h) {
    auto& t = h["model.layers.0.self_attn.k_proj.weight"];
    auto s = t["shape"].get<std::vector<int64_t>>();
    t["shape"] = {s[1], s[0]};
  });
  auto msg = load_error(d);
  EXPECT_NE(msg.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
}

TEST(CheckpointErrors, TensorWithWrongDtype) {
  auto d = fresh_model("dtype");
  std::string victim, shard;
  for (auto& e : fs::directory_iterator(d))
    if (e.path().extension() == ".safetensors" && victim.empty()) {
      SafetensorsFile f(e.path().string());
      for (auto& [n, t] : f.tensors())
        if (n.find("_scales") != std::string::npos) {
          victim = n;
          shard = e.path().string();
          break;
        }
    }
  ASSERT_FALSE(victim.empty());
  edit_header(shard, [&](nlohmann::json& h) { h[victim]["dtype"] = "I32"; h[victim]["shape"].back() = h[victim]["shape"].back().get<int>() / 4; });
  ASSERT_FALSE(victim.empty());
  auto msg = load_error(d);
  EXPECT_NE(msg.find(victim), std::string::npos) << msg;
}

TEST(CheckpointErrors, MissingTensor) {
  auto d = fresh_model("missing");
  auto idx = fs::path(d) / "model.safetensors.index.json";
  auto j = nlohmann::json::parse(std::ifstream(idx));
  // Rename a tensor in its shard so the index and the data disagree: load must name it.
  std::string shard = (fs::path(d) / j["weight_map"]["model.layers.1.mlp.router.bias"].get<std::string>()).string();
  edit_header(shard, [](nlohmann::json& h) {
    h["model.layers.1.mlp.router.bia_"] = h["model.layers.1.mlp.router.bias"];
    h.erase("model.layers.1.mlp.router.bias");
  });
  auto msg = load_error(d);
  EXPECT_NE(msg.find("model.layers.1.mlp.router.bias"), std::string::npos) << msg;
}

TEST(CheckpointErrors, GarbageHeader) {
  auto d = fresh_model("garbage");
  auto shard = first_shard(d);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("nonsense", 8);
  }
  auto msg = load_error(d);
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
}

}  // namespace
}  // namespace gptoss
