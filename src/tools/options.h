#pragma once
// The command-line options the subcommands share, each described once here (name, help text,
// range check), so an option reads the same and means the same in every command that takes it
// (vLLM/llama.cpp spelling). A command adds its own options with app->add_option as usual.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include "backend/backend_factory.h"

namespace gptoss::tools {

// ---- range checks with messages a user can act on (CLI11's own print the limits of double) ----
// An integer in [lo, hi]: "must be an integer from 1 to 65535 (got 99999)". With hi at INT_MAX or
// more the message says "an integer >= lo", and the upper limit too for a value past it.
CLI::Validator int_range(long long lo, long long hi = std::numeric_limits<int>::max());
// A seed: an integer from 0 to 2^64-1.
CLI::Validator seed_value();
// A number > 0 (`strictly`) or >= 0, and at most `hi` (where a size in MB or GiB is turned into
// bytes, so that the product fits a size_t): "must be a number > 0 and <= 1000000 (got "2e13")".
CLI::Validator positive_number(bool strictly = true, double hi = std::numeric_limits<double>::infinity());
// A real in [lo, hi].
CLI::Validator real_range(double lo, double hi);
// A comma-separated list of integers from 1 to `hi` ("512,2048"); "" for none when `allow_none`.
CLI::Validator positive_int_list(int hi = std::numeric_limits<int>::max(), bool allow_none = true);
// Comma-separated token ids from 0 to 2^31-1 ("1,2,3"; no empty item, no trailing comma).
CLI::Validator token_id_list();
// Anything but the empty string (an option whose default is "leave it out", where '' would
// otherwise silently mean that default).
CLI::Validator non_empty();
// A calendar date written YYYY-MM-DD ("2025-06-28").
CLI::Validator iso_date();
// One of `names`: "must be one of cpu, cuda (got gpu)".
CLI::Validator one_of(std::vector<std::string> names);

// The most CPU threads --threads takes (OpenMP fails to create threads, or crashes, long
// before 100000), and the most HTTP threads `serve --http-threads` takes.
inline constexpr int kMaxThreads = 1024;
// The most sequences a bench run batches (--batch, --pp-batch).
inline constexpr int kMaxBenchBatch = 4096;

// ---- shared options ----
// What every model-running command (serve, generate, logits, bench) takes: --model, --device,
// --random-weights, --weights-seed, --mxfp4-layers, --mxfp4-backend, --dense-dtype, --dense-gemm,
// --threads, --device-index, --batch-invariant.
void add_backend_options(CLI::App* app, BackendOptions& o);

// Sampling of generated tokens (generate).
struct SamplingArgs {
  int max_tokens = 16;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = 0;
  uint64_t seed = 0;
};
void add_sampling_options(CLI::App* app, SamplingArgs& s);

CLI::Option* add_max_tokens_option(CLI::App* app, int& v);
CLI::Option* add_temperature_option(CLI::App* app, float& v);
CLI::Option* add_temperature_option(CLI::App* app, double& v);
CLI::Option* add_ignore_eos_option(CLI::App* app, bool& v);
CLI::Option* add_kv_cache_dtype_option(CLI::App* app, std::string& v);
CLI::Option* add_tokenizer_option(CLI::App* app, std::string& v);
// --json [FILE|-]: JSON results to FILE; "-" (or no value) for stdout, the text report then
// going to stderr so stdout stays parseable.
CLI::Option* add_json_option(CLI::App* app, std::string& v);
CLI::Option* add_prompt_ids_option(CLI::App* app, std::string& v);

}  // namespace gptoss::tools
