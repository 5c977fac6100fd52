// The engine's own host time between forward passes, without a GPU: N clients stream requests
// (512-token prompts, greedy, logprobs of the drawn token, as bench-serve asks) through
// Engine::start() over a fake backend whose passes take a fixed time and draw tokens without
// logits. Prints the engine's step_host_s (the gap a GPU would idle for, absent overlap) per step.
// Not a test (ctest does not run it): `build/tests/engine/bench_engine_host [clients] [pass_us]
// [output_tokens] [async 0|1] [penalized_every] [host_adds 0|1]` (penalized_every N > 0: every N-th
// client asks for presence_penalty; the backend draws its rows with their logit changes, or with
// host_adds 1, as a backend that applies none, its rows are kept for the host and drawn there:
// mixed sampling; then [requests_each] [us_per_prefill_token] [budget]: each client's requests one after
// another, as bench-serve's clients send them (each with a prompt of its own), a pass's added time
// a prefill token, and max_num_batched_tokens (2048; a large GPU's server takes 8192). It then
// lists each pass's prefill tokens, the sizes the engine's own scheduling makes, with no HTTP
// in between: `32 12000 256 1 0 0 2 30 8192` gave 512 8191 7680 512 7680 8176 16 (forty-fifth
// session, this VM). Seventeenth session, the H200 machine's host (16 cores): 236 us a step at 64
// clients, 120 us at 32 (5 ms passes, 256 tokens); complete() about half of it, planning and the
// launch a third.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "fake_backend.h"

using namespace gptoss;

namespace {

// Tokens without logits: the pass sleeps pass_us and draws arbitrary ids below the special tokens.
struct TimedBackend : testing::FakeBackend {
  using FakeBackend::FakeBackend;
  bool keeps_logits() const override { return true; }
  void forward_sample(const ForwardBatch& b, const RowSampling* how, int32_t* out, float* lp, float* kept,
                      const LogitChanges& changes, TopLogprobs* top) override {
    (void)changes;  // the ids are arbitrary either way
    size_t k = 0;
    for (size_t r = 0; r < b.logit_rows.size(); ++r) {
      out[r] = int32_t(5 + (r * 7919 + b.tokens.size()) % 90000);
      if (lp) lp[r] = -1.5f;
      if (top)  // an arbitrary list of the size asked
        for (int k = 0; k < how[r].top_logprobs; ++k) top[r].ids[k] = out[r] + k, top[r].logprobs[k] = -1.0f - float(k);
      if (how[r].keep_logits) {  // a kept row's logits (the copy a GPU backend makes): one id wins
        float* row = kept + k++ * size_t(config().vocab);
        std::fill(row, row + config().vocab, 0.0f);
        row[out[r]] = 1.0f;
        out[r] = -1;
      }
    }
    // A pass's time: delay_us, plus us_per_prefill_token for each token of a sequence bringing more
    // than one (a prefill chunk's cost on a GPU grows with its tokens; a decode row's hardly).
    int prefill = 0;
    for (const auto& s : b.seqs) prefill += s.n_tokens > 1 ? s.n_tokens : 0;
    if (prefill > 0) prefill_passes.push_back(prefill);
    const int us = delay_us + us_per_prefill_token * prefill;
    if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
  int us_per_prefill_token = 0;
  std::vector<int> prefill_passes;  // each pass's prefill tokens, in order (one engine thread writes)
};

}  // namespace

int main(int argc, char** argv) {
  const int clients = argc > 1 ? std::atoi(argv[1]) : 64;
  const int pass_us = argc > 2 ? std::atoi(argv[2]) : 5000;
  const int out = argc > 3 ? std::atoi(argv[3]) : 256;
  const bool async = argc > 4 && std::atoi(argv[4]) != 0;  // EngineConfig::async_scheduling
  const int penalized_every = argc > 5 ? std::atoi(argv[5]) : 0;
  const bool host_adds = argc > 6 && std::atoi(argv[6]) != 0;
  const int requests_each = argc > 7 ? std::max(1, std::atoi(argv[7])) : 1;  // one after another, as bench-serve's clients
  const int us_per_prefill_token = argc > 8 ? std::atoi(argv[8]) : 0;
  const int budget = argc > 9 ? std::atoi(argv[9]) : 2048;  // max_num_batched_tokens
  TimedBackend be(201088, 128, 8192);
  be.delay_us = pass_us;
  be.applies_adds = !host_adds;
  be.us_per_prefill_token = us_per_prefill_token;
  EngineConfig c;
  c.max_num_seqs = 64;
  c.max_num_batched_tokens = budget;
  c.kv_cache_tokens = 200000;
  c.max_model_len = 8192;
  c.async_scheduling = async;
  c.stop_token_ids = {200002, 200012};
  c.token_text = [](int32_t t) { return "tok" + std::to_string(t % 1000); };
  Engine e(be, c);
  e.start();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> th;
  for (int i = 0; i < clients; ++i)
    th.emplace_back([&, i] {
      SamplingParams sp;
      sp.temperature = 0;
      sp.max_tokens = out;
      sp.ignore_eos = true;
      sp.logprobs = 0;
      if (penalized_every > 0 && i % penalized_every == 0) sp.presence_penalty = 0.5f, sp.logprobs = -1;
      for (int q = 0; q < requests_each; ++q) {
        std::vector<int32_t> p(512);  // a prompt of its own (no prefix cache hits)
        for (int j = 0; j < 512; ++j) p[j] = ((i + clients * q) * 131 + j * 7) % 100000;
        auto s = e.submit(p, sp);
        while (auto ev = s->next(std::chrono::milliseconds(60000)))
          if (ev->finished) break;
      }
    });
  for (auto& t : th) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  e.stop();
  const EngineMetrics& m = e.metrics();
  const double steps = double(m.step_host_s.count());
  std::printf("%d clients, %d us passes%s%s: %.0f steps in %.2f s; engine host time %.1f us a step (%lld launched early)\n",
              clients, pass_us, async ? ", async scheduling" : "",
              penalized_every > 0 ? (", every " + std::to_string(penalized_every) + "th with presence_penalty" +
                                     (host_adds ? " drawn on the host" : " drawn by the backend")).c_str() : "",
              steps, secs,
              steps > 0 ? m.step_host_s.sum() / steps * 1e6 : 0.0, (long long)m.early_launches.load());
  if (!be.prefill_passes.empty()) {
    std::printf("prefill passes (tokens, in order):");
    for (int n : be.prefill_passes) std::printf(" %d", n);
    std::printf("\n");
  }
  return 0;
}
