#include "tools/builtin_model.h"

#include <fcntl.h>
#include <sys/file.h>
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
  auto complete = [&] { return fs::exists(dir / "config.json") && fs::exists(dir / "tokenizer.json"); };
  if (complete()) return dir.string();
  // One builder at a time (tests start many servers at once): the others wait on the lock,
  // then find the model complete.
  fs::create_directories(dir.parent_path());
  int lock = ::open((dir.parent_path() / ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (lock < 0) throw Error(dir.parent_path().string() + ": cannot create the lock file");
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // closing releases the lock
  } unlock{lock};
  if (flock(lock, LOCK_EX) != 0) throw Error(dir.parent_path().string() + ": cannot lock");
  if (complete()) return dir.string();
  // Build in a private folder and rename, so a reader never sees half a model.
  fs::path tmp = dir.string() + ".tmp" + std::to_string(getpid());
  fs::remove_all(tmp);
  make_random_model(GptOssConfig::preset("tiny"), tmp.string(), /*seed=*/0);
  write_harmony_tokenizer_json(default_tiktoken_path(), (tmp / "tokenizer.json").string());
  fs::remove_all(dir);  // an incomplete earlier one
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp);
    throw Error(dir.string() + ": cannot create the built-in model: " + ec.message());
  }
  return dir.string();
}

}  // namespace gptoss::tools
