// Attention kernels (kernels/attention) against the CPU reference: paged prefill, decode on tensor
// cores at every plan, the flash kernel, mixed passes, sinks, the 128-token window and FP8 KV.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/kernels.h"

#include "kernel_test_fixture.h"

namespace gptoss {
namespace {

using namespace gptoss::test;
using cuda::Epilogue;
using cuda::WeightMat;

// Attention over pages: K/V of every earlier position are stored by rope_kv_store (as earlier
// passes would have), then the new tokens of each sequence go through RoPE + store + attention.
struct AttnSeq {
  int start, n;
};

// Options of check_attention beyond the shape: the kernel, the page size, and a fixed seed (0:
// fresh) from which every sequence's data derives by its (start, n) alone, so one sequence gets
// the same values alone and batched (the batch-invariance test).
struct AttnRun {
  cuda::AttentionPath path = cuda::AttentionPath::kAuto;
  int page_size = 16;
  uint64_t seed = 0;
  cuda::AttentionPassInfo info{};  // kAuto's hints (zeros: per-token kernel only)
  // attention_decode with `plan` for the new tokens (one a sequence) instead of rope_kv_store +
  // attention; the history is stored by rope_kv_store either way.
  bool fused = false;
  cuda::DecodeAttentionPlan plan{};
  // With fused: rope_kv_store first, then attention_decode in its stored mode (sequences may bring
  // several tokens: speculative verify passes).
  bool kv_stored = false;
  // attention_decode's qkv_overlaps (false: the tensor-core kernel asks for its row before its ring).
  bool qkv_overlaps = true;
  std::vector<uint8_t>* pool_after = nullptr;  // if set: the KV pages after the pass
  // Check against the CPU reference (false: only run the pass and return its rows, for tests that
  // compare two GPU paths each already checked against the CPU elsewhere).
  bool cpu_reference = true;
};

// Returns the kernel's output rows (pass order: sequence after sequence).
std::vector<float> check_attention(const std::vector<AttnSeq>& seqs, int window, bool fp8, int nsplit, int Hq,
                                   int Hkv, int D, const AttnRun& run = {}) {
  const uint64_t seed = run.seed ? run.seed : fresh_seed();
  FastRng r(seed);
  const int ps = run.page_size, QKV = (Hq + 2 * Hkv) * D;
  GptOssConfig cfg;
  cfg.head_dim = D;
  YarnTables yarn = compute_yarn(cfg);
  // Pages: a shuffled pool so page tables are not the identity.
  int total_pages = 0;
  for (auto& s : seqs) total_pages += (s.start + s.n + ps - 1) / ps;
  std::vector<int32_t> perm(total_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = total_pages - 1; i > 0; --i) std::swap(perm[i], perm[r.next() % (i + 1)]);
  std::vector<int32_t> pt;
  std::vector<int> pt_off;
  for (auto& s : seqs) {
    pt_off.push_back(int(pt.size()));
    int np = (s.start + s.n + ps - 1) / ps;
    for (int i = 0; i < np; ++i) pt.push_back(perm[pt.size()]);
  }
  const size_t page_elems = size_t(2) * ps * Hkv * D;
  Dev<uint8_t> pool(size_t(total_pages) * page_elems * (fp8 ? 1 : 2));
  Dev<int32_t> dpt(pt);
  Dev<float> dinv(yarn.inv_freq);
  cuda::KvLayer kv{pool.p(), fp8, ps};
  FastRng rsink(seed + 17);
  auto sinks = rand_f32(Hq, rsink);
  Dev<float> dsinks(sinks);

  // qkv of every position of every sequence (bf16 values), rows grouped by sequence.
  std::vector<std::vector<float>> all(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    FastRng rs(seed * 0x9E3779B97F4A7C15ull + uint64_t(seqs[i].start) * 1000003u + uint64_t(seqs[i].n));
    all[i] = round_bf16(rand_f32(size_t(seqs[i].start + seqs[i].n) * QKV, rs));
  }
  auto run_pass = [&](bool history) {
    std::vector<float> rows;
    std::vector<int32_t> pos, off;
    for (size_t i = 0; i < seqs.size(); ++i) {
      int a = history ? 0 : seqs[i].start, b = history ? seqs[i].start : seqs[i].start + seqs[i].n;
      for (int p = a; p < b; ++p) {
        rows.insert(rows.end(), &all[i][size_t(p) * QKV], &all[i][size_t(p + 1) * QKV]);
        pos.push_back(p);
        off.push_back(pt_off[i]);
      }
    }
    int n = int(pos.size());
    if (n == 0) return std::make_pair(std::vector<float>(), std::vector<float>());
    Dev<uint16_t> dq(to_bf16(rows));
    Dev<int32_t> dpos(pos), doff(off);
    cuda::TokenMeta tm{dpos.p(), doff.p(), dpt.p()};
    if (history || !run.fused || run.kv_stored) cuda::rope_kv_store(dq.p(), n, Hq, Hkv, D, dinv.p(), yarn.attention_scaling, tm, kv, 0);
    if (history) {
      GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
      return std::make_pair(std::vector<float>(), std::vector<float>());
    }
    Dev<float> part(cuda::attention_partial_floats(n, Hq, D, std::max(nsplit, run.plan.nsplit)));
    Dev<uint16_t> out(size_t(n) * Hq * D);
    if (run.fused)
      cuda::attention_decode(dq.p(), n, Hq, Hkv, D, window, dsinks.p(), dinv.p(), yarn.attention_scaling, tm, kv,
                             run.plan, part.p(), out.p(), 0, run.kv_stored, run.qkv_overlaps);
    else
      cuda::attention(dq.p(), n, Hq, Hkv, D, window, dsinks.p(), tm, kv, nsplit, part.p(), out.p(), 0, run.path,
                      run.info);
    if (run.pool_after) {
      run.pool_after->resize(pool.n);
      GPTOSS_CUDA_CHECK(cudaMemcpy(run.pool_after->data(), pool.p(), pool.n, cudaMemcpyDeviceToHost));
    }
    return std::make_pair(from_bf16(out.download()), from_bf16(dq.download()));
  };
  run_pass(true);
  auto [got, qkv_after] = run_pass(false);
  if (!run.cpu_reference) return got;

  // CPU reference, sequence by sequence.
  std::vector<float> ref, ref_q, got_q;
  size_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int L = seqs[i].start + seqs[i].n, n = seqs[i].n;
    std::vector<float> q(size_t(L) * Hq * D), k(size_t(L) * Hkv * D), v(size_t(L) * Hkv * D);
    std::vector<int32_t> pos(L);
    std::iota(pos.begin(), pos.end(), 0);
    for (int p = 0; p < L; ++p) {
      const float* src = &all[i][size_t(p) * QKV];
      std::copy_n(src, Hq * D, &q[size_t(p) * Hq * D]);
      std::copy_n(src + Hq * D, Hkv * D, &k[size_t(p) * Hkv * D]);
      std::copy_n(src + (Hq + Hkv) * D, Hkv * D, &v[size_t(p) * Hkv * D]);
    }
    cpu::rope(q.data(), L, Hq, D, pos.data(), yarn);
    cpu::rope(k.data(), L, Hkv, D, pos.data(), yarn);
    auto store_round = [&](std::vector<float>& t) {
      for (auto& x : t) {
        x = bf16_to_f32(f32_to_bf16(x));
        if (fp8) x = fp8_e4m3_to_f32(f32_to_fp8_e4m3(x));
      }
    };
    q = round_bf16(q);
    store_round(k);
    store_round(v);
    std::vector<float> o(size_t(n) * Hq * D);
    const float* qn = &q[size_t(seqs[i].start) * Hq * D];
    cpu::attention(qn, n, seqs[i].start, k.data(), v.data(), 0, L, Hq, Hkv, D, window, sinks.data(), o.data());
    ref.insert(ref.end(), o.begin(), o.end());
    ref_q.insert(ref_q.end(), qn, qn + size_t(n) * Hq * D);
    for (int t = 0; t < n; ++t, ++row)
      got_q.insert(got_q.end(), &qkv_after[row * QKV], &qkv_after[row * QKV + Hq * D]);
  }
  std::string what = "window=" + std::to_string(window) + " fp8=" + std::to_string(fp8) + " nsplit=" +
                     std::to_string(nsplit) + " seqs=" + std::to_string(seqs.size()) + " first start=" +
                     std::to_string(seqs[0].start) + " n=" + std::to_string(seqs[0].n) +
                     " ps=" + std::to_string(ps) + " Hq/Hkv=" + std::to_string(Hq) + "/" + std::to_string(Hkv) +
                     (run.path == cuda::AttentionPath::kFlash ? " flash" : "") +
                     (run.info.max_seq_tokens ? " auto max_seq_tokens=" + std::to_string(run.info.max_seq_tokens) : "") +
                     (run.fused ? std::string(run.kv_stored ? " stored" : " fused") + " plan=" +
                                      std::to_string(run.plan.nsplit) + (run.plan.cluster ? " cluster" : " split") +
                                      (run.plan.mma ? " mma" : "")
                                : "");
  if (!run.fused || run.kv_stored) {  // fused: q is left unrotated
    EXPECT_LE(rel_err(got_q, ref_q), 1e-2) << "rope: " << what;
  }
  double e = rel_err(got, ref);
  EXPECT_LE(e, 1.5e-2) << what;
  // Token by token too, so one wrong row (a mask off by one at a tile or page edge) cannot hide
  // in the whole batch's error.
  const size_t tok_elems = size_t(Hq) * D;
  int bad = 0;
  for (size_t t = 0; t * tok_elems < got.size() && bad < 5; ++t) {
    std::vector<float> g(got.begin() + t * tok_elems, got.begin() + (t + 1) * tok_elems);
    std::vector<float> w(ref.begin() + t * tok_elems, ref.begin() + (t + 1) * tok_elems);
    const double et = rel_err(g, w);
    if (et > 4e-2) {
      ++bad;
      ADD_FAILURE() << what << ": pass row " << t << " rel err " << et;
    }
  }
  std::printf("attention %s: rel err %.3g\n", what.c_str(), e);
  return got;
}

TEST_F(Kernels, AttentionPaged) {
  std::vector<std::vector<AttnSeq>> batches = {
      {{0, 1}},                               // first token
      {{200, 1}, {5, 1}, {2048, 1}},          // decode batch, contexts across 128
      {{0, 33}},                              // prefill
      {{100, 129}},                           // chunked prefill crossing the window
      {{127, 2}, {0, 129}},                   // mixed
  };
  if (!small_mode()) batches.push_back({{0, 2049}});
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  for (auto& b : batches)
    for (int window : {0, 128})
      for (bool fp8 : {false, true})
        for (int nsplit : {1, 5, 32}) {
          if (b.size() == 1 && b[0].n > 129 && nsplit != 1) continue;
          check_attention(b, window, fp8, nsplit, Hq, Hkv, 64);
        }
  // The tiny preset's shape: head_dim 32, 2 query heads per kv head.
  check_attention({{30, 3}}, 16, false, 2, 4, 2, 32);
}

// Two same-sized outputs compared bit for bit: how many elements differ.
size_t elements_differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) differ += std::memcmp(&a[i], &b[i], 4) != 0;
  return differ;
}

// A decode attention case for failure messages.
std::string decode_case(const std::vector<AttnSeq>& b, int window, bool fp8, const cuda::DecodeAttentionPlan& plan) {
  return "seqs=" + std::to_string(b.size()) + " window=" + std::to_string(window) + " fp8=" + std::to_string(fp8) +
         " nsplit=" + std::to_string(plan.nsplit) + (plan.cluster ? " cluster" : " split");
}

// attention_decode under two runs' options (x and y differ in one; their KV pages are read back
// here) over the same data: the same output bits and the same KV pages.
void expect_same_decode(const std::vector<AttnSeq>& b, int window, bool fp8, int Hq, int Hkv, AttnRun x, AttnRun y,
                        const std::string& at) {
  std::vector<uint8_t> pool_x, pool_y;
  x.pool_after = &pool_x;
  y.pool_after = &pool_y;
  const auto f = check_attention(b, window, fp8, x.plan.nsplit, Hq, Hkv, 64, x);
  const auto g = check_attention(b, window, fp8, y.plan.nsplit, Hq, Hkv, 64, y);
  ASSERT_EQ(f.size(), g.size()) << at;
  EXPECT_EQ(elements_differing(f, g), 0u) << at << ": output elements differing";
  EXPECT_TRUE(pool_x == pool_y) << at << ": KV pages differ";
}

// Decode batches for the fused kernel: one new token a sequence at positions around the 128-key
// window, the 32-key tiles and the pages (16 and 7 slots), 1, 7, 33 and 64 sequences of
// different lengths.
std::vector<std::vector<AttnSeq>> decode_batches() {
  std::vector<std::vector<AttnSeq>> b = {
      {{0, 1}},    // the first token: its own k/v only
      {{127, 1}},  // 128 keys: the whole window, 4 tiles
      {{160, 1}},  // window start mid-page, mid-tile
      {{5, 1}, {15, 1}, {16, 1}, {31, 1}, {128, 1}, {129, 1}, {700, 1}},  // 7 sequences
  };
  std::vector<AttnSeq> s33, s64;
  for (int i = 0; i < 33; ++i) s33.push_back({(i * 97 + 3) % 620, 1});
  for (int i = 0; i < 64; ++i) s64.push_back({i == 63 ? 2500 : (i * 53 + i * i) % 400, 1});
  b.push_back(s33);
  if (!small_mode()) b.push_back(s64);
  return b;
}

// attention_decode (RoPE + K/V store + attention in one kernel) against the CPU: every plan
// shape (a cluster of 1, 2, 4, 8 or 16 splits merged in the cluster; 1, 5 or 32 splits merged by the
// second launch; decode_attention_plan's choice), on CUDA cores and on tensor cores, bf16 and fp8
// KV, full and sliding layers, page sizes 16 and 7, the tiny preset's head_dim 32 with 2 query
// heads a kv head (the tensor-core plan falls back), and head_dim 64 with 4 query heads a kv head.
TEST_F(Kernels, AttentionDecodeFused) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const std::vector<cuda::DecodeAttentionPlan> plans = {
      {1, true},        {2, true},       {4, true},        {8, true},        {16, true},      {1, false},
      {5, false},       {32, false},     {1, true, true},  {2, true, true},  {8, true, true}, {16, true, true},
      {1, false, true}, {5, false, true}, {32, false, true}};
  int k = 0;
  for (auto& b : decode_batches())
    for (int window : {0, 128})
      for (bool fp8 : {false, true}) {
        int max_keys = 0;
        for (auto& q : b) max_keys = std::max(max_keys, window ? std::min(q.start + 1, window) : q.start + 1);
        std::vector<cuda::DecodeAttentionPlan> these = {
            cuda::decode_attention_plan(int(b.size()), Hkv, max_keys, 32)};
        // Every plan on the small batches; two more, in turn, on the big ones (CPU time).
        if (b.size() <= 7)
          these.insert(these.end(), plans.begin(), plans.end());
        else
          for (int i = 0; i < 2; ++i) these.push_back(plans[k++ % plans.size()]);
        for (const auto& plan : these) {
          AttnRun run;
          run.page_size = (k++ % 2) ? 7 : 16;
          run.fused = true;
          run.plan = plan;
          check_attention(b, window, fp8, 1, Hq, Hkv, 64, run);
        }
      }
  AttnRun tiny;
  tiny.fused = true;
  for (auto plan : {cuda::DecodeAttentionPlan{1, true}, cuda::DecodeAttentionPlan{4, true},
                    cuda::DecodeAttentionPlan{3, false}, cuda::DecodeAttentionPlan{2, true, true}}) {
    tiny.plan = plan;
    check_attention({{30, 1}, {3, 1}, {17, 1}}, 16, false, 1, 4, 2, 32, tiny);
    check_attention({{40, 1}, {0, 1}}, 0, true, 1, 4, 2, 32, tiny);
  }
  // The tensor-core kernel with fewer query heads than its 8 rows (the tiny fixture's 4 a kv head).
  for (auto plan : {cuda::DecodeAttentionPlan{1, true, true}, cuda::DecodeAttentionPlan{4, true, true},
                    cuda::DecodeAttentionPlan{3, false, true}, cuda::DecodeAttentionPlan{1, false, true}}) {
    tiny.plan = plan;
    check_attention({{130, 1}, {3, 1}, {64, 1}, {63, 1}}, 128, false, 1, 4, 1, 64, tiny);
    check_attention({{200, 1}, {0, 1}}, 0, true, 1, 8, 2, 64, tiny);
  }
}

// attention_decode's stored mode (rope_kv_store first; graphed speculative verify passes) against
// the CPU: sequences of 1-8 tokens in one pass, crossing 64-key tiles, pages (16 and 7 slots) and
// the 128-key window, bf16 and fp8 KV, cluster and split plans on tensor cores, and a plan without
// them (attention()'s per-token kernel).
TEST_F(Kernels, AttentionDecodeStored) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  std::vector<std::vector<AttnSeq>> batches = {
      {{0, 4}},                                    // the first tokens, all in this pass
      {{127, 3}, {5, 2}, {700, 5}},                // around the window and a long context
      {{60, 8}, {0, 1}, {31, 3}, {128, 2}},        // a 64-key tile edge inside one sequence's run
  };
  std::vector<AttnSeq> verify16;  // 16 sequences x (1 + 3 drafts), as a K = 3 verify pass
  for (int i = 0; i < 16; ++i) verify16.push_back({(i * 131 + 7) % 900, 4});
  batches.push_back(verify16);
  const std::vector<cuda::DecodeAttentionPlan> fixed = {{1, true, true}, {4, true, true}, {5, false, true},
                                                       {2, true, false}};
  int k = 0;
  for (auto& b : batches)
    for (int window : {0, 128})
      for (bool fp8 : {false, true}) {
        int max_keys = 0, n = 0;
        for (auto& q : b) {
          const int last = q.start + q.n;
          max_keys = std::max(max_keys, window ? std::min(last, window) : last);
          n += q.n;
        }
        std::vector<cuda::DecodeAttentionPlan> these = {cuda::decode_attention_plan(n, Hkv, max_keys, 32),
                                                        fixed[k++ % fixed.size()]};
        for (const auto& plan : these) {
          AttnRun run;
          run.page_size = (k++ % 2) ? 7 : 16;
          run.fused = true;
          run.kv_stored = true;
          run.plan = plan;
          check_attention(b, window, fp8, 1, Hq, Hkv, 64, run);
        }
      }
}

// On passes of one token a sequence, the stored mode (rope_kv_store, then attention_decode reading
// every key from the pages) gives the fused mode's bits: the same pages after the pass and the same
// output, for cluster and split plans, bf16 and fp8 KV, full and sliding layers. (Batches up to 33
// sequences: a bit-for-bit comparison needs no more, and the suite's time matters.)
TEST_F(Kernels, AttentionDecodeStoredMatchesFused) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const uint64_t seed = fresh_seed() | 1;
  for (auto& b : decode_batches())
    for (int window : {0, 128})
      for (bool fp8 : {false, true})
        for (auto plan : {cuda::DecodeAttentionPlan{2, true, true}, cuda::DecodeAttentionPlan{5, false, true}}) {
          if (b.size() > 33) continue;
          AttnRun fused{.path = cuda::AttentionPath::kPerToken, .page_size = 16, .seed = seed};
          fused.cpu_reference = false;  // both meet the CPU in AttentionDecodeFused / AttentionDecodeStored
          fused.fused = true;
          fused.plan = plan;
          AttnRun stored = fused;
          stored.kv_stored = true;
          expect_same_decode(b, window, fp8, Hq, Hkv, fused, stored, decode_case(b, window, fp8, plan));
        }
}

// The tensor-core kernel's two orders of its first loads (the q, k, v row after the ring of K/V
// tiles, as after a kernel that launched it early; the row first, as after cuBLASLt's qkv) give
// the same bits and the same KV pages, fused and stored, every plan shape (full and sliding
// layers, bf16 and fp8 pages in turn); the row-first order against the CPU too.
TEST_F(Kernels, AttentionDecodeRowFirstMatchesRingFirst) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const uint64_t seed = fresh_seed() | 1;
  const std::vector<cuda::DecodeAttentionPlan> plans = {{1, true, true}, {2, true, true}, {1, false, true},
                                                         {5, false, true}};
  const auto batches = decode_batches();
  for (size_t bi = 0; bi < batches.size(); ++bi)
    for (size_t pi = 0; pi < plans.size(); ++pi)
      for (bool stored : {false, true}) {
        const auto& b = batches[bi];
        const auto& plan = plans[pi];
        const size_t c = bi + pi;  // each plan meets every (window, page type) over the batches
        const int window = c % 2 ? 128 : 0;
        const bool fp8 = (c / 2) % 2;
        AttnRun ring{.path = cuda::AttentionPath::kPerToken, .page_size = 16, .seed = seed};
        ring.cpu_reference = false;  // the ring-first order meets the CPU in AttentionDecodeFused / Stored
        ring.fused = true;
        ring.kv_stored = stored;
        ring.plan = plan;
        AttnRun row = ring;
        row.qkv_overlaps = false;
        row.cpu_reference = b.size() <= 7;  // (CPU time)
        expect_same_decode(b, window, fp8, Hq, Hkv, ring, row,
                           decode_case(b, window, fp8, plan) + (stored ? " stored" : " fused"));
      }
}

// The decode plan (host only, runs without a GPU): a cluster of a power-of-two splits up to 8
// within one wave of blocks (528) unless a split would walk more than 8 tiles of 32 keys and the
// backend's split-and-merge count is larger; a plan never depends on the context otherwise (a
// captured graph serves every step until the context crosses that line).
TEST(DecodeAttentionPlan, ClustersWithinAWaveSplitsForLongContexts) {
  for (int Hkv : {1, 4, 8})
    for (int n = 1; n <= 64; ++n) {
      const int split = std::clamp((264 + n * Hkv - 1) / (n * Hkv), 1, 32);  // CudaBackend::splits_for
      const cuda::DecodeAttentionPlan shortp = cuda::decode_attention_plan(n, Hkv, 100, split, 8, false);
      const std::string at = "n=" + std::to_string(n) + " Hkv=" + std::to_string(Hkv);
      ASSERT_TRUE(shortp.cluster) << at;
      EXPECT_EQ(shortp.nsplit & (shortp.nsplit - 1), 0) << at;
      EXPECT_LE(shortp.nsplit, 8) << at;
      EXPECT_TRUE(shortp.nsplit == 1 || n * Hkv * shortp.nsplit <= 528) << at;
      EXPECT_TRUE(shortp.nsplit == 8 || n * Hkv * shortp.nsplit * 2 > 528) << at << ": room for more splits";
      for (int keys : {1, 128, 576, 2048, 4096, 32768, 131072}) {
        const cuda::DecodeAttentionPlan p = cuda::decode_attention_plan(n, Hkv, keys, split, 8, false);
        const int tiles = (keys + 31) / 32;
        if (p.cluster) {
          EXPECT_EQ(p.nsplit, shortp.nsplit) << at << " keys=" << keys;
          EXPECT_TRUE((tiles + p.nsplit - 1) / p.nsplit <= 8 || split <= p.nsplit) << at << " keys=" << keys;
        } else {
          EXPECT_EQ(p.nsplit, split) << at << " keys=" << keys;
          EXPECT_GT(split, shortp.nsplit) << at << " keys=" << keys;
          EXPECT_GT((tiles + shortp.nsplit - 1) / shortp.nsplit, 8) << at << " keys=" << keys;
        }
      }
    }
  // gpt-oss at one sequence: 8 splits in a cluster at short context, 32 through the merge kernel
  // past 2048 keys.
  EXPECT_TRUE(cuda::decode_attention_plan(1, 8, 576, 32, 8, false).cluster);
  EXPECT_EQ(cuda::decode_attention_plan(1, 8, 576, 32, 8, false).nsplit, 8);
  EXPECT_FALSE(cuda::decode_attention_plan(1, 8, 4096, 32, 8, false).cluster);
}

// The tensor-core kernel's plan (host only): always plan.mma; one split up to 3 tiles of 64 keys
// (the sliding layers), on the kernel without the cluster merge; clusters of a power of two, at
// most one split a tile and within a wave; split-and-merge for long contexts or where a cluster
// grid would not fit. The gpt-oss choices
// measured best on the H200.
TEST(DecodeAttentionPlan, TensorCorePlan) {
  auto plan = [](int n, int keys) {
    const int split = std::clamp((264 + n * 8 - 1) / (n * 8), 1, 32);  // CudaBackend::splits_for
    return cuda::decode_attention_plan(n, 8, keys, split);
  };
  for (int n = 1; n <= 64; ++n)
    for (int keys : {1, 64, 128, 192, 256, 512, 2048, 4096, 32768, 131072}) {
      const cuda::DecodeAttentionPlan p = plan(n, keys);
      const std::string at = "n=" + std::to_string(n) + " keys=" + std::to_string(keys);
      EXPECT_TRUE(p.mma) << at;
      EXPECT_GE(p.nsplit, 1) << at;
      EXPECT_LE(p.nsplit, 32) << at;
      if (keys <= 192) { EXPECT_EQ(p.nsplit, 1) << at; }
      if (p.cluster) {
        EXPECT_EQ(p.nsplit & (p.nsplit - 1), 0) << at;
        EXPECT_LE(p.nsplit, 8) << at;
        EXPECT_LE(p.nsplit, (keys + 63) / 64) << at;
        EXPECT_TRUE(n * 8 * p.nsplit <= 396) << at;  // three blocks an SM
        EXPECT_GT(p.nsplit, 1) << at << ": one split takes the kernel without the cluster merge";
      }
    }
  auto same = [](cuda::DecodeAttentionPlan p, int nsplit, bool cluster) {
    return p.nsplit == nsplit && p.cluster == cluster;
  };
  EXPECT_TRUE(same(plan(1, 128), 1, false));   // sliding layer: one split, no cluster
  EXPECT_TRUE(same(plan(1, 512), 8, true));    // a split a tile
  EXPECT_TRUE(same(plan(1, 4096), 32, false)); // long: 32 splits and the merge launch
  EXPECT_TRUE(same(plan(8, 512), 4, true));    // clusters of 8 would not fit a wave whole
  EXPECT_TRUE(same(plan(24, 512), 2, true));
  EXPECT_TRUE(same(plan(32, 512), 2, false));  // a cluster of 2 would not fit a wave: split and merge
  EXPECT_TRUE(same(plan(32, 4096), 2, false));
  EXPECT_TRUE(same(plan(64, 512), 1, false));  // 512 blocks, four an SM: one wave
  EXPECT_TRUE(same(plan(64, 4096), 1, false));
}

// The fused kernel against rope_kv_store + attention with the same splits: the same output bits
// and the same K/V bytes in the pages (both round k and v the same way and share the split
// boundaries, the per-tile arithmetic and the merge code, the cluster merge included). The
// tensor-core kernel stores the same K/V bytes and gives outputs within bf16 output rounding of
// theirs (its P is two bf16 parts, ~16 bits).
TEST_F(Kernels, AttentionDecodeFusedMatchesTwoKernels) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const uint64_t seed = fresh_seed() | 1;
  for (auto& b : decode_batches())
    for (int window : {0, 128})
      for (bool fp8 : {false, true})
        for (auto plan : {cuda::DecodeAttentionPlan{1, true}, cuda::DecodeAttentionPlan{8, true},
                          cuda::DecodeAttentionPlan{16, true}, cuda::DecodeAttentionPlan{5, false},
                          cuda::DecodeAttentionPlan{2, true, true}, cuda::DecodeAttentionPlan{5, false, true}}) {
          std::vector<uint8_t> pool_two, pool_fused;
          AttnRun two{.path = cuda::AttentionPath::kPerToken, .page_size = 16, .seed = seed};
          two.pool_after = &pool_two;
          // Both paths meet the CPU in AttentionPaged and AttentionDecodeFused; here they meet
          // each other (H200: 155 s with the CPU reference, 102 s without).
          two.cpu_reference = false;
          AttnRun fused = two;
          fused.fused = true;
          fused.plan = plan;
          fused.pool_after = &pool_fused;
          auto a = check_attention(b, window, fp8, plan.nsplit, Hq, Hkv, 64, two);
          auto f = check_attention(b, window, fp8, plan.nsplit, Hq, Hkv, 64, fused);
          const std::string at = decode_case(b, window, fp8, plan);
          ASSERT_EQ(a.size(), f.size()) << at;
          if (plan.mma) {  // other sums (tensor cores, P in two bf16 parts): within bf16 output rounding
            const double e = rel_err(f, a);
            std::printf("attention decode mma vs CUDA cores, %s: rel err %.3g\n", at.c_str(), e);
            EXPECT_LE(e, 2e-3) << at << " mma";
          } else {
            EXPECT_EQ(elements_differing(a, f), 0u) << at << ": output elements differing";
          }
          EXPECT_TRUE(pool_two == pool_fused) << at << ": KV pages differ";
        }
}

// The tensor-core flash kernel (AttentionPath::kFlash) against the CPU reference: prompt lengths
// around its 16-token / 64-key tiles, with and without a cached prefix, windows crossing tiles and
// pages, page sizes 16, 32 and 7, bf16 and fp8 KV, several sequences a pass, GQA groups 8, 4, 2, 1.
TEST_F(Kernels, FlashAttentionPrefill) {
  ASSERT_TRUE(cuda::flash_attention_supported(64, 8, 64));
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const int page_sizes[] = {16, 32, 7};
  int k = 0;
  for (int n : {1, 63, 64, 65, 127, 128, 129, 300})
    for (int start : {0, 37, 200})
      for (int window : {0, 128})
        for (bool fp8 : {false, true}) {
          AttnRun run{.path = cuda::AttentionPath::kFlash, .page_size = page_sizes[k++ % 3], .seed = 0};
          check_attention({{start, n}}, window, fp8, 1, Hq, Hkv, 64, run);
        }
  std::vector<std::vector<AttnSeq>> batches = {
      {{0, 65}, {300, 129}, {5, 1}, {0, 16}},  // mixed lengths, one decode token between
      {{2000, 48}, {0, 300}, {130, 17}},       // long prefix, window far behind
      {{0, 1}, {1, 1}, {2, 1}},                // decode-only pass through the flash kernel
  };
  for (auto& b : batches)
    for (int ps : {16, 32, 7})
      for (int window : {0, 128})
        for (bool fp8 : {false, true})
          check_attention(b, window, fp8, 1, Hq, Hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = ps, .seed = 0});
  if (!small_mode())
    for (int window : {0, 128})
      for (bool fp8 : {false, true}) {
        check_attention({{0, 2048}}, window, fp8, 1, Hq, Hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = 16, .seed = 0});
        check_attention({{2048, 300}}, window, fp8, 1, Hq, Hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = 32, .seed = 0});
      }
  // Other GQA groups: 4, 2 and 1 query heads a kv head (16, 32 and 128 tokens a CTA).
  for (auto [hq, hkv] : {std::pair{16, 4}, std::pair{8, 4}, std::pair{4, 4}})
    for (int window : {0, 128}) {
      check_attention({{0, 200}, {50, 70}}, window, false, 1, hq, hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = 16, .seed = 0});
      check_attention({{130, 129}}, window, true, 1, hq, hkv, 64, AttnRun{.path = cuda::AttentionPath::kFlash, .page_size = 7, .seed = 0});
    }
  EXPECT_FALSE(cuda::flash_attention_supported(64, 8, 32));
  EXPECT_FALSE(cuda::flash_attention_supported(48, 8, 64));  // 6 heads a group
}

// kAuto on a pass mixing prefill chunks and decode tokens: the flash kernel takes the 16-token
// blocks of at most two sequences, the per-token kernel (with KV splits) and its merge the others
// (flash_blocks.cuh); every token must come out right, whichever kernel took it.
TEST_F(Kernels, FlashAttentionMixedPass) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  std::vector<AttnSeq> decode_heavy = {{100, 40}};
  for (int i = 0; i < 20; ++i) decode_heavy.push_back({50 + 37 * i, 1});
  decode_heavy.push_back({0, 70});
  // A serving pass's shape: decode tokens first, then prompt chunks (the per-token range at the
  // front); decode tokens between and after prompts (two ranges apart: the per-token launch covers
  // the flash blocks between, which return).
  std::vector<AttnSeq> serve_like;
  for (int i = 0; i < 7; ++i) serve_like.push_back({40 + 11 * i, 1});
  for (int i = 0; i < 3; ++i) serve_like.push_back({0, 100 + 13 * i});
  std::vector<AttnSeq> scattered = {{0, 70}, {9, 1}, {30, 1}, {12, 1}, {0, 90}, {200, 40}, {3, 1}, {77, 1}, {5, 1}};
  const std::vector<std::vector<AttnSeq>> batches = {
      {{0, 65}, {300, 129}, {5, 1}, {0, 16}},  // block 192..207 holds 3 sequences: per-token
      decode_heavy, serve_like, scattered,
      {{0, 65}, {300, 129}, {0, 16}},  // every sequence >= 16 tokens: the flash kernel alone
  };
  for (auto& b : batches) {
    int most = 0, fewest = 1 << 30;
    std::vector<int> seq_tokens;
    for (auto& q : b) {
      most = std::max(most, q.n);
      fewest = std::min(fewest, q.n);
      seq_tokens.push_back(q.n);
    }
    for (int window : {0, 128})
      for (bool fp8 : {false, true})
        for (int nsplit : {1, 5})
          // Without the sequences' token counts (the per-token launch over every token) and with
          // them (over the range attention_per_token_range gives).
          for (bool counts : {false, true})
            check_attention(b, window, fp8, nsplit, Hq, Hkv, 64,
                            AttnRun{.path = cuda::AttentionPath::kAuto, .page_size = 16, .seed = 0,
                                    .info = {int(b.size()), most, fewest, counts ? seq_tokens : std::vector<int>{}}});
  }
}

// The per-token kernel's range against flash_takes_block's rule applied token by token: every
// block of more than kFlashMaxRuns (2) sequences lies inside it, and it starts and ends at such
// blocks.
TEST(AttentionPerTokenRange, CoversTheBlocksTheFlashKernelLeaves) {
  FastRng r(fresh_seed());
  for (int trial = 0; trial < 2000; ++trial) {
    const int tq = trial % 3 == 0 ? 16 : 1 + int(r.next() % 40);
    std::vector<int> seq_tokens;
    std::vector<int> seq_of;  // sequence of each pass row
    const int seqs = 1 + int(r.next() % 12);
    for (int i = 0; i < seqs; ++i) {
      const int kind = int(r.next() % 4);  // decode tokens, short and long chunks, now and then empty
      const int c = kind == 0 ? 1 : kind == 1 ? int(r.next() % 20) : int(r.next() % 200);
      seq_tokens.push_back(c);
      seq_of.insert(seq_of.end(), size_t(c), i);
    }
    const int n = int(seq_of.size());
    const cuda::TokenRange got = cuda::attention_per_token_range(seq_tokens, n, tq);
    int first = n, end = 0;
    for (int t0 = 0; t0 < n; t0 += tq) {
      int runs = 1;
      for (int t = t0 + 1; t < std::min(n, t0 + tq); ++t) runs += seq_of[size_t(t)] != seq_of[size_t(t - 1)];
      if (runs > 2) first = std::min(first, t0), end = std::min(n, t0 + tq);
    }
    if (first >= end) {
      // No such block: nothing for the per-token kernel (or, with empty sequences, a range it
      // covers without need: the kernel's blocks still check).
      EXPECT_LE(got.begin, got.end);
      continue;
    }
    EXPECT_LE(got.begin, first) << "trial " << trial;
    EXPECT_GE(got.end, end) << "trial " << trial;
    // Empty sequences are the only reason to reach further.
    if (std::find(seq_tokens.begin(), seq_tokens.end(), 0) == seq_tokens.end()) {
      EXPECT_EQ(got.begin, first) << "trial " << trial;
      EXPECT_EQ(got.end, end) << "trial " << trial;
    }
  }
  // Unknown counts, or counts that do not add up to n: every token.
  EXPECT_EQ(cuda::attention_per_token_range({}, 50, 16).end, 50);
  EXPECT_EQ(cuda::attention_per_token_range({10, 10}, 50, 16).end, 50);
  EXPECT_EQ(cuda::attention_per_token_range({10, 10}, 50, 16).begin, 0);
  // Sequences of at least a block each: none.
  const cuda::TokenRange none = cuda::attention_per_token_range({16, 40, 16}, 72, 16);
  EXPECT_EQ(none.begin, none.end);
}

// Batch invariance of the flash kernel: a sequence's rows are bit-identical alone and batched
// with other sequences (its KV tiles are the fixed 64-aligned tiles of its own range; tiles a
// row does not see are exact no-ops), for prefill chunks and decode tokens.
TEST_F(Kernels, FlashAttentionBatchInvariant) {
  const int Hq = small_mode() ? 8 : 64, Hkv = small_mode() ? 1 : 8;
  const uint64_t seed = fresh_seed() | 1;
  for (int window : {0, 128})
    for (bool fp8 : {false, true}) {
      AttnRun run{.path = cuda::AttentionPath::kFlash, .page_size = 16, .seed = seed};
      const AttnSeq a{150, 70}, d{300, 1};
      auto alone_a = check_attention({a}, window, fp8, 1, Hq, Hkv, 64, run);
      auto alone_d = check_attention({d}, window, fp8, 1, Hq, Hkv, 64, run);
      // Batched: a behind 5 tokens of another sequence (its tiles shift within the CTAs), d
      // among other decode tokens.
      auto batched = check_attention({{0, 5}, a, {7, 1}, d, {999, 3}}, window, fp8, 1, Hq, Hkv, 64, run);
      const size_t row = size_t(Hq) * 64;
      ASSERT_EQ(batched.size(), (5 + 70 + 1 + 1 + 3) * row);
      for (size_t i = 0; i < alone_a.size(); ++i)
        ASSERT_EQ(alone_a[i], batched[5 * row + i]) << "prefill row element " << i << " window " << window;
      for (size_t i = 0; i < alone_d.size(); ++i)
        ASSERT_EQ(alone_d[i], batched[76 * row + i]) << "decode row element " << i << " window " << window;
    }
}

}  // namespace
}  // namespace gptoss
