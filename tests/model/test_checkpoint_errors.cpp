// A missing, truncated or mis-shaped checkpoint gets one clear error naming the file and
// tensor, never a crash.
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "common/error.h"
#include "model/make_model.h"
#include "model/safetensors.h"
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
  std::string hs = h.dump();  // (offsets count from the data's start: the header may change length)
  while (hs.size() < hlen || hs.size() % 8) hs.push_back(' ');
  const uint64_t nlen = hs.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&nlen), 8);
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

// What a fuzzing pass found (fortieth session): inputs that crashed, hung, or loaded other
// values than the file says, each now one clear error naming the file and the problem.

// Rewrites config.json through `edit`.
void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto p = fs::path(dir) / "config.json";
  auto j = nlohmann::json::parse(std::ifstream(p));
  edit(j);
  std::ofstream(p) << j.dump();
}

TEST(CheckpointErrors, ConfigValuesOutOfRange) {
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      // 16 heads of 2^30 + 16 wrapped to 256 in int and passed every shape check, then wrote past a buffer.
      {"headdim", [](nlohmann::json& j) { j["head_dim"] = (1 << 30) + 16; }, "head_dim"},
      {"wrap", [](nlohmann::json& j) { j["hidden_size"] = (int64_t(1) << 32) + 64; }, "hidden_size"},  // once read as 64
      {"float", [](nlohmann::json& j) { j["num_hidden_layers"] = 2.9; }, "num_hidden_layers"},         // once read as 2
      {"bool", [](nlohmann::json& j) { j["hidden_size"] = true; }, "hidden_size"},
      {"layers", [](nlohmann::json& j) { j["num_hidden_layers"] = 1000000000; }, "num_hidden_layers"},
      // NaN logits, token 0 forever:
      {"theta", [](nlohmann::json& j) { j["rope_theta"] = 0; }, "rope_theta"},
      {"eps", [](nlohmann::json& j) { j["rms_norm_eps"] = -1.0; }, "rms_norm_eps"},
      {"orig", [](nlohmann::json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 0; }, "original_max_position"},
      {"ept", [](nlohmann::json& j) { j["experts_per_token"] = j["num_experts_per_tok"].get<int>() + 1; }, "disagree"},
      {"eos", [](nlohmann::json& j) { j["eos_token_id"] = -7; }, "eos_token_id"},
      {"maxpos", [](nlohmann::json& j) { j["max_position_embeddings"] = 1; }, "max_position_embeddings"},
  };
  for (const auto& c : cases) {
    auto d = fresh_model(std::string("cfg_") + c.name);
    edit_config(d, c.edit);
    auto msg = load_error(d);
    EXPECT_NE(msg.find("config.json"), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
  }
}

TEST(CheckpointErrors, HeaderEntriesTheFormatForbids) {
  auto victim_of = [](const std::string& shard) {
    SafetensorsFile f(shard);
    std::vector<std::string> names;
    for (auto& [n, t] : f.tensors())
      if (t.nbytes > 0) names.push_back(n);
    std::sort(names.begin(), names.end());
    return names;
  };
  {  // two tensors over the same bytes: the second loaded the first's values
    auto d = fresh_model("overlap");
    auto shard = first_shard(d);
    auto names = victim_of(shard);
    ASSERT_GE(names.size(), 2u);
    edit_header(shard, [&](nlohmann::json& h) {
      auto a = h[names[0]]["data_offsets"], b = h[names[1]]["data_offsets"];
      if (a[1].get<uint64_t>() - a[0].get<uint64_t>() <= b[1].get<uint64_t>() - b[0].get<uint64_t>()) {
        const uint64_t n = a[1].get<uint64_t>() - a[0].get<uint64_t>();
        h[names[0]]["data_offsets"] = {b[0].get<uint64_t>(), b[0].get<uint64_t>() + n};
      } else {
        const uint64_t n = b[1].get<uint64_t>() - b[0].get<uint64_t>();
        h[names[1]]["data_offsets"] = {a[0].get<uint64_t>(), a[0].get<uint64_t>() + n};
      }
    });
    auto msg = load_error(d);
    EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  }
  {  // a fractional dimension (once truncated) and one whose product overflows 64 bits (once 0 bytes)
    auto d = fresh_model("fraction");
    auto shard = first_shard(d);
    auto names = victim_of(shard);
    edit_header(shard, [&](nlohmann::json& h) { h[names[0]]["shape"][0] = 1.5; });
    EXPECT_NE(load_error(d).find("not an integer"), std::string::npos);
    auto d2 = fresh_model("overflow");
    auto shard2 = first_shard(d2);
    edit_header(shard2, [&](nlohmann::json& h) {
      h["zz_huge"] = {{"dtype", "U8"}, {"shape", {int64_t(1) << 40, int64_t(1) << 30}}, {"data_offsets", {0, 0}}};
    });
    EXPECT_NE(load_error(d2).find("too large"), std::string::npos);
  }
  {  // a name twice in the header (JSON would keep the last)
    auto d = fresh_model("dupname");
    auto shard = first_shard(d);
    auto names = victim_of(shard);
    std::ifstream in(shard, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    uint64_t hlen;
    std::memcpy(&hlen, bytes.data(), 8);
    std::string h = bytes.substr(8, hlen);
    const std::string entry = "\"" + names[0] + "\":";
    const size_t at = h.find(entry);
    ASSERT_NE(at, std::string::npos);
    const size_t end = h.find('}', at);
    const std::string copy = h.substr(at, end + 1 - at);
    h.insert(1, copy + ",");
    uint64_t nlen = h.size();
    std::ofstream out(shard, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&nlen), 8);
    out.write(h.data(), std::streamsize(h.size()));
    out.write(bytes.data() + 8 + hlen, std::streamsize(bytes.size() - 8 - hlen));
    out.close();
    auto msg = load_error(d);
    EXPECT_NE(msg.find("appears twice"), std::string::npos) << msg;
  }
}

TEST(CheckpointErrors, IndexAndFilesOutsideTheRules) {
  {  // a shard path out of the model directory
    for (const char* where : {"/etc/passwd", "../elsewhere.safetensors", ""}) {
      auto d = fresh_model("outside");
      auto p = fs::path(d) / "model.safetensors.index.json";
      auto j = nlohmann::json::parse(std::ifstream(p));
      j["weight_map"]["lm_head.weight"] = where;
      std::ofstream(p) << j.dump();
      auto msg = load_error(d);
      EXPECT_NE(msg.find("not a file of the model directory"), std::string::npos) << where << ": " << msg;
    }
  }
  {  // a tensor in two shards
    auto d = fresh_model("twice");
    auto shard = first_shard(d);
    fs::copy_file(shard, fs::path(d) / "copy.safetensors");
    auto p = fs::path(d) / "model.safetensors.index.json";
    auto j = nlohmann::json::parse(std::ifstream(p));
    SafetensorsFile f(shard);
    j["weight_map"][f.tensors().begin()->first] = "copy.safetensors";
    std::ofstream(p) << j.dump();
    auto msg = load_error(d);
    EXPECT_NE(msg.find("two shards"), std::string::npos) << msg;
  }
  {  // a directory or a FIFO where a file belongs: once "basic_filebuf::underflow" and a hang
    auto d = fresh_model("dir");
    fs::remove(fs::path(d) / "config.json");
    fs::create_directory(fs::path(d) / "config.json");
    EXPECT_NE(load_error(d).find("is a directory"), std::string::npos);
    auto d2 = fresh_model("fifo");
    auto shard = first_shard(d2);
    fs::remove(shard);
    ASSERT_EQ(mkfifo(shard.c_str(), 0600), 0);
    auto msg = load_error(d2);
    EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace gptoss
