// `--model ORG/NAME` found in the local Hugging Face cache (model/hf_cache.h), without network.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "model/hf_cache.h"

namespace gptoss {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/gptoss_hf_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

// A snapshot folder with a config.json, as huggingface_hub leaves it.
fs::path add_snapshot(const fs::path& hub, const std::string& repo, const std::string& rev) {
  fs::path snap = hub / ("models--" + repo) / "snapshots" / rev;
  fs::create_directories(snap);
  std::ofstream(snap / "config.json") << "{}";
  return snap;
}

std::string error_of(const std::string& spec, const HfCacheEnv& env) {
  try {
    resolve_model_dir(spec, env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfCache, CacheDirFollowsHuggingFaceHubOrder) {
  EXPECT_EQ(hf_cache_dir({"/a", "/b", "/c", "/home/u"}).path, "/a");
  EXPECT_EQ(hf_cache_dir({"", "/b", "/c", "/home/u"}).path, "/b/hub");
  EXPECT_EQ(hf_cache_dir({"", "", "/c", "/home/u"}).path, "/c/huggingface/hub");
  EXPECT_EQ(hf_cache_dir({"", "", "", "/home/u"}).path, "/home/u/.cache/huggingface/hub");
  EXPECT_EQ(hf_cache_dir({"", "/b", "", ""}).source, "HF_HOME");
}

TEST(HfCache, WhatLooksLikeAnId) {
  EXPECT_TRUE(looks_like_hf_id("openai/gpt-oss-20b"));
  for (const char* s : {"gpt-oss-20b", "/models/x", "./a/b", "a/b/c", "~/x/y", "a/", "/a", "a b/c", ""})
    EXPECT_FALSE(looks_like_hf_id(s)) << s;
}

TEST(HfCache, RefsMainIsPreferred) {
  TempDir t;
  fs::path older = add_snapshot(t.path, "openai--gpt-oss-20b", "aaaa");
  fs::path newer = add_snapshot(t.path, "openai--gpt-oss-20b", "bbbb");
  fs::last_write_time(older, fs::last_write_time(newer) - std::chrono::hours(1));
  HfCacheEnv env{t.path.string(), "", "", ""};
  // Without refs/main: the newest snapshot.
  EXPECT_EQ(resolve_model_dir("openai/gpt-oss-20b", env), newer.string());
  // With it: the revision it names, even if older.
  fs::create_directories(t.path / "models--openai--gpt-oss-20b" / "refs");
  std::ofstream(t.path / "models--openai--gpt-oss-20b" / "refs" / "main") << "aaaa";  // no newline, as the hub writes it
  EXPECT_EQ(resolve_model_dir("openai/gpt-oss-20b", env), older.string());
  // HF_HOME/hub when HF_HUB_CACHE is unset.
  fs::path in_home = add_snapshot(t.path / "home" / "hub", "openai--gpt-oss-20b", "dddd");
  EXPECT_EQ(resolve_model_dir("openai/gpt-oss-20b", {"", (t.path / "home").string(), "", ""}), in_home.string());
}

TEST(HfCache, ADirectoryWinsOverTheCache) {
  TempDir t;
  fs::create_directories(t.path / "org" / "name");
  HfCacheEnv env{(t.path / "hub").string(), "", "", ""};
  fs::path cwd = fs::current_path();
  fs::current_path(t.path);
  EXPECT_EQ(resolve_model_dir("org/name", env), "org/name");
  fs::current_path(cwd);
}

TEST(HfCache, MissingNamesEveryPathTried) {
  TempDir t;
  HfCacheEnv env{"", (t.path / "home").string(), "", ""};
  std::string e = error_of("openai/gpt-oss-120b", env);
  std::string repo = (t.path / "home" / "hub" / "models--openai--gpt-oss-120b").string();
  EXPECT_NE(e.find(repo + "/refs/main"), std::string::npos) << e;
  EXPECT_NE(e.find(repo + "/snapshots"), std::string::npos) << e;
  EXPECT_NE(e.find("openai/gpt-oss-120b (no such directory)"), std::string::npos) << e;
  EXPECT_NE(e.find("$HF_HOME"), std::string::npos) << e;
  // A snapshot without config.json (an interrupted download) is not taken.
  fs::create_directories(repo + "/snapshots/cccc");
  e = error_of("openai/gpt-oss-120b", env);
  EXPECT_NE(e.find("no snapshot with a config.json"), std::string::npos) << e;
  // Not an id and not a directory: says the directory does not exist.
  EXPECT_EQ(error_of("/nonexistent/model", env), "model directory /nonexistent/model does not exist");
}

}  // namespace
}  // namespace gptoss
