#include "tools/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "common/error.h"
#include "tools/prompt_ids.h"

namespace gptoss::tools {

namespace {

bool parse_int(const std::string& s, long long& v) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  v = std::strtoll(s.c_str(), &end, 10);
  return errno == 0 && end && *end == '\0';
}

bool parse_real(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return end && *end == '\0' && std::isfinite(v);
}

// An integer that does not fit a long long: "+99999999999999999999".
bool is_big_positive(const std::string& s) {
  size_t i = !s.empty() && s[0] == '+' ? 1 : 0;
  return i < s.size() && s.find_first_not_of("0123456789", i) == std::string::npos;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}

}  // namespace

CLI::Validator int_range(long long lo, long long hi) {
  const bool open_top = hi >= std::numeric_limits<int>::max();
  const std::string from_to = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  const std::string want = open_top ? "an integer >= " + std::to_string(lo) : from_to;
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        long long v;
        const bool ok = parse_int(s, v);
        if (ok && v >= lo && v <= hi) return {};
        // Past the top (or past what a long long holds): ">= 1" alone would be a false statement.
        const bool past_top = ok ? v > hi : is_big_positive(s);
        return "must be " + (past_top ? from_to : want) + " (got \"" + s + "\")";
      },
      open_top ? "INT>=" + std::to_string(lo) : "INT in [" + std::to_string(lo) + "," + std::to_string(hi) + "]");
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        errno = 0;
        char* end = nullptr;
        bool ok = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
        if (ok) std::strtoull(s.c_str(), &end, 10);
        if (!ok || errno != 0) return "must be an integer from 0 to 18446744073709551615 (got \"" + s + "\")";
        return {};
      },
      "UINT64");
}

CLI::Validator positive_number(bool strictly, double hi) {
  const bool bounded = std::isfinite(hi);
  const std::string want = std::string("a number ") + (strictly ? "> 0" : ">= 0") + (bounded ? " and <= " + num(hi) : "");
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v;
        if (!parse_real(s, v) || (strictly ? v <= 0 : v < 0) || v > hi) return "must be " + want + " (got \"" + s + "\")";
        return {};
      },
      std::string(strictly ? "NUM>0" : "NUM>=0") + (bounded ? ",<=" + num(hi) : ""));
}

CLI::Validator real_range(double lo, double hi) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v;
        if (!parse_real(s, v) || v < lo || v > hi)
          return "must be a number from " + num(lo) + " to " + num(hi) + " (got \"" + s + "\")";
        return {};
      },
      "NUM in [" + num(lo) + "," + num(hi) + "]");
}

CLI::Validator positive_int_list(int hi, bool allow_none) {
  const bool open_top = hi >= std::numeric_limits<int>::max();
  const std::string want = open_top ? "integers >= 1, e.g. 512,2048" : "integers from 1 to " + std::to_string(hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        std::string bad = "must be a comma-separated list of " + want + " (got \"" + s + "\")";
        if (s.empty()) return allow_none ? std::string() : bad;  // none
        size_t at = 0;
        while (at <= s.size()) {
          size_t end = s.find(',', at);
          if (end == std::string::npos) end = s.size();
          long long v;
          if (!parse_int(s.substr(at, end - at), v) || v < 1 || v > hi) return bad;
          at = end + 1;
        }
        return {};
      },
      "N[,N...]");
}

CLI::Validator token_id_list() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          parse_ids(s);
        } catch (const Error&) {
          return "must be comma-separated token ids from 0 to 2147483647, e.g. 1,2,3 (got \"" + s + "\")";
        }
        return {};
      },
      "ID[,ID...]");
}

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& s) -> std::string { return s.empty() ? "must not be empty (leave the option out for its default)" : ""; },
      "");
}

CLI::Validator iso_date() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::string bad = "must be a date YYYY-MM-DD, e.g. 2025-06-28 (got \"" + s + "\")";
        if (s.size() != 10 || s[4] != '-' || s[7] != '-') return bad;
        for (int i : {0, 1, 2, 3, 5, 6, 8, 9})
          if (s[i] < '0' || s[i] > '9') return bad;
        const int y = std::stoi(s.substr(0, 4)), m = std::stoi(s.substr(5, 2)), d = std::stoi(s.substr(8, 2));
        static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        if (m < 1 || m > 12) return bad;
        const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        if (d < 1 || d > days[m - 1] + (m == 2 && leap ? 1 : 0)) return bad;
        return {};
      },
      "YYYY-MM-DD");
}

CLI::Validator one_of(std::vector<std::string> names) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        for (const auto& n : names)
          if (s == n) return {};
        return "must be one of " + list + " (got \"" + s + "\")";
      },
      "{" + list + "}");
}

// ---- the descriptions: one per option ----

void add_backend_options(CLI::App* app, BackendOptions& o) {
  app->add_option("--model", o.model_dir,
                  "Checkpoint directory (Hugging Face layout), or a Hugging Face id such as openai/gpt-oss-20b "
                  "found in the local Hugging Face cache (HF_HUB_CACHE, HF_HOME; never downloaded). "
                  "Default: the built-in tiny random model")
      ->check(non_empty());
  app->add_option("--device", o.device, "Where the model runs: cpu or cuda")
      ->capture_default_str()
      ->check(one_of({"cpu", "cuda"}));
  app->add_option("--random-weights", o.random_weights,
                  "Instead of --model, random weights of a preset (tiny, 20b, 120b) generated on the GPU at start "
                  "(needs --device cuda; for the CPU, write such a model with `gptoss make-model`)")
      ->check(one_of({"tiny", "20b", "120b"}));
  auto* random_weights = app->get_option("--random-weights");
  app->add_option("--weights-seed", o.seed, "Seed of --random-weights (same seed, same weights)")
      ->capture_default_str()
      ->check(seed_value())
      ->needs(random_weights);
  app->add_option("--random-loop-tokens", o.random_loop_tokens,
                  "With --random-weights: make them a loop model whose greedy continuation of token 1000 + i is "
                  "1000 + (i + 1) % N (speculative-decoding benchmarks at real shapes; `gptoss make-model "
                  "--loop-tokens N` writes the same)")
      ->check(int_range(1, 1 << 20));
  app->add_option("--mxfp4-layers", o.mxfp4_layers,
                  "Layers held in MXFP4 (CUDA): experts (the default: only the experts, MXFP4 as published), all, "
                  "or a comma list of qkv, o, lm_head, which are quantized to MXFP4 when the model loads "
                  "(faster decode; lossy, unlike the published weights: see docs/BENCHMARKS.md)")
      ->capture_default_str();
  app->add_option("--mxfp4-backend", o.mxfp4_backend,
                  "MXFP4 kernel family (CUDA): auto, mma (tensor-core decode kernels over weights repacked at "
                  "load), gemv (CUDA-core GEMVs over the checkpoint layout)")
      ->capture_default_str()
      ->check(one_of({"auto", "mma", "gemv"}));
  app->add_option("--dense-dtype", o.dense_dtype,
                  "Decode weights of q/k/v/o and lm_head (CUDA): bf16 (exact) or fp8 (e4m3, one scale per row, "
                  "half the bytes; prefill stays bf16)")
      ->capture_default_str()
      ->check(one_of({"bf16", "fp8"}));
  app->add_option("--dense-gemm", o.dense_gemm,
                  "Prefill GEMMs of the bf16 dense layers, qkv, o_proj and router (CUDA): auto (cuBLASLt, loaded at "
                  "run time, when it is found; else gptoss's own), cublas (the same, saying so when it is not found) "
                  "or own. GPTOSS_DENSE_GEMM sets it when this is auto; GPTOSS_CUBLASLT names the library file")
      ->capture_default_str()
      ->check(one_of({"auto", "cublas", "own"}));
  app->add_option("--threads", o.threads, "CPU threads (0: all cores; at most " + std::to_string(kMaxThreads) + ")")
      ->capture_default_str()
      ->check(int_range(0, kMaxThreads));
  app->add_option("--device-index", o.device_indices,
                  "CUDA device ordinal(s): one (0), or with --tensor-parallel-size one per rank (0,1); ordinals count "
                  "the devices CUDA_VISIBLE_DEVICES leaves visible (default: 0, or 0..N-1 for N ranks; a process "
                  "started by a launcher takes its LOCAL_RANK-th)")
      ->delimiter(',')
      ->check(int_range(0));
  app->add_option("--tensor-parallel-size,--tp", o.tensor_parallel_size,
                  "Split the model over N ranks (1, 2, 4, 8): attention heads, experts and the vocabulary (Megatron "
                  "style). Started alone: one thread per rank (per GPU with --device cuda). Started by torchrun, "
                  "Slurm or mpirun (RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_*, with "
                  "MASTER_ADDR/MASTER_PORT): one rank per process, rank 0 runs the command, the others serve it")
      ->capture_default_str()
      ->check(one_of({"1", "2", "4", "8"}));
  app->add_option_function<std::string>(
         "--tp-expert-sharding", [&o](const std::string& v) { o.tp_expert_sharding = parse_expert_sharding(v); },
         "How tensor parallelism splits the MoE: intermediate (every rank a slice of every expert, in blocks of 32) "
         "or expert (every rank whole experts)")
      ->check(one_of({"intermediate", "expert"}))
      ->default_str("intermediate");
  app->add_flag("--batch-invariant", o.batch_invariant,
                "Deterministic mode: a request's output independent of batch companions, batch size and preemption "
                "(CUDA kernels with a fixed reduction order; the CPU backend always is)");
}

CLI::Option* add_max_tokens_option(CLI::App* app, int& v) {
  return app->add_option("--max-tokens", v, "Most tokens to generate (per request)")
      ->capture_default_str()
      ->check(int_range(1));
}

CLI::Option* add_temperature_option(CLI::App* app, float& v) {
  return app->add_option("--temperature", v, "Sampling temperature (0: greedy)")
      ->capture_default_str()
      ->check(positive_number(false));
}

CLI::Option* add_temperature_option(CLI::App* app, double& v) {
  return app->add_option("--temperature", v, "Sampling temperature (0: greedy)")
      ->capture_default_str()
      ->check(positive_number(false));
}

void add_sampling_options(CLI::App* app, SamplingArgs& s) {
  add_max_tokens_option(app, s.max_tokens);
  add_temperature_option(app, s.temperature);
  app->add_option("--top-p", s.top_p, "Nucleus sampling: keep the most likely tokens up to this mass (1: off)")
      ->capture_default_str()
      ->check(real_range(0.0, 1.0));
  app->add_option("--top-k", s.top_k, "Keep the k most likely tokens (0: off)")->capture_default_str()->check(int_range(0));
  app->add_option("--min-p", s.min_p, "Drop tokens less likely than min-p x the most likely one (0: off)")
      ->capture_default_str()
      ->check(real_range(0.0, 1.0));
  app->add_option("--seed", s.seed, "Sampling seed (same seed, same tokens)")->capture_default_str()->check(seed_value());
}

CLI::Option* add_ignore_eos_option(CLI::App* app, bool& v) {
  return app->add_flag("--ignore-eos", v,
                       "Do not stop at the tokens that end a turn (<|return|>, <|call|>, eos): generate --max-tokens "
                       "tokens");
}

CLI::Option* add_kv_cache_dtype_option(CLI::App* app, std::string& v) {
  return app->add_option("--kv-cache-dtype", v, "KV cache element type: bf16, or fp8 (e4m3, half the memory)")
      ->capture_default_str()
      ->check(one_of({"bf16", "fp8"}));
}

CLI::Option* add_tokenizer_option(CLI::App* app, std::string& v) {
  return app->add_option("--tokenizer", v,
                         "tokenizer.json, .tiktoken file or model directory (default: the model's tokenizer.json when "
                         "there is one, else o200k_harmony)")
      ->check(non_empty());
}

CLI::Option* add_json_option(CLI::App* app, std::string& v) {
  return app->add_option("--json", v,
                         "Write the results as JSON to FILE; '-' (or no FILE) writes them to stdout and the text "
                         "report to stderr")
      ->expected(0, 1);
}

CLI::Option* add_prompt_ids_option(CLI::App* app, std::string& v) {
  return app->add_option("--prompt-ids", v, "The prompt as comma-separated token ids")->check(token_id_list());
}

}  // namespace gptoss::tools
