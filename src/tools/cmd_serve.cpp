// `gptoss serve`: the OpenAI-compatible server.
#include <pthread.h>
#include <signal.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <optional>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "backend/backend_factory.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/warm_up.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "tools/command.h"
#include "tools/load_progress.h"
#include "tools/builtin_model.h"
#include "tools/model_source.h"
#include "tools/options.h"

namespace {

struct Args {
  gptoss::BackendOptions backend;
  gptoss::EngineConfig engine;
  gptoss::server::ServerOptions server;
  std::string tokenizer;
  std::string kv_cache_dtype = "bf16";
  double max_body_mb = 8;
  double kv_cache_gb = 0;
  std::string speculative_config;  // vLLM's --speculative-config JSON
  std::string profile;             // "", plain or spec
  std::string speculative_model;   // an Eagle3 head: eagle3 K=1 (what --profile spec prefers)
  std::string warmup = "auto";     // --warmup: auto (on for --device cuda), on, off
};

// --profile presets, under explicit flags: `spec` is latency first (n-gram drafts, K=3, 4
// slots); `plain` many slots and no speculation. `max_num_seqs_given`: --max-num-seqs was passed.
void apply_profile(Args& a, bool max_num_seqs_given) {
  if (!a.speculative_config.empty() && !a.speculative_model.empty())
    throw gptoss::Error("--speculative-model is shorthand for --speculative-config "
                        "'{\"method\":\"eagle3\",\"model\":DIR,\"num_speculative_tokens\":1}': give one of them");
  if (!a.speculative_config.empty()) a.engine.speculative = gptoss::parse_speculative_config(a.speculative_config);
  if (!a.speculative_model.empty()) {
    a.engine.speculative = gptoss::SpeculativeConfig();
    a.engine.speculative.method = "eagle3";
    a.engine.speculative.model = a.speculative_model;
    a.engine.speculative.num_speculative_tokens = 1;
  }
  if (a.profile.empty()) return;
  if (a.profile == "spec") {
    if (!max_num_seqs_given) a.engine.max_num_seqs = 4;
    if (a.speculative_config.empty() && a.speculative_model.empty())
      a.engine.speculative = gptoss::parse_speculative_config(
          R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":1})");
  } else if (a.profile == "plain") {
    if (!a.speculative_config.empty() || !a.speculative_model.empty())
      throw gptoss::Error("--profile plain runs without speculation; drop --speculative-config / --speculative-model "
                          "or use --profile spec");
    if (!max_num_seqs_given) a.engine.max_num_seqs = 64;
  } else {
    throw gptoss::Error("--profile must be plain or spec, got '" + a.profile + "'");
  }
}


// Where stored /v1/responses live unless --response-store says: the user's cache directory.
std::string default_response_store() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/gptoss/responses.sqlite";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/gptoss/responses.sqlite";
  return ":memory:";
}

// KV cache and concurrency at start-up, as vLLM prints them: what the cache holds in tokens and
// how many sequences of max_model_len it can hold at once.
void print_kv_summary(const gptoss::Backend& backend, const gptoss::Engine& engine) {
  using namespace gptoss;
  const GptOssConfig& c = backend.config();
  const KvManagerConfig& kc = engine.kv_config();
  const int P = kc.page_size, mml = engine.max_model_len();
  const DType dtype = backend.kv_config().dtype;
  // The CPU backend keeps every KV element as f32 (bf16 and fp8 values rounded to their type).
  const bool cpu = backend.name() == "cpu";
  const DType stored = cpu ? DType::F32 : dtype;
  const int64_t full_tokens = int64_t(kc.num_pages[kKvFull]) * P;
  const double bytes = double(kc.num_pages[kKvFull]) * double(kv_page_bytes(c, kKvFull, P, stored)) +
                       double(kc.num_pages[kKvSliding]) * double(kv_page_bytes(c, kKvSliding, P, stored));
  std::string sliding;
  if (kc.has_sliding)
    sliding = " + " + std::to_string(kc.num_pages[kKvSliding]) + " pages for the " +
              std::to_string(kc.sliding_window) + "-token sliding window";
  std::fprintf(stderr, "  KV cache: %s%s, %lld tokens (%d pages of %d)%s, %s\n", dtype == DType::F8_E4M3 ? "fp8" : "bf16",
               cpu ? " (held as f32 on the CPU)" : "", (long long)full_tokens, kc.num_pages[kKvFull], P, sliding.c_str(),
               tools::format_bytes(bytes).c_str());
  // Full-attention pages bound how many whole contexts fit; the sliding pool is sized for
  // max_num_seqs windows.
  const int pages_per_seq = (mml + P - 1) / P;
  double room = pages_per_seq > 0 ? double(kc.num_pages[kKvFull]) / pages_per_seq : 0;
  std::fprintf(stderr, "  max_model_len %d: room for %.2f sequences of %d tokens at once; max_num_seqs %d, "
               "max_num_batched_tokens %d\n", mml, room, mml, engine.config().max_num_seqs, engine.config().max_num_batched_tokens);
}

// The bytes of a checkpoint directory's safetensors files.
uint64_t checkpoint_bytes(const std::string& dir) {
  namespace fs = std::filesystem;
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") n += e.file_size(ec);
  return n;
}

int run_serve(Args& a) {
  // A launcher's rank > 0 serves rank 0's forward passes, not HTTP.
  if (auto rc = gptoss::tools::run_if_tp_worker(a.backend)) return *rc;
  // SIGTERM/SIGINT are taken by a thread of ours (blocked everywhere else: first
  // thing, before any thread exists, e.g. OpenMP's while the built-in model is made or loaded).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGINT, SIG_DFL);  // a shell script's background job starts with SIGINT ignored
  signal(SIGPIPE, SIG_IGN);
  if (a.server.response_store.empty()) {
    // The default place may not be writable (a container's home): then in memory, said aloud.
    namespace stdfs = std::filesystem;
    a.server.response_store = default_response_store();
    std::error_code ec;
    auto dir = stdfs::path(a.server.response_store).parent_path();
    if (a.server.response_store != ":memory:") stdfs::create_directories(dir, ec);
    if (a.server.response_store != ":memory:" && (ec || access(dir.c_str(), W_OK) != 0)) {
      std::fprintf(stderr, "gptoss serve: %s is not writable; stored responses are kept in memory until exit "
                           "(--response-store PATH to keep them)\n", dir.c_str());
      a.server.response_store = ":memory:";
    }
  }

  gptoss::tools::ModelChoice model = gptoss::tools::choose_model(a.backend);
  // A random toy model rarely ends its turn: keep requests without max_tokens short.
  if (model.builtin && a.engine.max_model_len == 0) a.engine.max_model_len = 4096;
  if (a.server.served_model_name.empty()) a.server.served_model_name = model.name;
  gptoss::Tokenizer tok = gptoss::tools::choose_tokenizer(a.tokenizer, a.backend.model_dir);
  // Random weights do not write harmony (the built-in model when its trained artifact is absent,
  // --random-weights): a response_format then constrains the whole output.
  const bool random_builtin = model.builtin && gptoss::tools::builtin_artifact_path().empty();
  if (random_builtin || !a.backend.random_weights.empty()) a.server.harmony_output = false;

  a.backend.load_progress = gptoss::tools::stderr_load_progress();
  auto t_load = std::chrono::steady_clock::now();
  auto backend = gptoss::create_backend(a.backend);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  if (a.kv_cache_dtype == "fp8") {
    gptoss::KvCacheConfig kv = backend->kv_config();
    kv.dtype = gptoss::DType::F8_E4M3;
    backend->init_kv_cache(kv);
  } else if (a.kv_cache_dtype != "bf16") {
    throw gptoss::Error("--kv-cache-dtype must be bf16 or fp8");
  }
  if (a.kv_cache_gb > 0) a.engine.kv_cache_bytes = size_t(a.kv_cache_gb * double(size_t(1) << 30));
  char kv_cache_gb_text[32];
  std::snprintf(kv_cache_gb_text, sizeof kv_cache_gb_text, "%g", a.kv_cache_gb);
  a.engine.stop_token_ids = gptoss::server::default_stop_tokens(tok, backend->config());
  a.engine.token_text = gptoss::server::token_text_fn(tok);
  a.engine.batch_invariant = a.backend.batch_invariant;
  a.engine.speculative.target_model = a.backend.model_dir;  // an Eagle3 head without embed_tokens shares its embedding
  // The KV cache is allocated here: a size past the machine's memory (on the CPU) names the flag that asked for it.
  std::optional<gptoss::Engine> engine_holder;
  const std::string kv_flag = a.engine.kv_cache_tokens > 0 ? "--kv-cache-tokens " + std::to_string(a.engine.kv_cache_tokens)
                              : a.kv_cache_gb > 0         ? std::string("--kv-cache-memory ") + kv_cache_gb_text
                                                          : "";
  try {
    engine_holder.emplace(*backend, a.engine);
  } catch (const std::bad_alloc&) {
    throw gptoss::Error((kv_flag.empty() ? "" : kv_flag + ": ") + "out of memory allocating the KV cache");
  } catch (const gptoss::Error& e) {
    if (kv_flag.empty() || std::string(e.what()).find("KV cache") == std::string::npos) throw;
    throw gptoss::Error(kv_flag + ": " + e.what());
  }
  gptoss::Engine& engine = *engine_holder;
  // Before listening: the first users should not pay the GPU's one-time costs (engine/warm_up.h).
  std::optional<gptoss::WarmUpResult> warmed;
  if (a.warmup == "on" || (a.warmup == "auto" && a.backend.device == "cuda")) warmed = gptoss::warm_up(engine);
  engine.start();
  a.server.max_body_bytes = size_t(a.max_body_mb * 1024 * 1024);
  gptoss::server::Server server(engine, tok, a.server);
  server.bind();
  std::fprintf(stderr, "gptoss serve: http://%s:%d  model %s (%s, %s)\n", a.server.host.c_str(), server.port(),
               a.server.served_model_name.c_str(), backend->name().c_str(),
               model.builtin ? "built-in tiny" : !a.backend.random_weights.empty() ? "random weights"
                                                                                  : a.backend.model_dir.c_str());
  if (a.backend.random_weights.empty())
    std::fprintf(stderr, "  weights: %s, %d layers, loaded in %.1f s\n",
                 gptoss::tools::format_bytes(double(checkpoint_bytes(a.backend.model_dir))).c_str(),
                 backend->config().num_layers, load_s);
  else
    std::fprintf(stderr, "  weights: random %s (seed %llu), %d layers, built in %.1f s\n", a.backend.random_weights.c_str(),
                 (unsigned long long)a.backend.seed, backend->config().num_layers, load_s);
  if (a.backend.tensor_parallel_size > 1)
    std::fprintf(stderr, "  tensor parallel: %s\n", gptoss::describe_tensor_parallel(a.backend).c_str());
  print_kv_summary(*backend, engine);
  if (warmed) {
    std::string sizes;
    for (int b : warmed->batch_sizes) sizes += " " + std::to_string(b);
    std::fprintf(stderr, "  warm-up: %d requests at batch sizes%s, %.2f s\n", warmed->requests, sizes.c_str(), warmed->seconds);
  }
  if (a.engine.speculative.enabled() && a.engine.speculative.method == "eagle3")
    std::fprintf(stderr, "  speculative decoding: eagle3 head %s, up to %d draft tokens\n",
                 a.engine.speculative.model.c_str(), a.engine.speculative.num_speculative_tokens);
  else if (a.engine.speculative.enabled())
    std::fprintf(stderr, "  speculative decoding: %s, up to %d draft tokens (n-gram %d..%d)\n",
                 a.engine.speculative.method.c_str(), a.engine.speculative.num_speculative_tokens,
                 a.engine.speculative.prompt_lookup_min, a.engine.speculative.prompt_lookup_max);
  // The first SIGTERM/SIGINT drains (new requests 503, running ones finish, up to
  // --drain-timeout); a second one exits at once.
  std::atomic<bool> done{false};
  std::thread drainer;
  std::thread sig_thread([&] {
    timespec ts{0, 200 * 1000 * 1000};
    bool draining = false;
    while (!done) {
      int s = sigtimedwait(&sigs, nullptr, &ts);
      if (s != SIGTERM && s != SIGINT) continue;
      const char* name = s == SIGTERM ? "SIGTERM" : "SIGINT";
      if (draining) {
        std::fprintf(stderr, "gptoss serve: second %s, exiting now (%d request(s) dropped)\n", name, engine.num_active());
        std::fflush(stderr);
        std::_Exit(128 + s);
      }
      draining = true;
      std::fprintf(stderr, "gptoss serve: %s, draining %d request(s) (up to %d s; again to exit at once)\n", name,
                   engine.num_active(), a.server.drain_timeout_s);
      drainer = std::thread([&] { server.shutdown(); });
    }
  });
  server.run();
  done = true;
  sig_thread.join();
  if (drainer.joinable()) drainer.join();
  engine.stop();
  std::fprintf(stderr, "gptoss serve: stopped\n");
  return 0;
}

gptoss::tools::RegisterCommand reg({"serve", "Serve a model through an OpenAI-compatible HTTP API", [](CLI::App* app) {
  auto a = std::make_shared<Args>();
  a->server.served_model_name.clear();
  using namespace gptoss::tools;
  add_backend_options(app, a->backend);
  app->add_option("--host", a->server.host, "Address to listen on (0.0.0.0: every interface)")
      ->capture_default_str()
      ->check(non_empty());
  app->add_option("--port", a->server.port, "Port to listen on (0: any free one)")->capture_default_str()->check(int_range(0, 65535));
  app->add_option("--served-model-name", a->server.served_model_name,
                  "Model name in the API (default: the --model directory's name or Hugging Face id)")
      ->check(non_empty());
  app->add_option("--api-key", a->server.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/* (GPTOSS_API_KEY when not given; unset or empty: no key)")
      ->envname("GPTOSS_API_KEY")
      ->check(non_empty());
  app->add_option("--max-model-len", a->engine.max_model_len,
                  "Context length (default: the model's max_position_embeddings, lowered to what the KV cache holds; "
                  "4096 for the built-in tiny model). Above either limit it is refused")
      ->check(int_range(2));
  app->add_option("--max-num-seqs", a->engine.max_num_seqs, "Sequences running at once")->capture_default_str()->check(int_range(1));
  a->engine.max_num_batched_tokens = 0;  // the backend's default (Backend::default_max_num_batched_tokens)
  app->add_option("--max-num-batched-tokens", a->engine.max_num_batched_tokens,
                  "Tokens per forward pass (default: 8192 on a GPU with 70 GiB or more, except A100s, as vLLM's API "
                  "server; else 2048; at least --max-num-seqs)")
      ->check(int_range(1));
  app->add_option("--kv-cache-tokens", a->engine.kv_cache_tokens,
                  "Positions in the KV cache (default: from device memory; on cpu max-num-seqs x max-model-len, at "
                  "most 256K and ~1 GiB); must hold one sequence of max-model-len; on cpu it must fit the "
                  "machine's memory (held as f32)")
      ->check(int_range(1));
  app->add_option("--kv-cache-memory", a->kv_cache_gb,
                  "GiB for the KV cache when --kv-cache-tokens is not given, at most 1000000 (default: what the "
                  "device has left)")
      ->check(positive_number(true, 1e6));
  add_kv_cache_dtype_option(app, a->kv_cache_dtype);
  // Each pair of flags is two options, so that giving both is an error instead of the last one winning.
  auto* async_on = app->add_flag("--async-scheduling", a->engine.async_scheduling,
                                 "Launch each forward pass from the previous pass's sampled tokens and do that pass's "
                                 "bookkeeping (logprobs, detokenization, stop strings, streaming) while the new one runs "
                                 "(default on)");
  app->add_flag_callback("--no-async-scheduling", [a] { a->engine.async_scheduling = false; },
                         "Turn --async-scheduling off")
      ->excludes(async_on);
  app->add_option("--warmup", a->warmup,
                  "Before listening, run each decode batch size once (short requests) so the first users do not pay "
                  "one-time costs (CUDA graph captures, kernel loading): auto (on with --device cuda), on, off")
      ->capture_default_str()
      ->check(one_of({"auto", "on", "off"}));
  auto* prefix_on = app->add_flag("--enable-prefix-caching", a->engine.enable_prefix_caching,
                                  "Reuse the KV pages of a cached token prefix across requests (default on)");
  app->add_flag_callback("--no-enable-prefix-caching", [a] { a->engine.enable_prefix_caching = false; },
                         "Turn --enable-prefix-caching off")
      ->excludes(prefix_on);
  app->add_option("--speculative-config", a->speculative_config,
                  "Speculative decoding as JSON, e.g. '{\"method\":\"ngram\",\"num_speculative_tokens\":4,"
                  "\"prompt_lookup_max\":4,\"prompt_lookup_min\":1}' (prompt lookup) or "
                  "'{\"method\":\"eagle3\",\"model\":DIR,\"num_speculative_tokens\":1}' (an Eagle3 draft head: on the GPU with --device cuda, else on the host)")
      ->check(non_empty());
  app->add_option("--speculative-model", a->speculative_model,
                  "An Eagle3 draft head directory: eagle3 drafts, K=1 (with --profile spec: instead of ngram)")
      ->check(non_empty());
  app->add_option("--profile", a->profile,
                  "Presets under explicit flags: spec (ngram drafts K=3, or eagle3 K=1 with --speculative-model; 4 slots: "
                  "latency first) or plain (64 slots, no speculation)")
      ->check(one_of({"spec", "plain"}));
  add_tokenizer_option(app, a->tokenizer);
  app->add_option("--max-body-mb", a->max_body_mb, "Largest request body in MiB, at most 1000000 (413 beyond)")
      ->capture_default_str()
      ->check(positive_number(true, 1e6));
  app->add_option("--http-threads", a->server.http_threads,
                  "HTTP event-loop threads, and as many threads parsing requests (0: 2; at most 1024); connections do "
                  "not take threads")
      ->check(int_range(0, kMaxThreads));
  app->add_option("--max-connections", a->server.max_connections,
                  "Open connections at most; past it a 503 and close (kept below the file-descriptor limit)")
      ->capture_default_str()
      ->check(int_range(1));
  app->add_option("--keep-alive-timeout", a->server.idle_timeout_s, "Seconds an idle connection stays open")
      ->capture_default_str()
      ->check(int_range(1));
  app->add_option("--read-timeout", a->server.read_timeout_s,
                  "Seconds a request's headers, then its body, may take to arrive")
      ->capture_default_str()
      ->check(int_range(1));
  app->add_option("--write-timeout", a->server.write_timeout_s,
                  "Seconds a client may take to accept a write before it is dropped (its request cancelled)")
      ->capture_default_str()
      ->check(int_range(1));
  app->add_option("--allowed-origins", a->server.allowed_origins,
                  "CORS: origins browsers may call from (e.g. http://localhost:3000), '*' for any (default: none)")
      ->delimiter(',')
      ->check(non_empty());
  app->add_option("--drain-timeout", a->server.drain_timeout_s, "Seconds SIGTERM waits for running requests")
      ->capture_default_str()
      ->check(int_range(0));
  app->add_flag("--log-requests", a->server.log_requests,
                "Log each request to stderr: time, client, request, status, latency, tokens in/out");
  app->add_option("--response-store", a->server.response_store,
                  "SQLite file of stored /v1/responses (store, previous_response_id); ':memory:' keeps them until exit "
                  "(default: ${XDG_CACHE_HOME:-~/.cache}/gptoss/responses.sqlite)")
      ->check(non_empty());
  app->add_option("--log-stats-interval", a->server.log_stats_interval_s,
                  "Seconds between throughput lines while busy (0: none)")
      ->capture_default_str()
      ->check(int_range(0));
  return [a, app]() {
    apply_profile(*a, app->count("--max-num-seqs") > 0);
    return run_serve(*a);
  };
}});
}  // namespace
