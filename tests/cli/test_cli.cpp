// The gptoss command line as a library (tools/): one description per option across commands,
// help texts that match what the code does, the top-level conventions (--version, help, unknown
// commands), the range checks, model naming and the load progress text.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tools/cli_app.h"
#include "tools/load_progress.h"
#include "tools/model_source.h"
#include "tools/options.h"

namespace gptoss::tools {
namespace {

int run(std::vector<std::string> args) {
  args.insert(args.begin(), "gptoss");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return run_cli(int(argv.size()), argv.data());
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

TEST(Cli, RangeCheckMessages) {
  std::string v = "99999";
  EXPECT_EQ(int_range(0, 65535)(v), "must be an integer from 0 to 65535 (got \"99999\")");
  v = "12";
  EXPECT_EQ(int_range(0, 65535)(v), "");
  v = "0";
  EXPECT_EQ(int_range(1)(v), "must be an integer >= 1 (got \"0\")");
  v = "1x";
  EXPECT_NE(int_range(1)(v), "");
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
