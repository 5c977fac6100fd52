#include "tools/builtin_model.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "common/error.h"
#include "model/builtin_artifact.h"
#include "model/make_model.h"
#include "tokenizer/tokenizer.h"

namespace gptoss::tools {

namespace fs = std::filesystem;

namespace {

// FNV-1a of the artifact's bytes: a new artifact (a retrained model) gets a new cache folder.
std::string file_digest(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot read the built-in model artifact");
  uint64_t h = 1469598103934665603ull;
  std::vector<char> buf(1 << 16);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    for (std::streamsize i = 0; i < f.gcount(); ++i) h = (h ^ uint8_t(buf[size_t(i)])) * 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// Builds `dir` once, under a lock (tests start many servers at once: the others wait, then find
// it complete), in a private folder renamed at the end so no reader sees half a model.
std::string build_once(const fs::path& dir, const std::function<void(const std::string&)>& build) {
  auto complete = [&] { return fs::exists(dir / "config.json") && fs::exists(dir / "tokenizer.json"); };
  if (complete()) return dir.string();
  fs::create_directories(dir.parent_path());
  int lock = ::open((dir.parent_path() / ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (lock < 0) throw Error(dir.parent_path().string() + ": cannot create the lock file");
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // closing releases the lock
  } unlock{lock};
  if (flock(lock, LOCK_EX) != 0) throw Error(dir.parent_path().string() + ": cannot lock");
  if (complete()) return dir.string();
  fs::path tmp = dir.string() + ".tmp" + std::to_string(getpid());
  fs::remove_all(tmp);
  try {
    build(tmp.string());
    write_harmony_tokenizer_json(default_tiktoken_path(), (tmp / "tokenizer.json").string());
  } catch (...) {
    fs::remove_all(tmp);
    throw;
  }
  fs::remove_all(dir);  // an incomplete earlier one
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp);
    throw Error(dir.string() + ": cannot create the built-in model: " + ec.message());
  }
  return dir.string();
}

fs::path models_cache() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path cache = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  return cache / "gptoss" / "models";
}

}  // namespace

std::string builtin_artifact_path() {
  if (const char* e = std::getenv("GPTOSS_BUILTIN_ARTIFACT"); e && *e) {
    if (std::string(e) == "random") return "";  // the random tiny model (tests written for it)
    if (!fs::exists(e)) throw Error(std::string("GPTOSS_BUILTIN_ARTIFACT=") + e + " does not exist");
    return e;
  }
#ifdef GPTOSS_BUILTIN_ARTIFACT_DEFAULT
  if (fs::exists(GPTOSS_BUILTIN_ARTIFACT_DEFAULT)) return GPTOSS_BUILTIN_ARTIFACT_DEFAULT;
#endif
  return "";
}

std::string ensure_builtin_model() {
  std::string artifact = builtin_artifact_path();
  if (!artifact.empty()) {
    fs::path dir = models_cache() / ("builtin-" + file_digest(artifact));
    return build_once(dir, [&](const std::string& out) { expand_builtin_artifact(artifact, out); });
  }
  std::fprintf(stderr,
               "gptoss: no trained built-in model (models/builtin/gptoss-builtin.safetensors); "
               "using random weights (preset tiny): replies will be noise\n");
  return build_once(models_cache() / "tiny-v1", [](const std::string& out) {
    make_random_model(GptOssConfig::preset("tiny"), out, /*seed=*/0);
  });
}

}  // namespace gptoss::tools
