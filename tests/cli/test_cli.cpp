// The gptoss command line as a library (tools/): one description per option across commands,
// help texts that match what the code does, the top-level conventions (--version, help, unknown
// commands), the range checks, model naming and the load progress text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tools/cli_app.h"
#include "tools/load_progress.h"
#include "tools/model_source.h"
#include "tools/options.h"
#include "tools/prompt_ids.h"

namespace gptoss::tools {
namespace {

int run(std::vector<std::string> args) {
  args.insert(args.begin(), "gptoss");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return run_cli(int(argv.size()), argv.data());
}

// run(), with what it wrote to stderr.
struct Outcome {
  int rc;
  std::string err;
};
Outcome run_err(std::vector<std::string> args) {
  std::fflush(stderr);
  std::FILE* f = std::tmpfile();
  const int saved = dup(2);
  dup2(fileno(f), 2);
  const int rc = run(std::move(args));
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += char(c);
  std::fclose(f);
  return {rc, s};
}

// The exit code is `rc` and stderr has `text`.
::testing::AssertionResult fails_with(const std::vector<std::string>& args, int rc, const std::string& text) {
  Outcome o = run_err(args);
  std::string cmd;
  for (const auto& a : args) cmd += " '" + a + "'";
  if (o.rc != rc) return ::testing::AssertionFailure() << "gptoss" << cmd << ": exit " << o.rc << ", want " << rc << "; " << o.err;
  if (o.err.find(text) == std::string::npos)
    return ::testing::AssertionFailure() << "gptoss" << cmd << ": stderr lacks \"" << text << "\": " << o.err;
  return ::testing::AssertionSuccess();
}

struct App {
  CLI::App app;
  std::map<CLI::App*, std::function<int()>> runners;
  App() { build_app(app, runners); }
};

// The help text of `name` in subcommand `cmd` ("" when it has none).
std::string help_of(App& a, const std::string& cmd, const std::string& name) {
  for (const CLI::Option* o : a.app.get_subcommand(cmd)->get_options())
    if (o->get_name() == name) return o->get_description();
  return "";
}

// Options that mean something else in the command that takes them: bench-serve is an HTTP
// client (its --model is the name it requests, its --api-key the one it sends), bench-kernels
// takes a preset's shapes as --model, make-model's --seed seeds the weights and bench-serve's its
// arrivals and prompts, and --out is a directory for make-model and isa-audit but a file for logits.
// bench-serve's --pp/--tg (with --depth) are bench's over HTTP, without bench's '' for none.
const std::set<std::pair<std::string, std::string>> kDifferentMeaning = {
    {"bench-serve", "--model"}, {"bench-serve", "--api-key"}, {"bench-serve", "--seed"}, {"bench-kernels", "--model"},
    {"bench-serve", "--pp"},    {"bench-serve", "--tg"},
    {"make-model", "--seed"},   {"logits", "--out"},          {"isa-audit", "--out"}};

TEST(Cli, EveryOptionHasOneDescriptionAcrossCommands) {
  App a;
  std::map<std::string, std::pair<std::string, std::string>> first;  // option -> (command, description)
  int shared = 0;
  for (CLI::App* sub : a.app.get_subcommands({})) {
    for (const CLI::Option* o : sub->get_options()) {
      std::string name = o->get_name();
      if (name == "--help" || kDifferentMeaning.count({sub->get_name(), name})) continue;
      auto [it, inserted] = first.emplace(name, std::make_pair(sub->get_name(), o->get_description()));
      if (inserted) continue;
      ++shared;
      EXPECT_EQ(o->get_description(), it->second.second)
          << name << " reads differently in " << sub->get_name() << " and " << it->second.first;
    }
  }
  EXPECT_GT(shared, 20);  // --model, --device, ... in serve, generate, logits and bench
}

TEST(Cli, ModelCommandsTakeTheSameBackendOptions) {
  App a;
  for (const char* opt : {"--model", "--device", "--random-weights", "--weights-seed", "--random-loop-tokens", "--mxfp4-layers",
                          "--mxfp4-backend", "--dense-dtype", "--dense-gemm", "--threads", "--device-index", "--batch-invariant",
                          "--tensor-parallel-size", "--tp-expert-sharding"})
    for (const char* cmd : {"serve", "generate", "logits", "bench"})
      EXPECT_FALSE(help_of(a, cmd, opt).empty()) << cmd << " " << opt;
}

TEST(Cli, HelpSaysWhatTheCodeDoes) {
  App a;
  std::string mx = help_of(a, "serve", "--mxfp4-layers");
  EXPECT_EQ(mx.find("not implemented"), std::string::npos) << mx;  // dense MXFP4 quantization is implemented
  EXPECT_NE(mx.find("lossy"), std::string::npos) << mx;
  for (const char* layer : {"qkv", "o", "lm_head", "all"}) EXPECT_NE(mx.find(layer), std::string::npos) << layer;
  std::string be = help_of(a, "serve", "--mxfp4-backend");
  EXPECT_EQ(be.find("implemented so far"), std::string::npos) << be;
  EXPECT_NE(be.find("auto"), std::string::npos) << be;
  // --random-weights is built on the GPU; the CPU backend refuses it (backend_factory.cpp).
  std::string rw = help_of(a, "serve", "--random-weights");
  EXPECT_NE(rw.find("--device cuda"), std::string::npos) << rw;
  EXPECT_NE(rw.find("make-model"), std::string::npos) << rw;
  EXPECT_NE(help_of(a, "serve", "--model").find("Hugging Face id"), std::string::npos);
}

TEST(Cli, VersionHelpAndUnknownCommands) {
  EXPECT_EQ(run({"--version"}), 0);
  EXPECT_EQ(run({"version"}), 0);
  EXPECT_EQ(run({"help"}), 0);
  EXPECT_EQ(run({"help", "serve"}), 0);
  EXPECT_EQ(run({"serve", "--help"}), 0);
  EXPECT_EQ(run({"help", "nosuch"}), 2);
  EXPECT_EQ(run({"nosuch"}), 2);
  EXPECT_EQ(run({}), 2);
  EXPECT_EQ(run({"--nosuch"}), 2);
  EXPECT_EQ(run({"-h"}), 0);
  EXPECT_NE(version_string().find("gptoss "), std::string::npos);
}

TEST(Cli, OutOfRangeValuesAreUsageErrors) {
  // Each is refused while parsing (exit 2), before anything loads. Every case also names a model
  // or place that does not exist, so a value that slips through fails at run time (exit 1)
  // instead of serving or writing.
  auto bad = [](std::vector<std::string> args) {
    const std::string cmd = args[0];
    if (cmd == "serve" || cmd == "generate" || cmd == "bench") args.insert(args.end(), {"--model", "/nonexistent"});
    if (cmd == "make-model") args.insert(args.end(), {"--out", "/dev/null/x"});
    if (cmd == "bench-serve") args.insert(args.end(), {"--base-url", "http://127.0.0.1:1"});
    return run(args);
  };
  EXPECT_EQ(bad({"serve"}), 1);  // the control: valid options, then the missing model
  EXPECT_EQ(bad({"serve", "--port", "99999"}), 2);
  EXPECT_EQ(bad({"serve", "--port", "-1"}), 2);
  EXPECT_EQ(bad({"serve", "--max-num-seqs", "0"}), 2);
  EXPECT_EQ(bad({"serve", "--max-model-len", "1"}), 2);
  EXPECT_EQ(bad({"serve", "--kv-cache-tokens", "0"}), 2);
  EXPECT_EQ(bad({"serve", "--kv-cache-memory", "-2"}), 2);
  EXPECT_EQ(bad({"serve", "--kv-cache-dtype", "fp4"}), 2);
  EXPECT_EQ(bad({"serve", "--device", "gpu"}), 2);
  EXPECT_EQ(bad({"serve", "--random-weights", "7b"}), 2);
  EXPECT_EQ(bad({"serve", "--weights-seed", "-1"}), 2);
  EXPECT_EQ(bad({"generate", "--prompt-ids", "1", "--seed", "-1"}), 2);
  EXPECT_EQ(bad({"make-model", "--seed", "18446744073709551616"}), 2);
  EXPECT_EQ(bad({"make-model"}), 1);
  EXPECT_EQ(bad({"make-model", "--layers", "0"}), 2);
  EXPECT_EQ(bad({"make-model", "--shard-gb", "0"}), 2);
  EXPECT_EQ(bad({"make-model", "--preset", "7b"}), 2);
  EXPECT_EQ(bad({"make-model", "--loop-tokens", "0"}), 2);
  EXPECT_EQ(bad({"serve", "--random-loop-tokens", "0"}), 2);
  EXPECT_EQ(bad({"bench"}), 1);
  EXPECT_EQ(bad({"bench", "--pp", "abc"}), 2);
  EXPECT_EQ(bad({"bench", "--pp", "0"}), 2);
  EXPECT_EQ(bad({"bench", "--tg", "32,-1"}), 2);
  EXPECT_EQ(bad({"bench", "--runs", "0"}), 2);
  EXPECT_EQ(bad({"generate", "--prompt-ids", "1"}), 1);
  EXPECT_EQ(bad({"generate", "--prompt-ids", "1", "--max-tokens", "0"}), 2);
  EXPECT_EQ(bad({"generate", "--prompt-ids", "1", "--top-p", "1.5"}), 2);
  EXPECT_EQ(bad({"generate", "--prompt-ids", "1", "--min-p", "-0.1"}), 2);
  EXPECT_EQ(bad({"generate", "--prompt-ids", "1", "--top-k", "-1"}), 2);
  EXPECT_EQ(bad({"generate", "--prompt-ids", "1", "--temperature", "-1"}), 2);
  EXPECT_EQ(bad({"bench-serve"}), 1);
  EXPECT_EQ(bad({"bench-serve", "--requests", "0"}), 2);
  EXPECT_EQ(bad({"bench-serve", "--concurrency", "-1"}), 2);
  EXPECT_EQ(bad({"bench-serve", "--request-rate", "-1"}), 2);
  EXPECT_EQ(bad({"bench-serve", "--depth", "0,4096"}), 1);  // the control: no server at :1
  EXPECT_EQ(bad({"bench-serve", "--depth", "0,-1"}), 2);
  EXPECT_EQ(bad({"bench-serve", "--depth", "0", "--pp", "0"}), 2);
  EXPECT_EQ(bad({"bench-serve", "--depth", "0", "--tg", "x"}), 2);
  EXPECT_EQ(bad({"bench-serve", "--depth", "0", "--runs", "0"}), 2);
  EXPECT_EQ(bad({"bench-serve", "--depth", "0", "--latency-mode", "ping"}), 2);
  EXPECT_EQ(bad({"bench-serve", "--depth", "0", "--concurrency", "4"}), 2);  // one request at a time
  EXPECT_EQ(bad({"bench-serve", "--pp", "512"}), 2);                          // --pp needs --depth
  EXPECT_EQ(bad({"serve", "--dense-dtype", "fp4"}), 2);
  EXPECT_EQ(bad({"serve", "--dense-gemm", "cutlass"}), 2);
  EXPECT_EQ(bad({"serve", "--mxfp4-backend", "fast"}), 2);
  EXPECT_EQ(bad({"serve", "--tensor-parallel-size", "3"}), 2);
  EXPECT_EQ(bad({"generate", "--prompt-ids", "1", "--tp", "16"}), 2);
  EXPECT_EQ(bad({"bench", "--tp", "0"}), 2);
  EXPECT_EQ(bad({"serve", "--tp-expert-sharding", "rows"}), 2);
  EXPECT_EQ(bad({"serve", "--device-index", "0,-1"}), 2);
  EXPECT_EQ(bad({"serve", "--tp", "2", "--tp-expert-sharding", "expert", "--device-index", "0,1"}), 1);  // valid
}

// Values that used to crash, hang, overflow or be silently ignored (a fuzzing pass of the command
// line). Each is refused while parsing (exit 2) with a message naming the flag, before anything
// loads; every case also names a model or place that does not exist, so a value that slips
// through fails at run time (exit 1) instead of running.
TEST(Cli, BoundsOnThreadsSizesAndEmptyValues) {
  auto usage = [](std::vector<std::string> args, const std::string& text) {
    const std::string cmd = args[0];
    if (cmd == "serve" || cmd == "generate" || cmd == "bench" || cmd == "logits")
      args.insert(args.end(), {"--model", "/nonexistent"});
    if (cmd == "generate") args.insert(args.end(), {"--max-tokens", "1"});
    if (cmd == "logits") args.insert(args.end(), {"--out", "/dev/null/x"});
    if (cmd == "make-model") args.insert(args.end(), {"--out", "/dev/null/x"});
    if (cmd == "harmony-render") args.insert(args.end(), {"--request", "/nonexistent.json"});
    return fails_with(args, 2, text);
  };
  // 1, 2: thread counts (100000 crashed libgomp; 100000 HTTP threads never listened).
  EXPECT_TRUE(usage({"generate", "--prompt-ids", "1", "--threads", "100000"},
                    "--threads: must be an integer from 0 to 1024 (got \"100000\")"));
  EXPECT_TRUE(usage({"serve", "--threads", "1025"}, "--threads: must be an integer from 0 to 1024"));
  EXPECT_TRUE(usage({"serve", "--http-threads", "100000"}, "--http-threads: must be an integer from 0 to 1024"));
  EXPECT_EQ(run({"serve", "--threads", "1024", "--http-threads", "1024", "--model", "/nonexistent"}), 1);  // valid
  // 3: batch sizes that reached std::bad_alloc or the OOM killer.
  EXPECT_TRUE(usage({"bench", "--pp", "", "--tg", "2", "--batch", "100000"},
                    "--batch: must be a comma-separated list of integers from 1 to 4096"));
  EXPECT_TRUE(usage({"bench", "--pp", "64", "--tg", "", "--pp-batch", "1,4097"}, "--pp-batch: must be"));
  EXPECT_TRUE(usage({"serve", "--kv-cache-tokens", "3000000000"}, "--kv-cache-tokens: must be an integer from 1 to"));
  // 4: sizes whose conversion to bytes overflowed.
  EXPECT_TRUE(usage({"serve", "--max-body-mb", "2e13"}, "--max-body-mb: must be a number > 0 and <= 1000000 (got \"2e13\")"));
  EXPECT_TRUE(usage({"serve", "--kv-cache-memory", "1e30"}, "--kv-cache-memory: must be a number > 0 and <= 1000000"));
  EXPECT_TRUE(usage({"make-model", "--shard-gb", "1e11"}, "--shard-gb: must be a number > 0 and <= 1000000"));
  EXPECT_EQ(run({"serve", "--max-body-mb", "1e6", "--kv-cache-memory", "0.5", "--model", "/nonexistent"}), 1);  // valid
  // 5: an empty --host listened everywhere while the banner said "http://:PORT".
  EXPECT_TRUE(usage({"serve", "--host", ""}, "--host: must not be empty"));
  // 6: empty batch lists ran nothing and exited 0 ('' means none only for --pp and --tg).
  EXPECT_TRUE(usage({"bench", "--batch", ""}, "--batch: must be"));
  EXPECT_TRUE(usage({"bench", "--pp-batch", ""}, "--pp-batch: must be"));
  EXPECT_EQ(run({"bench", "--pp", "", "--tg", "2", "--model", "/nonexistent"}), 1);  // valid
  // 7: --weights-seed seeds --random-weights only.
  EXPECT_TRUE(usage({"generate", "--prompt-ids", "1", "--weights-seed", "5"}, "--weights-seed requires --random-weights"));
  // 11: empty strings that silently meant the default.
  EXPECT_TRUE(usage({"generate", "--prompt-ids", "1", "--model", ""}, "--model: must not be empty"));
  EXPECT_TRUE(usage({"generate", "--prompt-ids", "1", "--tokenizer", ""}, "--tokenizer: must not be empty"));
  for (const char* opt : {"--served-model-name", "--response-store", "--speculative-config", "--allowed-origins",
                          "--api-key", "--speculative-model"})
    EXPECT_TRUE(usage({"serve", opt, ""}, std::string(opt) + ": must not be empty"));
  EXPECT_TRUE(usage({"serve", "--profile", ""}, "--profile: must be one of spec, plain"));
  EXPECT_TRUE(usage({"harmony-render", "--date", ""}, "--date: must be a date YYYY-MM-DD"));
  EXPECT_TRUE(usage({"harmony-render", "--date", "notadate"}, "--date: must be a date YYYY-MM-DD"));
  EXPECT_TRUE(usage({"harmony-render", "--date", "2025-13-01"}, "--date: must be a date YYYY-MM-DD"));
  EXPECT_EQ(run({"harmony-render", "--date", "2024-02-29", "--request", "/nonexistent.json"}), 1);  // valid
  // 12: a trailing comma was accepted where "1,,2" was refused.
  for (const char* ids : {"1,2,", "1,,2", ",1", "", "1,-2", "2147483648"}) {
    EXPECT_TRUE(usage({"generate", "--prompt-ids", ids}, "--prompt-ids: must be comma-separated token ids")) << ids;
    EXPECT_TRUE(usage({"logits", "--prompt-ids", ids}, "--prompt-ids: must be comma-separated token ids")) << ids;
  }
  EXPECT_THROW(parse_ids("1,2,"), std::exception);
  EXPECT_EQ(parse_ids("1,2,2147483647"), (std::vector<int32_t>{1, 2, 2147483647}));
  // 14: both flags of a pair.
  EXPECT_TRUE(usage({"serve", "--async-scheduling", "--no-async-scheduling"}, "excludes"));
  EXPECT_TRUE(usage({"serve", "--no-enable-prefix-caching", "--enable-prefix-caching"}, "excludes"));
  EXPECT_EQ(run({"serve", "--no-async-scheduling", "--no-enable-prefix-caching", "--model", "/nonexistent"}), 1);  // valid
  // 9: CLI11's own range checks printed the limits of a double.
  EXPECT_TRUE(usage({"bench-kernels", "--iters", "0"}, "--iters: must be an integer >= 1 (got \"0\")"));
  EXPECT_TRUE(usage({"bench-allreduce", "--calls", "0"}, "--calls: must be an integer >= 1"));
  EXPECT_TRUE(usage({"bench-allreduce", "--first-device", "-1"}, "--first-device: must be an integer >= 0"));
}

// CUDA-only options on the CPU are refused (as --mxfp4-layers and --dense-dtype were), not ignored:
// the check runs before the weights load.
TEST(Cli, CudaOptionsOnTheCpuAreErrors) {
  const std::string model = std::string(GPTOSS_TEST_DATA) + "/tiny-gptoss";
  auto gen = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", "--model", model, "--prompt-ids", "1", "--max-tokens", "1", "--print-ids"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  EXPECT_TRUE(fails_with(gen({"--mxfp4-backend", "mma"}), 1, "--mxfp4-backend mma is a CUDA option"));
  EXPECT_TRUE(fails_with(gen({"--dense-gemm", "cublas"}), 1, "--dense-gemm cublas is a CUDA option"));
  EXPECT_TRUE(fails_with(gen({"--device-index", "5"}), 1, "--device-index is a CUDA option"));
  EXPECT_TRUE(fails_with(gen({"--device-index", "0,1"}), 1, "--device-index lists 2 devices but --tensor-parallel-size is 1"));
  EXPECT_TRUE(fails_with(gen({"--mxfp4-layers", "all"}), 1, "--mxfp4-layers is a CUDA option"));  // as before
}

// `tokenize --decode`: ids must be integers from 0 to 2^31-1, and every error names its line.
// `args` run with `input` as standard input.
::testing::AssertionResult with_stdin(const std::vector<std::string>& args, const std::string& input, int rc,
                                      const std::string& text) {
  std::FILE* in = std::tmpfile();
  std::fputs(input.c_str(), in);
  std::rewind(in);
  const int saved = dup(0);
  dup2(fileno(in), 0);
  std::clearerr(stdin);  // (an earlier run that read to the end left stdio's end-of-file mark)
  std::cin.clear();
  auto r = fails_with(args, rc, text);
  dup2(saved, 0);
  close(saved);
  std::fclose(in);
  std::clearerr(stdin);
  std::cin.clear();
  return r;
}

TEST(Cli, TokenizeDecodeChecksIds) {
  auto decode = [](const std::string& input, int rc, const std::string& text) {
    return with_stdin({"tokenize", "--decode"}, input, rc, text);
  };
  EXPECT_TRUE(decode("[1.5]\n", 1, "line 1: token id 1.5 is not an integer from 0 to 2147483647"));
  EXPECT_TRUE(decode("[1]\n[2147483648]\n", 1, "line 2: token id 2147483648 is not an integer"));
  EXPECT_TRUE(decode("[-1]\n", 1, "line 1: token id -1 is not an integer"));
  EXPECT_TRUE(decode("[1]\n\n[\"a\"]\n", 1, "line 3: token id \"a\" is not an integer"));
  EXPECT_TRUE(decode("[999999999]\n", 1, "line 1: "));
  EXPECT_TRUE(decode("[1,2]\n", 0, ""));
  // harmony-parse reads its ids the same way, and names unknown ids (it said "the stream ended inside a
  // message header" for [-5] and [999999999], and gave a raw parser error without the line).
  EXPECT_TRUE(with_stdin({"harmony-parse"}, "[-5]\n", 1, "harmony-parse: line 1: token id -5 is not an integer"));
  EXPECT_TRUE(with_stdin({"harmony-parse"}, "[999999999]\n", 1, "harmony-parse: line 1: unknown token id 999999999"));
  EXPECT_TRUE(with_stdin({"harmony-parse"}, "\nx\n", 1, "harmony-parse: line 2: invalid JSON"));
}

// Files a command reads that are directories: an error naming the path, not an empty input.
TEST(Cli, DirectoriesAreNotInputFiles) {
  char tmpl[] = "/tmp/gptoss_cli_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  EXPECT_TRUE(fails_with({"tokenize-bench", "--file", dir, "--seconds", "0.01"}, 1, dir + ": is a directory, not a file"));
  EXPECT_TRUE(fails_with({"harmony-render", "--request", dir}, 1, dir + ": is a directory, not a file"));
  EXPECT_TRUE(fails_with({"isa-audit", "list", "--catalog", dir}, 1, dir + ": is a directory, not a file"));
  rmdir(dir.c_str());
}

TEST(Cli, RangeCheckMessages) {
  std::string v = "99999";
  EXPECT_EQ(int_range(0, 65535)(v), "must be an integer from 0 to 65535 (got \"99999\")");
  v = "12";
  EXPECT_EQ(int_range(0, 65535)(v), "");
  v = "0";
  EXPECT_EQ(int_range(1)(v), "must be an integer >= 1 (got \"0\")");
  v = "1x";
  EXPECT_NE(int_range(1)(v), "");
  // Past INT_MAX, ">= 1" alone would be false: the upper limit is said too.
  v = "2147483648";
  EXPECT_EQ(int_range(1)(v), "must be an integer from 1 to 2147483647 (got \"2147483648\")");
  v = "99999999999999999999";
  EXPECT_EQ(int_range(0)(v), "must be an integer from 0 to 2147483647 (got \"99999999999999999999\")");
  v = "-5";
  EXPECT_EQ(int_range(1)(v), "must be an integer >= 1 (got \"-5\")");
  v = "1e7";
  EXPECT_EQ(positive_number(true, 1e6)(v), "must be a number > 0 and <= 1000000 (got \"1e7\")");
  v = "1e6";
  EXPECT_EQ(positive_number(true, 1e6)(v), "");
  for (std::string bad : {"", "4097", "1,,2"}) EXPECT_NE(positive_int_list(4096, false)(bad), "") << bad;
  v = "1,4096";
  EXPECT_EQ(positive_int_list(4096, false)(v), "");
  v = "";
  EXPECT_NE(non_empty()(v), "");
  for (std::string ok : {"2025-06-28", "2024-02-29"}) EXPECT_EQ(iso_date()(ok), "") << ok;
  for (std::string bad : {"2025-02-29", "2025-6-28", "28-06-2025", "2025-06-31", "2025-00-10"})
    EXPECT_NE(iso_date()(bad), "") << bad;
  v = "0";
  EXPECT_EQ(positive_number()(v), "must be a number > 0 (got \"0\")");
  v = "0";
  EXPECT_EQ(positive_number(false)(v), "");
  v = "nan";
  EXPECT_NE(positive_number(false)(v), "");
  for (std::string ok : {"512", "1,2,3", ""}) EXPECT_EQ(positive_int_list()(ok), "") << ok;
  for (std::string bad : {"abc", "0", "1,,2", "1,-2", "99999999999"}) EXPECT_NE(positive_int_list()(bad), "") << bad;
  v = "18446744073709551615";
  EXPECT_EQ(seed_value()(v), "");
  for (std::string bad : {"-1", "18446744073709551616", "1e3", ""}) EXPECT_NE(seed_value()(bad), "") << bad;
  v = "gpu";
  EXPECT_EQ(one_of({"cpu", "cuda"})(v), "must be one of cpu, cuda (got \"gpu\")");
}

TEST(Cli, ModelDisplayName) {
  char tmpl[] = "/tmp/gptoss_cli_XXXXXX";
  std::string dir = mkdtemp(tmpl);
  EXPECT_EQ(model_display_name(dir + "/"), dir.substr(dir.rfind('/') + 1));
  EXPECT_EQ(model_display_name(dir + "//"), dir.substr(dir.rfind('/') + 1));
  EXPECT_EQ(model_display_name(dir), dir.substr(dir.rfind('/') + 1));
  EXPECT_EQ(model_display_name("openai/gpt-oss-20b"), "openai/gpt-oss-20b");  // a Hugging Face id as is
  rmdir(dir.c_str());
}

TEST(Cli, BothModelAndRandomWeightsIsAnError) {
  BackendOptions o;
  o.model_dir = "/tmp";
  o.random_weights = "20b";
  EXPECT_THROW(choose_model(o), std::exception);
}

TEST(LoadProgress, Text) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1.5 * (1 << 30)), "1.5 GiB");
  const uint64_t GiB = uint64_t(1) << 30;
  // 4 of 16 GiB in 2 s: 2 GiB/s, 6 s to go.
  EXPECT_EQ(format_load_progress("reading", 4 * GiB, 16 * GiB, 2.0, false),
            "reading weights  25%  4.0 GiB/16.0 GiB  2.0 GiB/s  ETA 6 s");
  std::string bar = format_load_progress("reading", 4 * GiB, 16 * GiB, 2.0, true);
  EXPECT_NE(bar.find("[#######......................."), std::string::npos) << bar;
  EXPECT_EQ(format_load_done("reading", 16 * GiB, 8.0), "read weights: 16.0 GiB in 8.0 s (2.0 GiB/s)");
}

std::string printed(bool tty, const std::vector<std::pair<uint64_t, uint64_t>>& calls, uint64_t* bytes = nullptr) {
  std::FILE* f = std::tmpfile();
  auto fn = make_load_progress_printer(f, tty, bytes);
  for (auto [done, total] : calls) fn("reading", done, total);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += char(c);
  std::fclose(f);
  return s;
}

TEST(LoadProgress, LogGetsLinesTerminalGetsABar) {
  uint64_t bytes = 0;
  // Not a terminal: no bar, no carriage returns; one closing line with the total.
  std::string log = printed(false, {{0, 1000}, {500, 1000}, {1000, 1000}}, &bytes);
  EXPECT_EQ(log.find('\r'), std::string::npos) << log;
  EXPECT_EQ(log.find('['), std::string::npos) << log;
  EXPECT_NE(log.find("read weights: 1000 B in "), std::string::npos) << log;
  EXPECT_EQ(bytes, 1000u);
  // A terminal: the bar is drawn with \r and replaced by the closing line.
  std::string tty = printed(true, {{0, 1000}, {500, 1000}, {1000, 1000}});
  EXPECT_NE(tty.find("\r"), std::string::npos) << tty;
  EXPECT_NE(tty.find("[."), std::string::npos) << tty;
  EXPECT_NE(tty.find("read weights: 1000 B in "), std::string::npos) << tty;
  EXPECT_EQ(tty.back(), '\n');
}

}  // namespace
}  // namespace gptoss::tools
