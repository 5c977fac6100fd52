// Speculative decoding on the CUDA backend (tiny fixture model). Verify passes (1 + K tokens of a
// sequence, logits for every row) run in the decode graphs' buckets; these tests check that
// such a pass gives each row the logits that decoding the tokens one at a time gives, and that
// the engine's speculative greedy decoding emits exactly plain greedy decoding's tokens.
//
// Exact equality needs --batch-invariant: by default a pass of B tokens picks its kernels and
// attention splits by B, so a verify pass (B = sum of 1 + K) and a plain decode step (B = the
// number of sequences) round differently; a near-tie between the top two logits can then flip
// and the texts part. Batch-invariant mode runs one kernel family and one attention split at
// every size, so a row's logits do not depend on what else is in its pass. Without it, the
// verify rows are checked within rounding only.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "backend/backend_factory.h"
#include "backend/solo_sequence.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "engine/speculative.h"

namespace gptoss {
namespace {

using namespace gptoss::test;

const std::string kFixture = tiny_fixture_dir();

std::unique_ptr<Backend> make(bool batch_invariant) {
  BackendOptions o;
  o.device = "cuda";
  o.model_dir = kFixture;
  o.batch_invariant = batch_invariant;
  return create_backend(o);
}

int argmax(const float* v, int n) { return int(std::max_element(v, v + n) - v); }

class CudaSpec : public CudaTest {};

// Three sequences prefilled in one mixed batch, then one verify-shaped pass (1, 3 and 5 tokens:
// graph bucket 16, with padding) asking for the logits of every row in a shuffled order, and
// the same pass through forward_greedy and forward_sample (greedy rows). Each sequence alone,
// decoding the same tokens one at a time, must give the same logits: bit for bit in
// batch-invariant mode, within rounding otherwise.
void check_verify_pass(bool invariant) {
  auto gpu = make(invariant);
  const int V = gpu->config().vocab, ps = 16, S = 3, maxlen = 64;
  KvCacheConfig kv;
  kv.page_size = ps;
  kv.num_pages[0] = kv.num_pages[1] = S * maxlen / ps;
  gpu->init_kv_cache(kv);
  std::vector<std::vector<int32_t>> pages(S);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < maxlen / ps; ++i) pages[s].push_back(s + S * i);  // interleaved pages
  FastRng r(fresh_seed());
  const std::vector<int> lens = {5, 17, 40}, verify = {1, 3, 5};
  std::vector<std::vector<int32_t>> prompt(S), cont(S);
  ForwardBatch fb = mixed_prefill_batch(pages, lens, V, r, prompt);
  std::vector<float> lp(size_t(S) * V);
  gpu->forward(fb, lp.data());
  // The verify pass: each sequence's greedy next token, then "drafts" (random tokens).
  ForwardBatch vb;
  for (int s = 0; s < S; ++s) {
    SeqBatchInfo si;
    si.first_token = int(vb.tokens.size());
    si.n_tokens = verify[s];
    si.start_pos = lens[s];
    for (int g = 0; g < 2; ++g) { si.pages[g] = pages[s].data(); si.n_pages[g] = int(pages[s].size()); }
    cont[s].push_back(argmax(lp.data() + size_t(s) * V, V));
    while (int(cont[s].size()) < verify[s]) cont[s].push_back(int(r.next() % V));
    vb.tokens.insert(vb.tokens.end(), cont[s].begin(), cont[s].end());
    vb.seqs.push_back(si);
  }
  const int M = int(vb.tokens.size());
  for (int t = 0; t < M; ++t) vb.logit_rows.push_back((t * 5 + 3) % M);  // every row, shuffled (5 is prime to 9)
  std::vector<float> lv(size_t(M) * V);
  gpu->forward(vb, lv.data());
  // Rewriting the same positions with the same tokens leaves the cache's meaning unchanged.
  std::vector<int32_t> greedy(M), sampled(M);
  gpu->forward_greedy(vb, greedy.data());
  std::vector<RowSampling> how(M);
  for (auto& h : how) h.temperature = 0.f;
  gpu->forward_sample(vb, how.data(), sampled.data());
  // The drawn tokens' logprobs from the device (greedy rows, then sampled ones) against the host's
  // log-softmax of the same rows (Backend::forward_sample's logprobs_out).
  ASSERT_TRUE(gpu->samples_logprobs());
  for (float temp : {0.0f, 0.8f}) {
    std::vector<RowSampling> hw(M);
    for (int i = 0; i < M; ++i) {
      hw[i].temperature = temp;
      hw[i].u = float(i * 37 % 100) / 100.0f;
    }
    std::vector<int32_t> ids(M);
    std::vector<float> lps(M, 1.0f);
    gpu->forward_sample(vb, hw.data(), ids.data(), lps.data());
    for (int i = 0; i < M; ++i) {
      const float* row = lv.data() + size_t(i) * V;
      const double want = double(row[ids[i]]) - row_logsumexp(row, V);
      EXPECT_NEAR(lps[i], want, 1e-4 + 1e-5 * std::fabs(want)) << "row " << i << " T=" << temp;
      if (temp == 0.0f) { EXPECT_EQ(ids[i], greedy[i]) << "row " << i; }
    }
  }
  // Rows kept for the host (every third, in the shuffled row order): not drawn, their logits
  // those forward() gave, the rest drawn as before (the chunked lm_head's path).
  {
    std::vector<bool> keep(M, false);
    for (int i = 0; i < M; ++i) keep[size_t(i)] = i % 3 == 1;
    expect_kept_rows(*gpu, vb, keep, lv, greedy, V);
  }
  for (float temp : {0.0f, 1.0f}) expect_adjusted_rows(*gpu, vb, lv, V, temp);  // logit changes, the same path
  for (int s = 0; s < S; ++s) {
    auto alone = make(invariant);
    SoloSequence solo(*alone, maxlen);
    solo.append(prompt[s], false);
    for (int j = 0; j < verify[s]; ++j) {
      auto want = solo.append({cont[s][j]}, false);  // decode one token: a graph of bucket 1
      const int t = vb.seqs[s].first_token + j;
      const int out = int(std::find(vb.logit_rows.begin(), vb.logit_rows.end(), t) - vb.logit_rows.begin());
      std::vector<float> got(lv.begin() + size_t(out) * V, lv.begin() + size_t(out + 1) * V);
      const double e = rel_err(got, want);
      std::printf("verify row vs one at a time%s, seq %d row %d: rel err %.3g\n", invariant ? " (batch-invariant)" : "",
                  s, j, e);
      // Seq 0's prompt took the GEMM path in the mixed batch and another alone: K/V differ by rounding.
      EXPECT_LE(e, 5e-3) << "seq " << s << " row " << j;
      if (invariant) {
        EXPECT_EQ(got, want) << "batch-invariant: seq " << s << " row " << j;
      }
      EXPECT_EQ(greedy[out], argmax(got.data(), V)) << "seq " << s << " row " << j;
      EXPECT_EQ(sampled[out], greedy[out]) << "seq " << s << " row " << j;
    }
  }
}

TEST_F(CudaSpec, VerifyPassRowsEqualDecodingOneAtATime) { check_verify_pass(false); }
TEST_F(CudaSpec, BatchInvariantVerifyPassIsExact) { check_verify_pass(true); }

// Prompts with repeats (prompt lookup finds matches) and some without.
std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  const int len = 6 + (i * 7) % 19;
  const int period = 2 + i % 5;
  for (int k = 0; k < len; ++k)
    p.push_back(i % 4 == 3 ? (k * 31 + i * 17 + 3) % 500 : ((k % period) * 37 + i * 11) % 500);
  return p;
}

struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;
  int64_t drafted = 0, accepted = 0;
};

EngineRun serve(Backend& be, int k, const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  EngineConfig c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 512;
  c.max_model_len = 256;
  c.kv_cache_tokens = 16384;  // not the whole GPU's memory
  c.batch_invariant = true;
  if (k > 0)
    c.speculative = parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":)" + std::to_string(k) +
                                             R"(,"prompt_lookup_max":3})");
  Engine e(be, c);
  EngineRun out;
  out.tokens.resize(prompts.size());
  std::vector<std::shared_ptr<RequestStream>> ss;
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  for (const auto& p : prompts) ss.push_back(e.submit(p, sp));
  while (e.step())
    for (size_t i = 0; i < ss.size(); ++i)
      while (auto ev = ss[i]->next(std::chrono::milliseconds(0)))
        out.tokens[i].insert(out.tokens[i].end(), ev->tokens.begin(), ev->tokens.end());
  EXPECT_EQ(e.num_active(), 0);
  EXPECT_EQ(e.stats().kv_pages_used[kKvFull], 0);
  EXPECT_EQ(e.stats().kv_pages_used[kKvSliding], 0);
  out.drafted = e.metrics().spec_draft_tokens.load();
  out.accepted = e.metrics().spec_accepted_tokens.load();
  return out;
}

// The engine on the CUDA backend (batch-invariant): n-gram speculative greedy decoding with
// K = 1..4 emits exactly plain greedy decoding's tokens, 16 requests batched and some alone,
// and drafts were really verified (some accepted, some rejected).
TEST_F(CudaSpec, SpeculativeGreedyEqualsPlainGreedy) {
  auto be = make(true);
  const int n = 16, max_tokens = 48;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(prompt_of(i));
  const EngineRun plain = serve(*be, 0, prompts, max_tokens);
  EXPECT_EQ(plain.drafted, 0);
  for (int k = 1; k <= 4; ++k) {
    const EngineRun spec = serve(*be, k, prompts, max_tokens);
    std::printf("K=%d: %lld drafts, %lld accepted\n", k, (long long)spec.drafted, (long long)spec.accepted);
    EXPECT_GT(spec.accepted, 0) << k;
    EXPECT_LT(spec.accepted, spec.drafted) << k;
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(int(spec.tokens[i].size()), max_tokens) << "K=" << k << " request " << i;
      EXPECT_EQ(spec.tokens[i], plain.tokens[i]) << "K=" << k << " request " << i;
    }
    for (int i = k - 1; i < n; i += 4) {
      const EngineRun alone = serve(*be, k, {prompts[i]}, max_tokens);
      EXPECT_EQ(alone.tokens[0], plain.tokens[i]) << "K=" << k << " request " << i << " alone";
    }
  }
}

}  // namespace
}  // namespace gptoss
