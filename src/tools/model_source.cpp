#include "tools/model_source.h"

#include <filesystem>

#include "common/error.h"
#include "model/hf_cache.h"
#include "tools/builtin_model.h"

namespace gptoss::tools {

namespace fs = std::filesystem;

std::string model_display_name(const std::string& spec) {
  std::error_code ec;
  if (!fs::is_directory(spec, ec) && looks_like_hf_id(spec)) return spec;
  std::string s = spec;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  std::string name = fs::path(s).filename().string();
  if (name.empty() || name == "." || name == "..") {  // "/", ".", "..": the directory's real name
    fs::path abs = fs::weakly_canonical(fs::absolute(s, ec), ec);
    name = abs.filename().string();
  }
  return name.empty() ? s : name;
}

ModelChoice choose_model(BackendOptions& o) {
  ModelChoice c;
  if (!o.model_dir.empty() && !o.random_weights.empty())
    throw Error("pass either --model or --random-weights, not both");
  if (!o.random_weights.empty()) {
    c.name = "gpt-oss-" + o.random_weights;
    return c;
  }
  if (o.model_dir.empty()) {
    o.model_dir = ensure_builtin_model();
    c.name = "gpt-oss-tiny";
    c.builtin = true;
    return c;
  }
  c.name = model_display_name(o.model_dir);
  o.model_dir = resolve_model_dir(o.model_dir);
  return c;
}

Tokenizer choose_tokenizer(const std::string& tokenizer_opt, const std::string& model_dir) {
  if (!tokenizer_opt.empty()) return Tokenizer::from_file(tokenizer_opt);
  std::error_code ec;
  if (!model_dir.empty() && fs::exists(fs::path(model_dir) / "tokenizer.json", ec))
    return Tokenizer::from_file(model_dir);
  return Tokenizer::o200k_harmony();
}

std::optional<int> run_if_tp_worker(BackendOptions& o) {
  if (!is_tp_worker(o)) return std::nullopt;
  choose_model(o);
  return run_tp_worker(o);
}

}  // namespace gptoss::tools
