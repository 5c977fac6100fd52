#pragma once
// Where a `--model` argument points: a checkpoint directory, or a Hugging Face model id
// ("openai/gpt-oss-20b") already downloaded into the local Hugging Face cache, found there the
// way huggingface_hub lays it out (no network):
//   <cache>/models--openai--gpt-oss-20b/refs/main          the revision "main" points at
//   <cache>/models--openai--gpt-oss-20b/snapshots/<rev>/   the files of each revision
// <cache> is $HF_HUB_CACHE, else $HF_HOME/hub, else ${XDG_CACHE_HOME:-~/.cache}/huggingface/hub.
#include <string>

namespace gptoss {

// The environment the cache location comes from (a struct, so tests can pass their own).
struct HfCacheEnv {
  std::string hf_hub_cache, hf_home, xdg_cache_home, home;
  static HfCacheEnv from_process();  // getenv of HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME
};

// The hub cache directory, and which variable chose it (e.g. "HF_HUB_CACHE").
struct HfCacheDir {
  std::string path;
  std::string source;
};
HfCacheDir hf_cache_dir(const HfCacheEnv& env);

// "org/name": exactly one '/', non-empty parts, no leading '.', '/' or '~', no whitespace.
bool looks_like_hf_id(const std::string& spec);

// The checkpoint directory `spec` names: an existing directory as given, else (for a
// Hugging Face id) the cached snapshot, preferring the revision refs/main names, else the
// newest snapshot holding a config.json. Throws gptoss::Error saying the directory does not
// exist, or, for an id, naming every path tried.
std::string resolve_model_dir(const std::string& spec, const HfCacheEnv& env = HfCacheEnv::from_process());

}  // namespace gptoss
