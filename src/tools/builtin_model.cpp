#include "tools/builtin_model.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "common/error.h"
#include "model/make_model.h"
#include "tokenizer/tokenizer.h"

namespace gptoss::tools {

namespace fs = std::filesystem;

std::string ensure_builtin_model() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path cache = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  fs::path dir = cache / "gptoss" / "models" / "tiny-v1";
  if (fs::exists(dir / "config.json") && fs::exists(dir / "tokenizer.json")) return dir.string();
  // Build in a private folder and rename, so concurrent first runs never see half a model.
  fs::path tmp = dir.string() + ".tmp" + std::to_string(getpid());
  fs::remove_all(tmp);
  make_random_model(GptOssConfig::preset("tiny"), tmp.string(), /*seed=*/0);
  write_harmony_tokenizer_json(default_tiktoken_path(), (tmp / "tokenizer.json").string());
  fs::remove_all(dir);  // an incomplete earlier one
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp);
    if (!fs::exists(dir / "config.json")) throw Error(dir.string() + ": cannot create the built-in model: " + ec.message());
  }
  return dir.string();
}

}  // namespace gptoss::tools
