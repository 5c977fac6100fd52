// The whole model on the GPU against the exact CPU backend: the tiny golden fixture and a 2-layer
// model with gpt-oss-120b layer shapes (written by make-model, so both backends read the same
// checkpoint). Logits relative error <= 2e-2; greedy tokens equal for 16 steps.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "backend/backend_factory.h"
#include "backend/cuda/cublaslt_gemm.h"
#include "backend/cuda/kernels/linear/lm_head_screen.h"
#include "backend/cuda/pass_meta_layout.h"
#include "backend/decode_batch.h"
#include "backend/solo_sequence.h"
#include "model/make_model.h"
#include "checkpoint_patch.h"
#include "cuda_test_util.h"

namespace gptoss {
namespace {

using namespace gptoss::test;

const std::string kFixture = tiny_fixture_dir();

std::unique_ptr<Backend> make(const std::string& device, const std::string& dir,
                              const std::string& mxfp4_layers = "experts", bool batch_invariant = false) {
  BackendOptions o;
  o.device = device;
  o.model_dir = dir;
  o.mxfp4_layers = mxfp4_layers;
  o.batch_invariant = batch_invariant;
  return create_backend(o);
}

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

struct Compare {
  double prefill_err = 0;
  double median_row_err = 0;
  double frac_rows_over = 0;  // rows whose own rel err exceeds 2e-2
  int greedy_equal = 0;
  // Steps before the first CPU near-tie (top-2 gap < 2% of the logits' rms): a bf16 path may
  // pick either token there, so greedy equality is required only up to it.
  int greedy_required = 0;
};

// Prefill `prompt` (all logits) on both backends, then `steps` greedy steps each on its own.
Compare compare(Backend& gpu, Backend& cpu, const std::vector<int32_t>& prompt, int steps, DType kv = DType::BF16) {
  Compare c;
  SoloSequence sg(gpu, int(prompt.size()) + steps + 1, 16, kv), sc(cpu, int(prompt.size()) + steps + 1, 16);
  auto lg = sg.append(prompt, true), lc = sc.append(prompt, true);
  c.prefill_err = rel_err(lg, lc);
  const int V = cpu.config().vocab;
  {
    // Per-row errors: a few bad rows point at discrete decisions (expert routing), all rows at a bug.
    std::vector<double> rows;
    for (size_t r = 0; r < prompt.size(); ++r)
      rows.push_back(rel_err(std::vector<float>(lg.begin() + r * V, lg.begin() + (r + 1) * V),
                             std::vector<float>(lc.begin() + r * V, lc.begin() + (r + 1) * V)));
    auto sorted = rows;
    std::sort(sorted.begin(), sorted.end());
    int bad = int(std::count_if(rows.begin(), rows.end(), [](double e) { return e > 2e-2; }));
    c.median_row_err = sorted[sorted.size() / 2];
    c.frac_rows_over = double(bad) / rows.size();
    std::printf("  rows: median rel err %.3g, max %.3g, rows over 2e-2: %d of %zu; first bad rows:", sorted[sorted.size() / 2],
                sorted.back(), bad, rows.size());
    for (size_t r = 0, shown = 0; r < rows.size() && shown < 8; ++r)
      if (rows[r] > 2e-2) { std::printf(" %zu(%.2g)", r, rows[r]); ++shown; }
    std::printf("\n");
  }
  std::vector<float> last_g(lg.end() - V, lg.end()), last_c(lc.end() - V, lc.end());
  std::vector<int> tg, tc;
  c.greedy_required = -1;
  for (int s = 0; s < steps; ++s) {
    tg.push_back(argmax(last_g));
    tc.push_back(argmax(last_c));
    if (c.greedy_required < 0) {
      std::vector<float> sorted = last_c;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      double ms = 0;
      for (float v : last_c) ms += double(v) * v;
      if (sorted[0] - sorted[1] < 0.02 * std::sqrt(ms / last_c.size())) c.greedy_required = s;
    }
    last_g = sg.append({tg.back()}, false);
    last_c = sc.append({tc.back()}, false);
  }
  while (c.greedy_equal < steps && tg[c.greedy_equal] == tc[c.greedy_equal]) ++c.greedy_equal;
  if (c.greedy_required < 0) c.greedy_required = steps;
  return c;
}

class CudaModel : public CudaTest {};

TEST_F(CudaModel, TinyFixtureMatchesCpu) {
  auto gpu = make("cuda", kFixture), cpu = make("cpu", kFixture);
  const int V = cpu->config().vocab;
  // The fixture's own prompts (lengths 1, 20, 45; the last crosses the window of 8), whose
  // greedy continuations transformers recorded, plus a fresh random prompt for the logits only.
  std::ifstream gf(kFixture + "/golden.json");
  auto prompts = nlohmann::json::parse(gf)["prompts"].get<std::vector<std::vector<int32_t>>>();
  ASSERT_EQ(prompts.size(), 3u);
  FastRng r(fresh_seed());
  std::vector<int32_t> rnd;
  for (int i = 0; i < 33; ++i) rnd.push_back(int(r.next() % V));
  {
    Compare c = compare(*gpu, *cpu, rnd, 4);
    std::printf("tiny fixture, random 33-token prompt: prefill logits rel err %.3g\n", c.prefill_err);
    // Per-row median, as for the quantized layers below: a fresh random prompt may hold a token
    // whose top-2 experts are near-tied, which the bf16 GPU and the fp32 CPU then pick apart (one
    // row at ~0.1 lifts the whole prompt's error: 0.0213 once in s21r3). A wrong kernel moves
    // every row. The fixture's own prompts below stay held to the whole-prompt bound.
    EXPECT_LE(c.median_row_err, 2e-2);
    EXPECT_LE(c.frac_rows_over, 0.1);
    EXPECT_LE(c.prefill_err, 5e-2);
  }
  for (auto& p : prompts) {
    Compare c = compare(*gpu, *cpu, p, 16);
    std::printf("tiny fixture, %zu-token prompt: prefill logits rel err %.3g, greedy equal %d/16\n", p.size(),
                c.prefill_err, c.greedy_equal);
    EXPECT_LE(c.prefill_err, 2e-2);
    std::printf("  greedy: first CPU near-tie at step %d\n", c.greedy_required);
    EXPECT_GE(c.greedy_equal, c.greedy_required);
  }
  Compare c8 = compare(*gpu, *cpu, prompts[2], 16, DType::F8_E4M3);
  std::printf("tiny fixture, fp8 KV: prefill logits rel err %.3g, greedy equal %d/16\n", c8.prefill_err,
              c8.greedy_equal);
  EXPECT_LE(c8.prefill_err, 8e-2);
}

// An eager pass longer than the backend's chunk (GPTOSS_MAX_CHUNK; 8192 tokens on an H200) runs
// as chunks in batch order, each token attending through the pages to the earlier chunks' K/V:
// a 150-token prompt cut into chunks of 37 (the last with logits rows of two chunks) against the
// CPU, as the uncut prompt is held in TinyFixtureMatchesCpu.
TEST_F(CudaModel, ChunkedPassMatchesCpu) {
  ::setenv("GPTOSS_MAX_CHUNK", "37", 1);
  auto gpu = make("cuda", kFixture);
  ::unsetenv("GPTOSS_MAX_CHUNK");
  auto cpu = make("cpu", kFixture);
  FastRng r(fresh_seed());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(int(r.next() % cpu->config().vocab));
  Compare c = compare(*gpu, *cpu, prompt, 4);
  std::printf("tiny fixture, 150-token prompt in chunks of 37: prefill logits rel err %.3g\n", c.prefill_err);
  EXPECT_LE(c.median_row_err, 2e-2);
  EXPECT_LE(c.frac_rows_over, 0.1);
  EXPECT_LE(c.prefill_err, 5e-2);
}

// Several sequences decoding in one batch (a graph bucket with padding) give each sequence's
// logits alone: within rounding by default (a prompt prefilled in a mixed batch takes other
// kernels than alone), bit for bit with --batch-invariant. S sequences: 3, or 40, whose decode
// pass runs the dense layers on cuBLASLt (cublas_min_rows) where alone they take the skinny
// kernels over the decode copies. grow_pt: a second decode step (a replay of the first step's
// graph) in which the last sequence's page table grows by a page in each group (position 15 -> 16)
// and no other sequence's does; the place just past the first step's page table then holds that
// sequence's first page in the second group, made id 2 (< S): a part of the metadata read there
// (a bucket's real-token count was) would route only 2 of the S tokens to experts.
void check_batched_decode(bool invariant, int S = 3, bool grow_pt = false) {
  auto gpu = make("cuda", kFixture, "experts", invariant);
  const int V = gpu->config().vocab, ps = 16, maxlen = 64;
  KvCacheConfig kv;
  kv.page_size = ps;
  kv.num_pages[0] = kv.num_pages[1] = S * maxlen / ps;
  gpu->init_kv_cache(kv);
  std::vector<std::vector<int32_t>> pages(S);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < maxlen / ps; ++i) pages[s].push_back(s + S * i);  // interleaved pages
  FastRng r(fresh_seed());
  std::vector<int> lens = {5, 17, 40};
  while (int(lens.size()) < S) lens.push_back(2 + int(r.next() % 50));
  lens.resize(S);
  if (grow_pt) {
    ASSERT_GT(S, 6);
    for (int s = 0; s < S - 1; ++s)
      if (lens[s] % ps == ps - 1) --lens[s];  // positions len and len + 1 on one page
    lens[S - 1] = ps - 1;
    std::swap(pages[S - 1][0], pages[2][0]);  // page 2 (seq 2's first) becomes the last sequence's first
  }
  // Prefill all three in one mixed batch.
  std::vector<std::vector<int32_t>> toks(S);
  ForwardBatch fb = mixed_prefill_batch(pages, lens, V, r, toks);
  std::vector<float> lg(size_t(S) * V);
  gpu->forward(fb, lg.data());
  // One decode step of all three (graph bucket 4, one padding token).
  ForwardBatch db;
  for (int s = 0; s < S; ++s) {
    SeqBatchInfo si;
    si.first_token = s;
    si.n_tokens = 1;
    si.start_pos = lens[s];
    for (int g = 0; g < 2; ++g) { si.pages[g] = pages[s].data(); si.n_pages[g] = int(pages[s].size()); }
    int t = argmax(std::vector<float>(lg.begin() + size_t(s) * V, lg.begin() + size_t(s + 1) * V));
    toks[s].push_back(t);
    db.tokens.push_back(t);
    db.seqs.push_back(si);
    db.logit_rows.push_back(S - 1 - s);  // reversed order
  }
  std::vector<float> ld(size_t(S) * V);
  gpu->forward(db, ld.data());
  std::vector<int32_t> greedy(S);
  // The same step again through forward_greedy must not change the cache's meaning (it
  // rewrites the same positions with the same values).
  gpu->forward_greedy(db, greedy.data());
  // forward_sample with every other row kept for the host (the engine's mixed sampling, on the
  // decode graph's path): kept rows not drawn, their logits those forward() gave; the others
  // drawn as forward_greedy drew them.
  {
    std::vector<bool> keep(S, false);
    for (int i = 0; i < S; ++i) keep[size_t(i)] = i % 2 == 0;
    expect_kept_rows(*gpu, db, keep, ld, greedy, V);
  }
  // The same pass with logit_bias / penalties on every other row, drawn on the device.
  for (float temp : {0.0f, 0.8f}) expect_adjusted_rows(*gpu, db, ld, V, temp);
  if (grow_pt) {  // the second step: each sequence's greedy token at the next position
    ForwardBatch db2 = db;
    for (int s = 0; s < S; ++s) {
      const int t = argmax(std::vector<float>(ld.begin() + size_t(S - 1 - s) * V, ld.begin() + size_t(S - s) * V));
      toks[s].push_back(t);
      db2.tokens[s] = t;
      db2.seqs[s].start_pos = lens[s] + 1;
    }
    gpu->forward(db2, ld.data());
    gpu->forward_greedy(db2, greedy.data());
  }
  // The wide cases (33 and 40 sequences) prefill ~800-1,000 tokens on the GEMM kernels where each sequence alone takes the
  // decode kernels; on the tiny fixture (top-2 of 8 experts) that rounding can flip one prompt
  // token's expert choice, which moves its sequence's logits by ~10%: on an H200 (sixteenth
  // session) 2 of 9 runs had one of the 40 sequences at 0.087-0.095, the other 39 within 5e-3.
  // So the wide case lets one sequence past 5e-3 (not past 0.25, nor two of them: a faulty kernel
  // moves many rows, and by more); the other cases, and the batch-invariant mode, stay exact.
  const int flips_allowed = (S >= 32 && !invariant) ? 1 : 0;
  int over = 0;
  for (int s = 0; s < S; ++s) {
    auto gpu2 = make("cuda", kFixture, "experts", invariant);
    SoloSequence solo(*gpu2, maxlen);
    // Same kernels as the batched step: prefill all but the last token, decode the last alone.
    solo.append(std::vector<int32_t>(toks[s].begin(), toks[s].end() - 1), false);
    auto l = solo.append({toks[s].back()}, false);
    std::vector<float> got(ld.begin() + size_t(S - 1 - s) * V, ld.begin() + size_t(S - s) * V);
    double e = rel_err(got, l);
    // Seq 0's prompt went through the GEMM path in the mixed batch and the GEMV path alone,
    // so its cached K/V differ by rounding.
    if (e > 5e-3) ++over;
    EXPECT_LE(e, flips_allowed ? 0.25 : 5e-3) << "seq " << s;
    if (invariant) { EXPECT_EQ(got, l) << "batch-invariant: seq " << s << " differs from its run alone"; }
    std::printf("batched decode vs alone%s, seq %d: rel err %.3g\n", invariant ? " (batch-invariant)" : "", s, e);
    EXPECT_EQ(greedy[S - 1 - s], argmax(got)) << "seq " << s;  // the batch's own greedy pass
  }
  EXPECT_LE(over, flips_allowed) << "sequences past 5e-3 of their runs alone";
}

TEST_F(CudaModel, BatchedDecodeEqualsAlone) { check_batched_decode(false); }
TEST_F(CudaModel, BatchInvariantDecodeIsExact) { check_batched_decode(true); }
TEST_F(CudaModel, WideBatchedDecodeEqualsAlone) { check_batched_decode(false, 40); }
// 33 sequences: graph bucket 40 (the buckets step by 8 past 8), seven padding tokens.
TEST_F(CudaModel, BetweenBucketsBatchedDecodeEqualsAlone) { check_batched_decode(false, 33); }
// The same bucket's graph replayed after the page table grew (see check_batched_decode).
TEST_F(CudaModel, GraphReplayAfterPageTableGrowth) { check_batched_decode(false, 33, true); }

// Pipelined greedy decoding (launch_greedy: step i + 1 replayed with its tokens copied on the
// device from step i's ids, before the host reads them) gives the ids of step-by-step decoding,
// bit for bit (the same graphs): one sequence (bucket 1) and three (bucket 4, a padding token),
// with the prompts prefilled alone on pages interleaved across the sequences.
TEST_F(CudaModel, PipelinedGreedyEqualsStepByStep) {
  auto gpu = make("cuda", kFixture);
  const int V = gpu->config().vocab, per = 8, steps = 40;
  FastRng r(fresh_seed());
  for (int S : {1, 3}) {
    std::vector<std::vector<int32_t>> prompts(S), got[2];
    for (int q = 0; q < S; ++q)
      for (int i = 0, n = 3 + int(r.next() % 20); i < n; ++i) prompts[q].push_back(int(r.next() % V));
    for (int pipelined = 0; pipelined < 2; ++pipelined) {
      KvCacheConfig kv;
      kv.page_size = 16;
      kv.num_pages[kKvFull] = kv.num_pages[kKvSliding] = S * per;
      gpu->init_kv_cache(kv);
      std::vector<std::vector<int32_t>> pages(S);
      for (int q = 0; q < S; ++q)
        for (int i = 0; i < per; ++i) pages[q].push_back(q + S * i);
      DecodeBatch batch(*gpu, pages);
      for (int q = 0; q < S; ++q) batch.prefill(q, prompts[q]);
      got[pipelined] = batch.decode(steps, pipelined == 1);
    }
    EXPECT_EQ(got[1], got[0]) << S << " sequences";
    std::printf("%d sequences: %d pipelined steps equal to step-by-step ones\n", S, steps);
  }
}

// A pass of another kind between two pipelined ones (here a prefill of another sequence, which
// writes the device's id buffer) breaks the chain: the next launch takes the last pass's ids
// from the host instead, and the ids stay those of step-by-step decoding.
TEST_F(CudaModel, PipelinedGreedyAfterAnotherPass) {
  auto gpu = make("cuda", kFixture);
  const int V = gpu->config().vocab;
  KvCacheConfig kv;
  kv.page_size = 16;
  kv.num_pages[kKvFull] = kv.num_pages[kKvSliding] = 8;
  FastRng r(fresh_seed());
  std::vector<int32_t> prompt, other;
  for (int i = 0; i < 9; ++i) prompt.push_back(int(r.next() % V));
  for (int i = 0; i < 5; ++i) other.push_back(int(r.next() % V));
  std::vector<int32_t> want;
  {
    gpu->init_kv_cache(kv);
    DecodeBatch b(*gpu, {{0, 1, 2, 3}});
    b.prefill(0, prompt);
    for (auto& step : b.decode(6, false)) want.push_back(step[0]);
  }
  gpu->init_kv_cache(kv);
  DecodeBatch b(*gpu, {{0, 1, 2, 3}}), o(*gpu, {{4, 5, 6, 7}});
  b.prefill(0, prompt);
  std::vector<int32_t> got;
  int32_t id = -1;
  auto step = [&](int pos, int32_t tok) {
    ForwardBatch fb;
    fb.tokens = {tok};
    SeqBatchInfo s;
    s.n_tokens = 1;
    s.start_pos = pos;
    static const int32_t pg[4] = {0, 1, 2, 3};
    for (int g = 0; g < 2; ++g) {
      s.pages[g] = pg;
      s.n_pages[g] = 4;
    }
    fb.seqs.push_back(s);
    fb.logit_rows.push_back(0);
    return fb;
  };
  const int p0 = int(prompt.size());
  auto finish = [&] {
    gpu->finish_greedy(&id);
    got.push_back(id);
  };
  gpu->launch_greedy(step(p0, b.next()[0]), false);
  gpu->launch_greedy(step(p0 + 1, 0), true);
  finish();
  o.prefill(0, other);  // another pass: the device's ids are now its
  gpu->launch_greedy(step(p0 + 2, 0), true);  // from the host: step 1's ids, read back
  finish();
  gpu->launch_greedy(step(p0 + 3, 0), true);  // on the device again, from step 2's
  finish();
  gpu->launch_greedy(step(p0 + 4, 0), true);
  finish();
  finish();
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + 5));
}

// The metadata a captured decode graph reads sits where the bucket alone puts it, whatever the
// length of the page table (pass_meta_layout). Runs without a GPU.
TEST(PassMetaLayout, OffsetsDependOnTheBucketOnly) {
  for (size_t n : {1, 8, 40, 64})
    for (size_t rows : {size_t(1), n}) {
      const cuda::PassMetaLayout a = cuda::pass_meta_layout(n, rows, 2), b = cuda::pass_meta_layout(n, rows, 900);
      EXPECT_EQ(a.tokens, b.tokens);
      EXPECT_EQ(a.pos, b.pos);
      EXPECT_EQ(a.off0, b.off0);
      EXPECT_EQ(a.off1, b.off1);
      EXPECT_EQ(a.rows, b.rows);
      EXPECT_EQ(a.n_real, b.n_real);
      EXPECT_EQ(a.pt, b.pt);
      EXPECT_EQ(b.end - b.pt, 900u);
      // The parts do not overlap and the page table is last.
      const size_t starts[] = {a.tokens, a.pos, a.off0, a.off1, a.rows, a.n_real, a.pt, a.end};
      const size_t sizes[] = {n, n, n, n, rows, 1, 2};
      for (int i = 0; i < 7; ++i) EXPECT_EQ(starts[i] + sizes[i], starts[i + 1]) << i;
    }
}
// The same with qkv's bf16 store staged through f32 rows (as when the biases are not bf16
// values): the staging the decode graphs capture is reserved at start-up.
TEST_F(CudaModel, WideBatchedDecodeStagedStore) {
  cuda::CublasLtGemm::set_force_staging(true);
  check_batched_decode(false, 40);
  cuda::CublasLtGemm::set_force_staging(false);
}

// --mxfp4-layers all (q/k/v, o and lm_head quantized to MXFP4 at load) on a copy of the fixture
// whose dense weights were first quantized and dequantized back into bf16: they are MXFP4 values
// already, so the GPU's quantization at load is lossless and its logits must match the CPU's on
// that same checkpoint as closely as with bf16 dense layers. A wrong layout, scale or kernel
// would show as a large error.
// `--random-weights` as a loop model (`--random-loop-tokens`, model/make_model.h LoopSpec): greedy
// decoding on the GPU walks the cycle, as on a make-model loop checkpoint on the CPU.
TEST_F(CudaModel, RandomLoopModelWalksTheCycle) {
  BackendOptions o;
  o.device = "cuda";
  o.random_weights = "tiny";
  o.random_loop_tokens = 8;
  auto gpu = create_backend(o);
  const LoopSpec loop{8};
  SoloSequence seq(*gpu, 64);
  auto logits = seq.append({5, 77, loop.first_id + 3}, false);
  int expect = loop.first_id + 4;
  for (int step = 0; step < 24; ++step) {
    const int got = argmax(logits);
    ASSERT_EQ(got, expect) << "step " << step;
    logits = seq.append({got}, false);
    expect = loop.first_id + (got - loop.first_id + 1) % loop.tokens;
  }
}

TEST_F(CudaModel, Mxfp4DenseLayersMatchCpu) {
  namespace fs = std::filesystem;
  auto dir = (fs::temp_directory_path() / ("gptoss-cuda-mx-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::copy(kFixture, dir, fs::copy_options::recursive);
  for (const char* suffix : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                             "self_attn.o_proj.weight", "lm_head.weight"})
    patch_tensors(dir, suffix, [](const std::string& dt, const std::vector<int64_t>& shape, std::vector<uint8_t>& b) {
      ASSERT_EQ(dt, "BF16");
      const int K = int(shape.back());
      const size_t rows = b.size() / 2 / K;
      auto* p = reinterpret_cast<uint16_t*>(b.data());
      std::vector<float> row(K);
      std::vector<uint8_t> blocks(K / 2), scales(K / 32);
      for (size_t r = 0; r < rows; ++r) {
        for (int k = 0; k < K; ++k) row[k] = bf16_to_f32(p[r * K + k]);
        mxfp4_quantize_row(row.data(), K, blocks.data(), scales.data());
        mxfp4_dequant_row(blocks.data(), scales.data(), K, row.data());
        for (int k = 0; k < K; ++k) p[r * K + k] = f32_to_bf16(row[k]);
      }
    });
  {
    auto gpu = make("cuda", dir, "all"), cpu = make("cpu", dir);
    std::ifstream gf(kFixture + "/golden.json");
    auto prompts = nlohmann::json::parse(gf)["prompts"].get<std::vector<std::vector<int32_t>>>();
    for (auto& p : prompts) {
      Compare c = compare(*gpu, *cpu, p, 16);
      std::printf("mxfp4 dense layers, %zu-token prompt: prefill logits rel err %.3g, greedy equal %d/16 "
                  "(first CPU near-tie at step %d)\n",
                  p.size(), c.prefill_err, c.greedy_equal, c.greedy_required);
      // Per-row median: the quantized attention weights give other router logits than the
      // fixture's, and a token whose top-2 experts are near-tied can flip between the bf16 GPU
      // and the fp32 CPU (one row at ~0.1 then lifts the whole-prompt error; seen once at 0.025).
      // A wrong layout, scale or kernel moves every row.
      EXPECT_LE(c.median_row_err, 2e-2);
      EXPECT_LE(c.prefill_err, 5e-2);
      EXPECT_GE(c.greedy_equal, c.greedy_required);
    }
  }
  fs::remove_all(dir);
}

// Three sequences decoding together at 120b's shapes (graph bucket 4, one padding token: the
// router folds into o_proj at 2-8 tokens, RouterFold::n_valid keeping the padding out of the
// experts), four steps, each step's tokens the GPU's greedy picks; every row's logits against the
// CPU's for that sequence alone on the same tokens. A near-tied expert choice can move one row (as
// in the one-sequence checks above), so the median row must meet the bound and at most 3 of the
// 12 rows exceed it; a wrong token's rows, sums or routing in the batch would miss on every row.
void check_batched_120b_shapes(Backend& gpu, Backend& cpu, FastRng& r) {
  const int S = 3, ps = 16, maxlen = 64, steps = 4, V = cpu.config().vocab;
  KvCacheConfig kv;
  kv.page_size = ps;
  kv.num_pages[0] = kv.num_pages[1] = S * maxlen / ps;
  gpu.init_kv_cache(kv);
  std::vector<std::vector<int32_t>> pages(S), toks(S);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < maxlen / ps; ++i) pages[s].push_back(s + S * i);
  const std::vector<int> lens = {5, 17, 40};
  auto seq_info = [&](int s, int first, int n, int pos) {
    SeqBatchInfo si;
    si.first_token = first;
    si.n_tokens = n;
    si.start_pos = pos;
    for (int g = 0; g < 2; ++g) {
      si.pages[g] = pages[s].data();
      si.n_pages[g] = int(pages[s].size());
    }
    return si;
  };
  ForwardBatch fb;
  for (int s = 0; s < S; ++s) {
    fb.seqs.push_back(seq_info(s, int(fb.tokens.size()), lens[s], 0));
    for (int i = 0; i < lens[s]; ++i) {
      toks[s].push_back(int(r.next() % V));
      fb.tokens.push_back(toks[s].back());
    }
    fb.logit_rows.push_back(int(fb.tokens.size()) - 1);
  }
  std::vector<float> lg(size_t(S) * V);
  gpu.forward(fb, lg.data());
  std::vector<std::vector<float>> gpu_rows(S);  // each sequence's decode rows, step by step
  for (int step = 0; step < steps; ++step) {
    ForwardBatch db;
    for (int s = 0; s < S; ++s) {
      const int t = argmax(std::vector<float>(lg.begin() + size_t(s) * V, lg.begin() + size_t(s + 1) * V));
      toks[s].push_back(t);
      db.tokens.push_back(t);
      db.seqs.push_back(seq_info(s, s, 1, int(toks[s].size()) - 1));
      db.logit_rows.push_back(s);
    }
    gpu.forward(db, lg.data());
    for (int s = 0; s < S; ++s) gpu_rows[s].insert(gpu_rows[s].end(), lg.begin() + size_t(s) * V, lg.begin() + size_t(s + 1) * V);
  }
  std::vector<double> errs;
  for (int s = 0; s < S; ++s) {
    SoloSequence sc(cpu, lens[s] + steps + 1, ps);
    sc.append(std::vector<int32_t>(toks[s].begin(), toks[s].begin() + lens[s]), false);
    for (int step = 0; step < steps; ++step) {
      const auto lc = sc.append({toks[s][lens[s] + step]}, false);
      errs.push_back(rel_err(std::vector<float>(gpu_rows[s].begin() + size_t(step) * V,
                                                gpu_rows[s].begin() + size_t(step + 1) * V), lc));
    }
  }
  auto sorted = errs;
  std::sort(sorted.begin(), sorted.end());
  const int over = int(std::count_if(errs.begin(), errs.end(), [](double e) { return e > 2e-2; }));
  std::printf("2-layer 120b shapes, 3 sequences batched, %d steps: rows' rel err median %.3g, max %.3g, over 2e-2: %d\n",
              steps, sorted[sorted.size() / 2], sorted.back(), over);
  EXPECT_LE(sorted[sorted.size() / 2], 2e-2) << "median row";
  EXPECT_LE(over, 3) << "rows over the bound";
}

// Greedy passes of 1-8 rows read lm_head through its int8 screen (kernels/linear/lm_head_screen.h):
// the ids must be the full lm_head's, bit for bit. One sequence and three (bucket 4, a padding
// row), pipelined greedy steps and forward_sample steps at temperature 0 (the engine's way), with
// the screen and without it (set_lm_head_screen), at the real vocabulary.
void check_screened_greedy(Backend& gpu, FastRng& r) {
  const int V = gpu.config().vocab, per = 4, steps = 24;
  for (int S : {1, 3}) {
    for (bool sampled : {false, true}) {
      std::vector<std::vector<int32_t>> prompts(S), got[2];
      for (int q = 0; q < S; ++q)
        for (int i = 0, n = 2 + int(r.next() % 9); i < n; ++i) prompts[q].push_back(int(r.next() % V));
      for (int screened : {1, 0}) {
        cuda::set_lm_head_screen(screened);
        KvCacheConfig kv;
        kv.page_size = 16;
        kv.num_pages[kKvFull] = kv.num_pages[kKvSliding] = S * per;
        gpu.init_kv_cache(kv);
        std::vector<std::vector<int32_t>> pages(S);
        for (int q = 0; q < S; ++q)
          for (int i = 0; i < per; ++i) pages[q].push_back(q + S * i);
        DecodeBatch batch(gpu, pages);
        for (int q = 0; q < S; ++q) batch.prefill(q, prompts[q]);
        const long long before = cuda::lm_head_screen_passes();
        RowSampling greedy;
        greedy.temperature = 0.f;
        got[screened] = sampled ? batch.decode_sampled(steps, greedy) : batch.decode(steps, true);
        if (screened) {
          EXPECT_EQ(cuda::lm_head_screen_passes() - before, steps) << "every step through the screen";
        } else {
          EXPECT_EQ(cuda::lm_head_screen_passes(), before);
        }
      }
      cuda::set_lm_head_screen(-1);
      EXPECT_EQ(got[1], got[0]) << S << " sequences" << (sampled ? ", forward_sample" : "");
      std::printf("lm_head screen: %d sequences, %d %s steps equal to the full lm_head's\n", S, steps,
                  sampled ? "forward_sample (temperature 0)" : "pipelined greedy");
    }
  }
}

TEST_F(CudaModel, TwoLayers120bShapesMatchCpu) {
  if (small_mode()) GTEST_SKIP() << "large";
  namespace fs = std::filesystem;
  auto dir = (fs::temp_directory_path() / ("gptoss-cuda-120b2-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  GptOssConfig cfg = GptOssConfig::preset("120b");
  cfg.num_layers = 2;
  cfg.layer_sliding = {true, false};
  make_random_model(cfg, dir, 1234);
  shrink_expert_outputs(dir);
  {
    auto gpu = make("cuda", dir), cpu = make("cpu", dir);
    FastRng r(fresh_seed());
    std::vector<int32_t> prompt;
    for (int i = 0; i < 150; ++i) prompt.push_back(int(r.next() % cfg.vocab));  // crosses the 128 window
    // Three one-token prompts: a token whose 4th and 5th expert are near-tied can route
    // differently on the bf16 GPU and the fp32 CPU, and with one row nothing else dilutes that
    // (seen once: 0.042 on a single prompt while its 16 greedy steps matched). The median of the
    // three must meet the bound, as the median row does for the long prompt.
    // Greedy steps likewise: an expert choice near-tied at a later step flips the same way
    // (seen once in ~20 runs: 14 of 16 steps equal, the logits' near-tie rule blind to it), so two
    // of the three prompts must match up to their first CPU near-tie; a wrong kernel misses all.
    std::vector<double> e1;
    int greedy_ok = 0;
    for (int i = 0; i < 3; ++i) {
      Compare c1 = compare(*gpu, *cpu, {prompt[i]}, 16);
      std::printf("2-layer 120b shapes, 1-token prompt %d: prefill logits rel err %.3g, greedy equal %d/16 "
                  "(first CPU near-tie at step %d)\n", i, c1.prefill_err, c1.greedy_equal, c1.greedy_required);
      e1.push_back(c1.prefill_err);
      greedy_ok += c1.greedy_equal >= c1.greedy_required;
    }
    EXPECT_GE(greedy_ok, 2) << "1-token prompts whose greedy steps match the CPU's";
    std::sort(e1.begin(), e1.end());
    Compare c = compare(*gpu, *cpu, prompt, 16);
    std::printf("2-layer 120b shapes, 150-token prompt: prefill logits rel err %.3g, greedy equal %d/16\n",
                c.prefill_err, c.greedy_equal);
    EXPECT_LE(e1[1], 2e-2) << "median of the 1-token prompts' errors";
    EXPECT_LE(c.prefill_err, 2e-2);
    EXPECT_LE(c.median_row_err, 2e-2);
    EXPECT_GE(c.greedy_equal, c.greedy_required);
    RecordProperty("whole_prompt_rel_err", std::to_string(c.prefill_err));
    RecordProperty("greedy_equal", std::to_string(c.greedy_equal));
    check_batched_120b_shapes(*gpu, *cpu, r);
    check_screened_greedy(*gpu, r);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gptoss
