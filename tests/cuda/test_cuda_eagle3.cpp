// Eagle3 on the CUDA backend: the hidden-state taps (ForwardBatch::tap_layers) against the exact
// CPU backend, and the engine with method eagle3 on the GPU giving plain decoding's greedy
// output (batch-invariant mode, so a verify row's numerics equal a plain decode row's).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "backend/backend_factory.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "model/eagle3_weights.h"

namespace gptoss {
namespace {

using namespace gptoss::test;

const std::string kFixture =
    std::string(std::getenv("GPTOSS_TEST_DATA_DIR") ? std::getenv("GPTOSS_TEST_DATA_DIR") : GPTOSS_TEST_DATA) +
    "/tiny-gptoss";

std::unique_ptr<Backend> make(const std::string& device, bool batch_invariant = false) {
  BackendOptions o;
  o.device = device;
  o.model_dir = kFixture;
  o.batch_invariant = batch_invariant;
  return create_backend(o);
}

class CudaEagle3 : public CudaTest {};

// Prefill 21 tokens, then a 3-token verify-like pass, tapping layers {0, 1, 1}.
std::vector<float> taps_of(Backend& be, const std::vector<int32_t>& tokens) {
  KvCacheConfig kv;
  kv.page_size = 16;
  kv.num_pages[kKvFull] = kv.num_pages[kKvSliding] = 4;
  be.init_kv_cache(kv);
  std::vector<int32_t> pages(4);
  std::iota(pages.begin(), pages.end(), 0);
  std::vector<float> out;
  const int H = be.config().hidden;
  int at = 0;
  for (int n : {21, 3}) {
    ForwardBatch fb;
    fb.tokens.assign(tokens.begin() + at, tokens.begin() + at + n);
    SeqBatchInfo s;
    s.n_tokens = n;
    s.start_pos = at;
    for (int g = 0; g < 2; ++g) {
      s.pages[g] = pages.data();
      s.n_pages[g] = 4;
    }
    fb.seqs.push_back(s);
    fb.logit_rows.push_back(n - 1);
    fb.tap_layers = {0, 1, 1};
    std::vector<float> taps(size_t(n) * 3 * H, -1e30f), logits(be.config().vocab);
    fb.tap_out = taps.data();
    be.forward(fb, logits.data());
    out.insert(out.end(), taps.begin(), taps.end());
    at += n;
  }
  return out;
}

TEST_F(CudaEagle3, TapsMatchCpu) {
  auto gpu = make("cuda"), cpu = make("cpu");
  ASSERT_TRUE(gpu->supports_hidden_taps());
  FastRng r(fresh_seed());
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back(int(r.next() % cpu->config().vocab));
  auto tg = taps_of(*gpu, tokens), tc = taps_of(*cpu, tokens);
  ASSERT_EQ(tg.size(), tc.size());
  const double err = rel_err(tg, tc);
  std::printf("eagle3 taps, cuda vs cpu: rel err %.3g\n", err);
  EXPECT_LT(err, 2e-2);
}

TEST_F(CudaEagle3, GreedyEqualsPlainOnCuda) {
  auto gpu = make("cuda", true);
  Eagle3Config hc = Eagle3Config::preset("eagle3-tiny");
  hc.hidden = hc.target_hidden = gpu->config().hidden;
  hc.num_heads = 4;
  hc.num_kv_heads = 2;
  hc.head_dim = 16;
  hc.intermediate = 96;
  hc.vocab = gpu->config().vocab;
  hc.draft_vocab = 128;
  const std::string head = (std::filesystem::temp_directory_path() / ("gptoss-cuda-eagle3-" + std::to_string(fresh_seed()))).string();
  make_random_eagle3(hc, head, 1, true);
  auto run = [&](int k) {
    EngineConfig c;
    c.max_num_seqs = 4;
    c.max_num_batched_tokens = 256;
    c.max_model_len = 128;
    if (k > 0) {
      c.speculative = parse_speculative_config(R"({"method":"eagle3","model":")" + head +
                                               R"(","num_speculative_tokens":)" + std::to_string(k) + "}");
      c.speculative.adaptive = false;
    }
    Engine e(*gpu, c);
    std::vector<std::shared_ptr<RequestStream>> ss;
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> p;
      for (int j = 0; j < 9 + 5 * i; ++j) p.push_back((j * 31 + i * 17 + 3) % hc.vocab);
      SamplingParams sp;
      sp.temperature = 0;
      sp.max_tokens = 24;
      sp.ignore_eos = true;
      ss.push_back(e.submit(p, sp));
    }
    const auto t0 = std::chrono::steady_clock::now();
    while (e.step()) {
    }
    std::printf("K=%d: %.1f ms, %lld drafts\n", k,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                (long long)e.metrics().spec_draft_tokens.load());
    EXPECT_EQ(e.stats().kv_pages_used[kKvFull], 0);
    std::vector<std::vector<int32_t>> out;
    for (auto& s : ss) {
      out.emplace_back();
      while (auto ev = s->next(std::chrono::milliseconds(0))) out.back().insert(out.back().end(), ev->tokens.begin(), ev->tokens.end());
    }
    return out;
  };
  const auto plain = run(0);
  for (int k = 1; k <= 3; ++k) EXPECT_EQ(run(k), plain) << "K=" << k;
  std::filesystem::remove_all(head);
}

}  // namespace
}  // namespace gptoss
