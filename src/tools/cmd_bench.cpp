// `gptoss bench`: llama-bench-style throughput of one sequence. ppN: one forward pass over an
// N-token prompt (logits of the last token only). tgN: N greedy decode steps after a prompt of
// --tg-prompt tokens (as a real request would run), each step one forward (graph-captured on
// CUDA, greedy token picked on the device). tgN xB (--batch B): B sequences decoding together
// after their prompts, one forward a step, t/s over all of them. ppN xB (--pp-batch B): B
// sequences of N tokens prefilled in one forward pass, as a server's prefill pass holds several
// prompts (each its own pages, the logits of each one's last token), t/s over all of them. The
// tg steps are pipelined as a server with async scheduling runs them (Backend::launch_greedy):
// step N + 1 is launched with its tokens taken on the device from step N's, and N's ids are read
// while N + 1 runs; --sync-steps reads each step's ids before launching the next. Prints a
// markdown table; --json adds the results as JSON (to a file, or alone on stdout with '-').
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>

#include "backend/backend_factory.h"
#include "backend/decode_batch.h"
#include "common/error.h"
#include "tools/command.h"
#include "tools/load_progress.h"
#include "tools/model_source.h"
#include "tools/options.h"
#ifdef GPTOSS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace {

struct Args {
  gptoss::BackendOptions backend;
  std::string pp = "512,2048,8192", tg = "32,128", batch = "1", pp_batch = "1", json_path, kv_dtype = "bf16";
  bool json = false;  // --json given (an empty path means stdout)
  bool sync_steps = false;  // --sync-steps: each tg step's ids read before the next is launched
  int runs = 5, tg_prompt = 512, page_size = 16;
};

// "512,2048" -> {512, 2048}; the option's check (positive_int_list) has refused anything else.
std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(std::stoi(item));
  return v;
}

// Page tables of n sequences of `per` pages each: sequence q on pages q * per .. q * per + per - 1.
std::vector<std::vector<int32_t>> seq_page_tables(int n, int per) {
  std::vector<std::vector<int32_t>> t(size_t(n), std::vector<int32_t>(size_t(per), 0));
  for (int q = 0; q < n; ++q) std::iota(t[size_t(q)].begin(), t[size_t(q)].end(), q * per);
  return t;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One prefill pass over `prompts`, each a fresh sequence on its own pages (the same table for both
// groups), the logits of each one's last token; next gets one greedy token a prompt.
void prefill_pass(gptoss::Backend& b, const std::vector<std::vector<int32_t>>& prompts,
                  const std::vector<std::vector<int32_t>>& pages, int32_t* next) {
  gptoss::ForwardBatch fb;
  for (size_t q = 0; q < prompts.size(); ++q) {
    gptoss::SeqBatchInfo s;
    s.first_token = int32_t(fb.tokens.size());
    s.n_tokens = int32_t(prompts[q].size());
    s.start_pos = 0;
    for (int g = 0; g < 2; ++g) {
      s.pages[g] = pages[q].data();
      s.n_pages[g] = int32_t(pages[q].size());
    }
    fb.tokens.insert(fb.tokens.end(), prompts[q].begin(), prompts[q].end());
    fb.seqs.push_back(s);
    fb.logit_rows.push_back(int32_t(fb.tokens.size()) - 1);
  }
  b.forward_greedy(fb, next);
}

int run(Args& a) {
  using namespace gptoss;
  if (auto rc = tools::run_if_tp_worker(a.backend)) return *rc;
  const bool json_stdout = a.json && (a.json_path.empty() || a.json_path == "-");
  auto pps = parse_list(a.pp), tgs = parse_list(a.tg);
  if (pps.empty() && tgs.empty()) throw Error("nothing to run: --pp and --tg are both empty");
  tools::ModelChoice mc = tools::choose_model(a.backend);
  {
    // Lengths past the model's context are refused before anything loads (serve's wording for
    // --max-model-len).
    const GptOssConfig pre = a.backend.random_weights.empty()
                                 ? GptOssConfig::from_file(a.backend.model_dir + "/config.json")
                                 : GptOssConfig::preset(a.backend.random_weights);
    const int64_t max_pos = pre.max_position_embeddings;
    for (int p : pps)
      if (p > max_pos)
        throw Error("--pp " + std::to_string(p) + " is larger than the model's max_position_embeddings (" +
                    std::to_string(max_pos) + ")");
    for (int t : tgs)
      if (int64_t(a.tg_prompt) + t > max_pos)
        throw Error("--tg-prompt " + std::to_string(a.tg_prompt) + " + --tg " + std::to_string(t) + " (" +
                    std::to_string(int64_t(a.tg_prompt) + t) + ") is larger than the model's max_position_embeddings (" +
                    std::to_string(max_pos) + ")");
  }
  a.backend.load_progress = tools::stderr_load_progress();
  auto be = create_backend(a.backend);
  const GptOssConfig& c = be->config();
  // What the KV cache could get after the weights, and how many tokens of context that is
  // (full-attention layers; sliding layers need only a window per sequence).
  const double kv_avail = double(be->kv_memory_available());
  const double per_tok_fp8 = double(kv_page_bytes(c, kKvFull, 1, DType::F8_E4M3));
  const double per_tok_bf16 = double(kv_page_bytes(c, kKvFull, 1, DType::BF16));
  const auto batches = parse_list(a.batch), pp_batches = parse_list(a.pp_batch);
  int max_batch = 1, max_pp_batch = 1;
  for (int b : batches) max_batch = std::max(max_batch, b);
  for (int b : pp_batches) max_pp_batch = std::max(max_pp_batch, b);
  KvCacheConfig kv;
  kv.page_size = a.page_size;
  // Pages a sequence of n positions takes; every sequence of a run has its own (seq_page_tables).
  auto pages_for = [&](int n) { return (n + a.page_size - 1) / a.page_size + 1; };
  int tg_pages = 0, pp_pages = 0;
  for (int t : tgs) tg_pages = std::max(tg_pages, pages_for(a.tg_prompt + t));
  for (int p : pps) pp_pages = std::max(pp_pages, pages_for(p));
  kv.num_pages[0] = kv.num_pages[1] = std::max(tg_pages * max_batch, pp_pages * max_pp_batch);
  if (a.kv_dtype == "fp8")
    kv.dtype = DType::F8_E4M3;
  else if (a.kv_dtype != "bf16")
    throw Error("--kv-cache-dtype must be bf16 or fp8");
  try {
    be->init_kv_cache(kv);
  } catch (const std::bad_alloc&) {
    throw Error("out of memory allocating the KV cache of --pp/--tg with --pp-batch/--batch (" +
                std::to_string(kv.num_pages[0]) + " pages of " + std::to_string(kv.page_size) + " positions)");
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (for --pp/--tg-prompt + --tg times --pp-batch/--batch)");
  }
  uint64_t rng = 88172645463325252ull;
  auto rand_tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) {
      rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
      x = int32_t(rng % uint64_t(c.vocab));
    }
    return t;
  };
  std::string model = a.backend.random_weights.empty() ? mc.name : "random " + a.backend.random_weights;
  struct Result {
    std::string test;
    double mean, sd;
    std::vector<double> tps;
  };
  std::vector<Result> results;
  auto stats = [](const std::string& name, const std::vector<double>& v) {
    double m = std::accumulate(v.begin(), v.end(), 0.0) / v.size(), s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return Result{name, m, v.size() > 1 ? std::sqrt(s / (v.size() - 1)) : 0.0, v};
  };
  for (int p : pps)
    for (int B : pp_batches) {
      const auto seq_pages = seq_page_tables(B, pages_for(p));
      std::vector<double> tps;
      for (int r = -1; r < a.runs; ++r) {  // r = -1: warm-up
        std::vector<std::vector<int32_t>> prompts;
        for (int q = 0; q < B; ++q) prompts.push_back(rand_tokens(p));
        std::vector<int32_t> next(B);
        double t0 = now_s();
        prefill_pass(*be, prompts, seq_pages, next.data());
        double dt = now_s() - t0;
        if (r >= 0) tps.push_back(double(B) * p / dt);
      }
      const std::string name = "pp" + std::to_string(p) + (B > 1 ? " x" + std::to_string(B) : "");
      results.push_back(stats(name, tps));
      std::fprintf(stderr, "%s: %.1f t/s%s\n", name.c_str(), results.back().mean, B > 1 ? " (all sequences)" : "");
    }
  for (int t : tgs)
    for (int B : batches) {
      if (B == 1) continue;  // the plain tgN below
      std::vector<double> tps;
      for (int r = -1; r < a.runs; ++r) {
        DecodeBatch bt(*be, seq_page_tables(B, pages_for(a.tg_prompt + t)));
        for (int q = 0; q < B; ++q) bt.prefill(q, rand_tokens(a.tg_prompt));
        double t0 = now_s();
        bt.decode(t, !a.sync_steps);
        double dt = now_s() - t0;
        if (r >= 0) tps.push_back(double(B) * t / dt);
      }
      results.push_back(stats("tg" + std::to_string(t) + " x" + std::to_string(B) + (a.sync_steps ? " sync" : ""), tps));
      std::fprintf(stderr, "tg%d x%d: %.1f t/s (all sequences)\n", t, B, results.back().mean);
    }
  for (int t : tgs) {
    if (std::find(batches.begin(), batches.end(), 1) == batches.end()) break;
    std::vector<double> tps;
    for (int r = -1; r < a.runs; ++r) {
      DecodeBatch one(*be, seq_page_tables(1, pages_for(a.tg_prompt + t)));
      one.prefill(0, rand_tokens(a.tg_prompt));
      double t0 = now_s();
      one.decode(t, !a.sync_steps);
      double dt = now_s() - t0;
      if (r >= 0) tps.push_back(t / dt);
    }
    results.push_back(stats("tg" + std::to_string(t) + (a.sync_steps ? " sync" : ""), tps));
    std::fprintf(stderr, "tg%d: %.1f t/s\n", t, results.back().mean);
  }
  double peak_gib = -1;
#ifdef GPTOSS_HAVE_CUDA
  if (a.backend.device == "cuda") {
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) == cudaSuccess) peak_gib = double(total - free_b) / (1 << 30);
  }
#endif
  // The table on stdout, unless stdout is for the JSON.
  FILE* text = json_stdout ? stderr : stdout;
  std::string device = a.backend.device;  // "cuda tp2 (expert)" when tensor-parallel
  if (a.backend.tensor_parallel_size > 1)
    device += " tp" + std::to_string(a.backend.tensor_parallel_size) + " (" +
              expert_sharding_name(a.backend.tp_expert_sharding) + ")";
  std::fprintf(text, "| model | device | kv | test | t/s |\n|---|---|---|---|---|\n");
  for (auto& r : results)
    std::fprintf(text, "| %s | %s | %s | %s | %.2f ± %.2f |\n", model.c_str(), device.c_str(),
                 a.kv_dtype.c_str(), r.test.c_str(), r.mean, r.sd);
  if (peak_gib >= 0) std::fprintf(text, "\nGPU memory in use after the runs (weights + KV + workspace): %.2f GiB\n", peak_gib);
  if (kv_avail > 0)
    std::fprintf(text, "KV memory available after weights: %.2f GiB = %.2fM tokens fp8 / %.2fM tokens bf16 (full-attention layers)\n",
                 kv_avail / (1 << 30), kv_avail / per_tok_fp8 / 1e6, kv_avail / per_tok_bf16 / 1e6);
  if (!a.json) return 0;
  nlohmann::json j;
  j["model"] = model;
  j["device"] = a.backend.device;
  j["tensor_parallel_size"] = a.backend.tensor_parallel_size;
  j["tp_expert_sharding"] = expert_sharding_name(a.backend.tp_expert_sharding);
  j["kv_cache_dtype"] = a.kv_dtype;
  j["tg_prompt"] = a.tg_prompt;
  j["runs"] = a.runs;
  j["sync_steps"] = a.sync_steps;
  if (peak_gib >= 0) j["gpu_memory_gib"] = peak_gib;
  if (kv_avail > 0) {
    j["kv_memory_available_gib"] = kv_avail / (1 << 30);
    j["kv_capacity_tokens_fp8"] = kv_avail / per_tok_fp8;
  }
  for (auto& r : results) j["results"].push_back({{"test", r.test}, {"tps_mean", r.mean}, {"tps_sd", r.sd}, {"tps", r.tps}});
  if (json_stdout) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::ofstream f(a.json_path);
    f << j.dump(2) << "\n";
    if (!f) throw Error("cannot write " + a.json_path);
  }
  return 0;
}

gptoss::tools::RegisterCommand reg({"bench", "Prompt-processing and generation throughput (llama-bench style)",
                                    [](CLI::App* app) {
  auto a = std::make_shared<Args>();
  using namespace gptoss::tools;
  add_backend_options(app, a->backend);
  app->add_option("--pp", a->pp, "Prompt lengths, comma-separated ('' for none; at most the model's context)")
      ->capture_default_str()
      ->check(positive_int_list());
  app->add_option("--tg", a->tg, "Generated lengths, comma-separated ('' for none)")
      ->capture_default_str()
      ->check(positive_int_list());
  app->add_option("--tg-prompt", a->tg_prompt, "Prompt tokens before each tg run")->capture_default_str()->check(int_range(1));
  app->add_option("--batch", a->batch,
                  "Sequences decoding together in tg runs, comma-separated, each from 1 to 4096 (tgN xB: B "
                  "sequences after their prompts, one forward a step; t/s counts all of them)")
      ->capture_default_str()
      ->check(positive_int_list(kMaxBenchBatch, /*allow_none=*/false));
  app->add_option("--pp-batch", a->pp_batch,
                  "Prompts prefilled together in pp runs, comma-separated, each from 1 to 4096 (ppN xB: B prompts "
                  "of N tokens in one forward pass, as a server's prefill pass; t/s counts all of them)")
      ->capture_default_str()
      ->check(positive_int_list(kMaxBenchBatch, /*allow_none=*/false));
  app->add_option("--runs", a->runs, "Timed runs per test (after one warm-up)")->capture_default_str()->check(int_range(1));
  app->add_flag("--sync-steps", a->sync_steps,
                "tg: read each step's tokens before launching the next (default: pipelined, step N + 1 launched "
                "with its tokens taken on the device from step N, as async scheduling serves)");
  add_kv_cache_dtype_option(app, a->kv_dtype);
  app->add_option("--page-size", a->page_size, "KV page size (positions)")->capture_default_str()->check(int_range(1, 4096));
  auto* json = add_json_option(app, a->json_path);
  return [a, json]() {
    a->json = json->count() > 0;
    return run(*a);
  };
}});

}  // namespace
