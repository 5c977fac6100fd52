#include "tools/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

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

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

}  // namespace

CLI::Validator int_range(long long lo, long long hi) {
  std::string want = hi >= std::numeric_limits<int>::max()
                         ? "an integer >= " + std::to_string(lo)
                         : "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        long long v;
        if (!parse_int(s, v) || v < lo || v > hi) return "must be " + want + " (got \"" + s + "\")";
        return {};
      },
      hi >= std::numeric_limits<int>::max() ? "INT>=" + std::to_string(lo)
                                            : "INT in [" + std::to_string(lo) + "," + std::to_string(hi) + "]");
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

CLI::Validator positive_number(bool strictly) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v;
        if (!parse_real(s, v) || (strictly ? v <= 0 : v < 0))
          return std::string("must be a number ") + (strictly ? "> 0" : ">= 0") + " (got \"" + s + "\")";
        return {};
      },
      strictly ? "NUM>0" : "NUM>=0");
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

CLI::Validator positive_int_list() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::string bad = "must be a comma-separated list of integers >= 1, e.g. 512,2048 (got \"" + s + "\")";
        if (s.empty()) return {};  // none
        size_t at = 0;
        while (at <= s.size()) {
          size_t end = s.find(',', at);
          if (end == std::string::npos) end = s.size();
          long long v;
          if (!parse_int(s.substr(at, end - at), v) || v < 1 || v > std::numeric_limits<int>::max()) return bad;
          at = end + 1;
        }
        return {};
      },
      "N[,N...]");
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
                  "Default: the built-in tiny random model");
  app->add_option("--device", o.device, "Where the model runs: cpu or cuda")
      ->capture_default_str()
      ->check(one_of({"cpu", "cuda"}));
  app->add_option("--random-weights", o.random_weights,
                  "Instead of --model, random weights of a preset (tiny, 20b, 120b) generated on the GPU at start "
                  "(needs --device cuda; for the CPU, write such a model with `gptoss make-model`)")
      ->check(one_of({"tiny", "20b", "120b"}));
  app->add_option("--weights-seed", o.seed, "Seed of --random-weights (same seed, same weights)")
      ->capture_default_str()
      ->check(seed_value());
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
  app->add_option("--threads", o.threads, "CPU threads (0: all cores)")->capture_default_str()->check(int_range(0));
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
                         "there is one, else o200k_harmony)");
}

CLI::Option* add_json_option(CLI::App* app, std::string& v) {
  return app->add_option("--json", v,
                         "Write the results as JSON to FILE; '-' (or no FILE) writes them to stdout and the text "
                         "report to stderr")
      ->expected(0, 1);
}

CLI::Option* add_prompt_ids_option(CLI::App* app, std::string& v) {
  return app->add_option("--prompt-ids", v, "The prompt as comma-separated token ids");
}

}  // namespace gptoss::tools
