#include "model/hf_cache.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/error.h"

namespace gptoss {

namespace fs = std::filesystem;

namespace {
std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
}  // namespace

HfCacheEnv HfCacheEnv::from_process() {
  return {env_or_empty("HF_HUB_CACHE"), env_or_empty("HF_HOME"), env_or_empty("XDG_CACHE_HOME"), env_or_empty("HOME")};
}

HfCacheDir hf_cache_dir(const HfCacheEnv& env) {
  // huggingface_hub's order (constants.py): HF_HUB_CACHE, then HF_HOME/hub, then
  // $XDG_CACHE_HOME/huggingface/hub, then ~/.cache/huggingface/hub.
  if (!env.hf_hub_cache.empty()) return {env.hf_hub_cache, "HF_HUB_CACHE"};
  if (!env.hf_home.empty()) return {(fs::path(env.hf_home) / "hub").string(), "HF_HOME"};
  if (!env.xdg_cache_home.empty())
    return {(fs::path(env.xdg_cache_home) / "huggingface" / "hub").string(), "XDG_CACHE_HOME"};
  return {(fs::path(env.home.empty() ? "/" : env.home) / ".cache" / "huggingface" / "hub").string(), "HOME"};
}

bool looks_like_hf_id(const std::string& s) {
  if (s.empty() || s[0] == '.' || s[0] == '/' || s[0] == '~') return false;
  if (std::count(s.begin(), s.end(), '/') != 1) return false;
  size_t slash = s.find('/');
  if (slash == 0 || slash + 1 == s.size()) return false;
  return std::none_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n'; });
}

std::string resolve_model_dir(const std::string& spec, const HfCacheEnv& env) {
  if (spec.empty()) throw Error("no model given");
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return spec;
  if (fs::exists(spec, ec)) throw Error("model " + spec + " is not a directory (pass the checkpoint's directory)");
  if (!looks_like_hf_id(spec)) throw Error("model directory " + spec + " does not exist");

  HfCacheDir cache = hf_cache_dir(env);
  std::string org = spec.substr(0, spec.find('/')), name = spec.substr(spec.find('/') + 1);
  fs::path repo = fs::path(cache.path) / ("models--" + org + "--" + name);
  fs::path snapshots = repo / "snapshots", ref = repo / "refs" / "main";
  std::vector<std::string> tried = {fs::absolute(spec, ec).string() + " (no such directory)"};
  // 1. The revision refs/main names.
  std::string rev;
  if (std::ifstream f(ref); f) std::getline(f, rev);
  while (!rev.empty() && (rev.back() == '\n' || rev.back() == '\r' || rev.back() == ' ')) rev.pop_back();
  if (!rev.empty()) {
    fs::path snap = snapshots / rev;
    if (fs::is_regular_file(snap / "config.json", ec)) return snap.string();
    tried.push_back(snap.string() + " (from " + ref.string() + "; no config.json)");
  } else {
    tried.push_back(ref.string() + (fs::exists(ref, ec) ? " (empty)" : " (absent)"));
  }
  // 2. Otherwise the newest snapshot that has a config.json (ties: the larger name).
  fs::path best;
  fs::file_time_type best_time{};
  if (fs::is_directory(snapshots, ec)) {
    for (const auto& e : fs::directory_iterator(snapshots, ec)) {
      if (!fs::is_regular_file(e.path() / "config.json", ec)) continue;
      auto t = fs::last_write_time(e.path(), ec);
      if (best.empty() || t > best_time || (t == best_time && e.path().filename() > best.filename())) {
        best = e.path();
        best_time = t;
      }
    }
    if (!best.empty()) return best.string();
    tried.push_back(snapshots.string() + "/* (no snapshot with a config.json)");
  } else {
    tried.push_back(snapshots.string() + " (no such directory)");
  }
  std::string msg = "model " + spec + " is neither a directory nor in the local Hugging Face cache (" + cache.path +
                    ", chosen by " + (cache.source == "HOME" ? std::string("the default") : "$" + cache.source) +
                    "; set HF_HUB_CACHE or HF_HOME to use another). Tried:";
  for (const auto& t : tried) msg += "\n  " + t;
  msg += "\nDownload it first, e.g. `huggingface-cli download " + spec + "`, or pass the checkpoint directory.";
  throw Error(msg);
}

}  // namespace gptoss
