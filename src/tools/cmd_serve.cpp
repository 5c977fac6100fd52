// `gptoss serve`: the OpenAI-compatible server.
#include <pthread.h>
#include <signal.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "backend/backend_factory.h"
#include "common/error.h"
#include "engine/engine.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "tools/builtin_model.h"
#include "tools/command.h"

namespace {

struct Args {
  gptoss::BackendOptions backend;
  gptoss::EngineConfig engine;
  gptoss::server::ServerOptions server;
  std::string tokenizer;
  std::string kv_cache_dtype = "bf16";
  double max_body_mb = 8;
  double kv_cache_gb = 0;
};

// Where stored /v1/responses live unless --response-store says: the user's cache directory.
std::string default_response_store() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/gptoss/responses.sqlite";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/gptoss/responses.sqlite";
  return ":memory:";
}

int run_serve(Args& a) {
  namespace fs = std::filesystem;
  // SIGTERM/SIGINT are taken by a thread of ours (blocked everywhere else: first
  // thing, before any thread exists, e.g. OpenMP's while the built-in model is made or loaded).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGINT, SIG_DFL);  // a shell script's background job starts with SIGINT ignored
  signal(SIGPIPE, SIG_IGN);
  bool builtin = a.backend.model_dir.empty() && a.backend.random_weights.empty();
  if (builtin) {
    a.backend.model_dir = gptoss::tools::ensure_builtin_model();
    // A random toy model rarely ends its turn: keep requests without max_tokens short.
    if (a.engine.max_model_len == 0) a.engine.max_model_len = 4096;
  }
  if (a.server.served_model_name.empty())
    a.server.served_model_name = builtin ? std::string("gpt-oss-tiny")
                                 : !a.backend.random_weights.empty() ? "gpt-oss-" + a.backend.random_weights
                                                                     : fs::path(a.backend.model_dir).filename().string();
  if (a.server.served_model_name.empty()) a.server.served_model_name = a.backend.model_dir;
  if (a.server.response_store.empty()) {
    // The default place may not be writable (a container's home): then in memory, said aloud.
    a.server.response_store = default_response_store();
    std::error_code ec;
    auto dir = fs::path(a.server.response_store).parent_path();
    if (a.server.response_store != ":memory:") fs::create_directories(dir, ec);
    if (a.server.response_store != ":memory:" && (ec || access(dir.c_str(), W_OK) != 0)) {
      std::fprintf(stderr, "gptoss serve: %s is not writable; stored responses are kept in memory until exit "
                           "(--response-store PATH to keep them)\n", dir.c_str());
      a.server.response_store = ":memory:";
    }
  }

  gptoss::Tokenizer tok = [&] {
    if (!a.tokenizer.empty()) return gptoss::Tokenizer::from_file(a.tokenizer);
    if (!a.backend.model_dir.empty() && fs::exists(fs::path(a.backend.model_dir) / "tokenizer.json"))
      return gptoss::Tokenizer::from_file(a.backend.model_dir);
    return gptoss::Tokenizer::o200k_harmony();
  }();


  auto backend = gptoss::create_backend(a.backend);
  if (a.kv_cache_dtype == "fp8") {
    gptoss::KvCacheConfig kv = backend->kv_config();
    kv.dtype = gptoss::DType::F8_E4M3;
    backend->init_kv_cache(kv);
  } else if (a.kv_cache_dtype != "bf16") {
    throw gptoss::Error("--kv-cache-dtype must be bf16 or fp8");
  }
  if (a.kv_cache_gb > 0) a.engine.kv_cache_bytes = size_t(a.kv_cache_gb * double(size_t(1) << 30));
  a.engine.stop_token_ids = gptoss::server::default_stop_tokens(tok, backend->config());
  a.engine.token_text = gptoss::server::token_text_fn(tok);
  a.engine.batch_invariant = a.backend.batch_invariant;
  gptoss::Engine engine(*backend, a.engine);
  engine.start();
  a.server.max_body_bytes = size_t(a.max_body_mb * 1024 * 1024);
  gptoss::server::Server server(engine, tok, a.server);
  server.bind();
  std::fprintf(stderr,
               "gptoss serve: http://%s:%d  model %s (%s, %s), max_model_len %d, max_num_seqs %d, KV pages %d+%d of %d\n",
               a.server.host.c_str(), server.port(), a.server.served_model_name.c_str(), backend->name().c_str(),
               builtin ? "built-in tiny" : a.backend.model_dir.c_str(), engine.max_model_len(), a.engine.max_num_seqs,
               engine.kv_config().num_pages[0], engine.kv_config().num_pages[1], engine.kv_config().page_size);
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
  app->add_option("--model", a->backend.model_dir, "Checkpoint directory (default: the built-in tiny model)");
  app->add_option("--random-weights", a->backend.random_weights, "Serve random weights of a preset: tiny, 20b, 120b");
  app->add_option("--device", a->backend.device, "cpu or cuda")->capture_default_str();
  app->add_option("--host", a->server.host, "Address to listen on")->capture_default_str();
  app->add_option("--port", a->server.port, "Port (0: any free one)")->capture_default_str();
  app->add_option("--served-model-name", a->server.served_model_name, "Model name in the API");
  app->add_option("--api-key", a->server.api_key, "Require 'Authorization: Bearer KEY' on /v1/*")
      ->envname("GPTOSS_API_KEY");
  app->add_option("--max-model-len", a->engine.max_model_len, "Context length (default: the model's, bounded by KV memory; 4096 for the built-in tiny model)");
  app->add_option("--max-num-seqs", a->engine.max_num_seqs, "Sequences running at once")->capture_default_str();
  app->add_option("--max-num-batched-tokens", a->engine.max_num_batched_tokens, "Tokens per forward pass")
      ->capture_default_str();
  app->add_option("--kv-cache-tokens", a->engine.kv_cache_tokens,
                  "Positions in the KV cache (default: from device memory; on cpu max-num-seqs x max-model-len, at most 256K and ~1 GiB)");
  app->add_option("--kv-cache-memory", a->kv_cache_gb,
                  "GiB for the KV cache when --kv-cache-tokens is not given (default: what the device has left)");
  app->add_option("--kv-cache-dtype", a->kv_cache_dtype, "bf16 or fp8")->capture_default_str();
  app->add_option("--mxfp4-layers", a->backend.mxfp4_layers, "Layers in MXFP4 (cuda): experts, all, or qkv,o,lm_head quantized at load (lossy)")->capture_default_str();
  app->add_option("--mxfp4-backend", a->backend.mxfp4_backend, "MXFP4 kernel family (cuda): auto, mma, gemv")->capture_default_str();
  app->add_option("--dense-dtype", a->backend.dense_dtype, "Decode weights of q/k/v/o and lm_head (cuda): bf16 or fp8")->capture_default_str();
  app->add_option("--threads", a->backend.threads, "CPU threads (0: all)")->capture_default_str();
  app->add_option("--weights-seed", a->backend.seed, "Seed of --random-weights")->capture_default_str();
  app->add_option("--device-index", a->backend.device_index, "CUDA device ordinal")->capture_default_str();
  app->add_flag("--async-scheduling", a->engine.async_scheduling,
                "Plan each engine step while the previous forward pass runs (host/device overlap)");
  app->add_flag("--batch-invariant", a->backend.batch_invariant,
                "Deterministic mode: a request's output independent of batch companions, batch size and preemption");
  app->add_option("--tokenizer", a->tokenizer, "tokenizer.json or .tiktoken (default: the model's, else o200k_harmony)");
  app->add_option("--max-body-mb", a->max_body_mb, "Largest request body (413 beyond)")->capture_default_str();
  app->add_option("--http-threads", a->server.http_threads,
                  "HTTP event-loop threads, and as many threads parsing requests (0: 2); connections do not take threads");
  app->add_option("--max-connections", a->server.max_connections,
                  "Open connections at most; past it a 503 and close (kept below the file-descriptor limit)")
      ->capture_default_str();
  app->add_option("--keep-alive-timeout", a->server.idle_timeout_s, "Seconds an idle connection stays open")
      ->capture_default_str();
  app->add_option("--read-timeout", a->server.read_timeout_s,
                  "Seconds a request's headers, then its body, may take to arrive")->capture_default_str();
  app->add_option("--write-timeout", a->server.write_timeout_s,
                  "Seconds a client may take to accept a write before it is dropped (its request cancelled)")
      ->capture_default_str();
  app->add_option("--allowed-origins", a->server.allowed_origins,
                  "CORS: origins browsers may call from (e.g. http://localhost:3000), '*' for any (default: none)")
      ->delimiter(',');
  app->add_option("--drain-timeout", a->server.drain_timeout_s, "Seconds SIGTERM waits for running requests")
      ->capture_default_str();
  app->add_flag("--log-requests", a->server.log_requests,
                "Log each request to stderr: time, client, request, status, latency, tokens in/out");
  app->add_option("--response-store", a->server.response_store,
                  "SQLite file of stored /v1/responses (store, previous_response_id); ':memory:' keeps them until exit "
                  "(default: ${XDG_CACHE_HOME:-~/.cache}/gptoss/responses.sqlite)");
  app->add_option("--log-stats-interval", a->server.log_stats_interval_s,
                  "Seconds between throughput lines while busy (0: none)")->capture_default_str();
  return [a]() { return run_serve(*a); };
}});
}  // namespace
