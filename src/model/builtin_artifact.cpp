#include "model/builtin_artifact.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/safetensors.h"

namespace gptoss {

namespace fs = std::filesystem;

namespace {

const TensorView& need(const SafetensorsFile& f, const std::string& name, DType dtype, size_t rank) {
  const TensorView* t = f.find(name);
  if (!t) throw Error(f.path() + ": not a built-in model artifact: no tensor " + name);
  if (t->dtype != dtype || t->shape.size() != rank)
    throw Error(f.path() + ": " + name + " is " + dtype_name(t->dtype) + " " + t->shape_str() + ", expected " +
                dtype_name(dtype) + " of rank " + std::to_string(rank));
  return *t;
}

}  // namespace

void expand_builtin_artifact(const std::string& artifact_path, const std::string& out_dir) {
  SafetensorsFile f(artifact_path);
  const auto& cfg_bytes = need(f, "builtin.config", DType::U8, 1);
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(cfg_bytes.data, cfg_bytes.data + cfg_bytes.nbytes);
  } catch (const nlohmann::json::exception& e) {
    throw Error(artifact_path + ": builtin.config is not JSON: " + e.what());
  }
  if (!cfg.contains("vocab_size") || !cfg.contains("hidden_size"))
    throw Error(artifact_path + ": builtin.config lacks vocab_size or hidden_size");
  const int64_t vocab = cfg["vocab_size"].get<int64_t>(), hidden = cfg["hidden_size"].get<int64_t>();
  const auto& ids_t = need(f, "builtin.token_ids", DType::I32, 1);
  const int64_t k = ids_t.shape[0];
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::memcpy(ids.data(), ids_t.data, ids_t.nbytes);
  for (int64_t j = 0; j < k; ++j)
    if (ids[j] < 0 || ids[j] >= vocab || (j > 0 && ids[j] <= ids[j - 1]))
      throw Error(artifact_path + ": builtin.token_ids must be ascending ids below " + std::to_string(vocab));

  struct Expanded {
    std::string name;
    const TensorView* rows;
  };
  std::vector<Expanded> expanded;
  for (const char* n : {"model.embed_tokens", "lm_head"}) {
    const auto& rows = need(f, std::string(n) + ".rows", DType::BF16, 2);
    if (rows.shape[0] != k + 1 || rows.shape[1] != hidden)
      throw Error(artifact_path + ": " + rows.name + " is " + rows.shape_str() + ", expected [" +
                  std::to_string(k + 1) + ", " + std::to_string(hidden) + "]");
    expanded.push_back({std::string(n) + ".weight", &rows});
  }

  std::vector<TensorSpec> specs;
  std::map<std::string, const TensorView*> copied;
  for (const auto& e : expanded) specs.push_back({e.name, DType::BF16, {vocab, hidden}});
  for (const auto& [name, t] : f.tensors()) {
    if (name.rfind("builtin.", 0) == 0 || name == "model.embed_tokens.rows" || name == "lm_head.rows") continue;
    specs.push_back({name, t.dtype, t.shape});
    copied[name] = &t;
  }

  fs::create_directories(out_dir);
  std::ofstream(fs::path(out_dir) / "config.json") << cfg.dump(2) << "\n";
  const size_t row_bytes = size_t(hidden) * 2;
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), specs,
                    [&](const TensorSpec& s, uint8_t* out) {
                      for (const auto& e : expanded) {
                        if (e.name != s.name) continue;
                        const uint8_t* shared = e.rows->data + size_t(k) * row_bytes;
                        for (int64_t r = 0; r < vocab; ++r) std::memcpy(out + size_t(r) * row_bytes, shared, row_bytes);
                        for (int64_t j = 0; j < k; ++j)
                          std::memcpy(out + size_t(ids[j]) * row_bytes, e.rows->data + size_t(j) * row_bytes, row_bytes);
                        return;
                      }
                      const TensorView* t = copied.at(s.name);
                      std::memcpy(out, t->data, t->nbytes);
                    });
}

}  // namespace gptoss
