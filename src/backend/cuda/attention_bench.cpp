// Attention in `gptoss bench-kernels` (see kernel_bench.h).
// Prefill: the per-token CUDA-core kernel against the tensor-core flash kernel on one prompt
// chunk at a preset's shapes, full and sliding layers, bf16 and fp8 KV. Each case checks itself
// (the flash output against the per-token kernel's, max abs difference printed) and prints
// microseconds and TFLOP/s (FLOPs: 4 Hq D per visible (query, key) pair, QK^T and PV).
// Decode: rope_kv_store + attention (three launches) against attention_decode (RoPE and the K/V
// store folded in) with the same splits and with decode_attention_plan's cluster merge, on CUDA
// cores and on tensor cores.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernel_bench.h"
#include "backend/cuda/kernels.h"
#include "backend/kv_layout.h"
#include "model/config.h"

namespace gptoss::cuda {

namespace {

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t bytes) { GPTOSS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

float bf16_bits_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void bench_prefill_attention(const GptOssConfig& c, int iters) {
  cudaStream_t s;
  GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim, ps = 16;
  const int QKV = (Hq + 2 * Hkv) * D;
  iters = std::max(1, std::min(iters, 20));
  std::printf("\n| attention (prefill) | tokens (start) | layer, KV | kernel | us/launch | TFLOP/s | max abs diff |\n"
              "|---|---|---|---|---|---|---|\n");
  cudaEvent_t a, b;
  GPTOSS_CUDA_CHECK(cudaEventCreate(&a));
  GPTOSS_CUDA_CHECK(cudaEventCreate(&b));
  struct Case {
    int start, n;
  };
  for (Case cs : {Case{0, 2048}, Case{0, 4096}, Case{4096, 4096}}) {
    const int L = cs.start + cs.n, pages = (L + ps - 1) / ps;
    std::vector<int32_t> pos(cs.n), off(cs.n, 0), pt(pages);
    for (int i = 0; i < cs.n; ++i) pos[i] = cs.start + i;
    for (int i = 0; i < pages; ++i) pt[i] = i;
    DevMem dpos(cs.n * 4), doff(cs.n * 4), dpt(pages * 4);
    GPTOSS_CUDA_CHECK(cudaMemcpy(dpos.p, pos.data(), cs.n * 4, cudaMemcpyHostToDevice));
    GPTOSS_CUDA_CHECK(cudaMemcpy(doff.p, off.data(), cs.n * 4, cudaMemcpyHostToDevice));
    GPTOSS_CUDA_CHECK(cudaMemcpy(dpt.p, pt.data(), pages * 4, cudaMemcpyHostToDevice));
    DevMem qkv(size_t(cs.n) * QKV * 2), sinks(Hq * 4), out0(size_t(cs.n) * Hq * D * 2), out1(size_t(cs.n) * Hq * D * 2);
    fill_random_bf16(qkv.as<bf16_t>(), size_t(cs.n) * QKV, 31, 0.f, 1.f, s);
    fill_random_f32(sinks.as<float>(), Hq, 32, 0.f, 1.f, s);
    const size_t page_elems = PagedKvLayout{ps, Hkv, D}.page_elems();
    const int nsplit = 1;
    DevMem part(attention_partial_floats(cs.n, Hq, D, nsplit) * 4);
    TokenMeta tm{dpos.as<int32_t>(), doff.as<int32_t>(), dpt.as<int32_t>()};
    for (bool fp8 : {false, true}) {
      DevMem pool(size_t(pages) * page_elems * (fp8 ? 1 : 2));
      if (fp8)
        fill_random_u8(pool.as<uint8_t>(), size_t(pages) * page_elems, 33, 0, 255, s);
      else
        fill_random_bf16(pool.as<bf16_t>(), size_t(pages) * page_elems, 33, 0.f, 1.f, s);
      if (fp8) {
        // Exponent field 6 (values 0.5 .. 0.94, either sign): no NaN byte, O(1) logits.
        std::vector<uint8_t> h(size_t(pages) * page_elems);
        GPTOSS_CUDA_CHECK(cudaMemcpyAsync(h.data(), pool.p, h.size(), cudaMemcpyDeviceToHost, s));
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
        for (auto& x : h) x = uint8_t((x & 0x87) | 0x30);
        GPTOSS_CUDA_CHECK(cudaMemcpy(pool.p, h.data(), h.size(), cudaMemcpyHostToDevice));
      }
      KvLayer kv{pool.p, fp8, ps};
      for (int window : {0, c.sliding_window}) {
        double flops = 0;
        for (int i = 0; i < cs.n; ++i) {
          const int p = cs.start + i;
          flops += 4.0 * Hq * D * (window > 0 ? std::min(p + 1, window) : p + 1);
        }
        double us[2];
        for (int k = 0; k < 2; ++k) {
          const AttentionPath path = k == 0 ? AttentionPath::kPerToken : AttentionPath::kFlash;
          bf16_t* o = (k == 0 ? out0 : out1).as<bf16_t>();
          auto launch = [&] {
            attention(qkv.as<bf16_t>(), cs.n, Hq, Hkv, D, window, sinks.as<float>(), tm, kv, nsplit,
                      part.as<float>(), o, s, path, AttentionPassInfo{1, cs.n, cs.n, {}});
          };
          for (int i = 0; i < 2; ++i) launch();
          GPTOSS_CUDA_CHECK(cudaEventRecord(a, s));
          for (int i = 0; i < iters; ++i) launch();
          GPTOSS_CUDA_CHECK(cudaEventRecord(b, s));
          GPTOSS_CUDA_CHECK(cudaEventSynchronize(b));
          float ms = 0;
          GPTOSS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
          us[k] = 1000.0 * ms / iters;
        }
        std::vector<uint16_t> h0(size_t(cs.n) * Hq * D), h1(h0.size());
        GPTOSS_CUDA_CHECK(cudaMemcpy(h0.data(), out0.p, h0.size() * 2, cudaMemcpyDeviceToHost));
        GPTOSS_CUDA_CHECK(cudaMemcpy(h1.data(), out1.p, h1.size() * 2, cudaMemcpyDeviceToHost));
        double diff = 0;
        for (size_t i = 0; i < h0.size(); ++i) {
          const double d = std::fabs(double(bf16_bits_to_float(h0[i])) - bf16_bits_to_float(h1[i]));
          diff = std::isnan(d) ? INFINITY : std::max(diff, d);
        }
        const std::string toks = std::to_string(cs.n) + " (" + std::to_string(cs.start) + ")";
        const char* layer = window > 0 ? (fp8 ? "sliding, fp8" : "sliding, bf16") : (fp8 ? "full, fp8" : "full, bf16");
        for (int k = 0; k < 2; ++k)
          std::printf("| attention | %s | %s | %s | %.1f | %.1f | %s |\n", toks.c_str(), layer,
                      k == 0 ? "per-token (CUDA cores)" : "flash (mma.sync)", us[k], flops / us[k] / 1e6,
                      k == 0 ? "" : std::to_string(diff).c_str());
        std::fflush(stdout);
      }
    }
  }
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
}

void bench_decode_attention(const GptOssConfig& c, int tokens, int iters) {
  cudaStream_t s;
  GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim, ps = 16;
  const int QKV = (Hq + 2 * Hkv) * D;
  const int n = std::max(1, tokens);
  iters = std::max(1, iters);
  const YarnTables yarn = compute_yarn(c);
  DevMem inv(yarn.inv_freq.size() * 4);
  GPTOSS_CUDA_CHECK(cudaMemcpy(inv.p, yarn.inv_freq.data(), yarn.inv_freq.size() * 4, cudaMemcpyHostToDevice));
  std::printf("\n| attention (decode) | sequences x context | layer, KV | kernels | us/step | differs from 3 launches |\n"
              "|---|---|---|---|---|---|\n");
  cudaEvent_t a, b;
  GPTOSS_CUDA_CHECK(cudaEventCreate(&a));
  GPTOSS_CUDA_CHECK(cudaEventCreate(&b));
  // The backend's split count for n tokens (CudaBackend::splits_for).
  const int split_nsplit = std::clamp((264 + n * Hkv - 1) / (n * Hkv), 1, 32);
  for (int L : {512, 4096, 32768}) {
    if (size_t(n) * L > (size_t(1) << 18)) continue;  // pages of every sequence: bounded memory
    const int pages_per = (L + ps - 1) / ps, pages = n * pages_per;
    std::vector<int32_t> pos(n, L - 1), off(n), pt(pages);
    for (int i = 0; i < n; ++i) off[i] = i * pages_per;
    for (int i = 0; i < pages; ++i) pt[i] = (i * 7919) % pages;  // scattered pages
    DevMem dpos(n * 4), doff(n * 4), dpt(size_t(pages) * 4);
    GPTOSS_CUDA_CHECK(cudaMemcpy(dpos.p, pos.data(), n * 4, cudaMemcpyHostToDevice));
    GPTOSS_CUDA_CHECK(cudaMemcpy(doff.p, off.data(), n * 4, cudaMemcpyHostToDevice));
    GPTOSS_CUDA_CHECK(cudaMemcpy(dpt.p, pt.data(), size_t(pages) * 4, cudaMemcpyHostToDevice));
    TokenMeta tm{dpos.as<int32_t>(), doff.as<int32_t>(), dpt.as<int32_t>()};
    DevMem qkv0(size_t(n) * QKV * 2), qkv(size_t(n) * QKV * 2), sinks(Hq * 4);
    DevMem out0(size_t(n) * Hq * D * 2), out1(size_t(n) * Hq * D * 2);
    fill_random_bf16(qkv0.as<bf16_t>(), size_t(n) * QKV, 41, 0.f, 1.f, s);
    fill_random_f32(sinks.as<float>(), Hq, 42, 0.f, 1.f, s);
    DevMem part(attention_partial_floats(n, Hq, D, 32) * 4);
    const size_t page_elems = PagedKvLayout{ps, Hkv, D}.page_elems();
    for (bool fp8 : {false, true}) {
      DevMem pool(size_t(pages) * page_elems * (fp8 ? 1 : 2));
      if (fp8)  // e4m3 0x30..0x37: 0.5 .. 0.94, no NaN byte
        fill_random_u8(pool.as<uint8_t>(), size_t(pages) * page_elems, 43, 0x30, 0x37, s);
      else
        fill_random_bf16(pool.as<bf16_t>(), size_t(pages) * page_elems, 43, 0.f, 1.f, s);
      const KvLayer kv{pool.p, fp8, ps};
      for (int window : {0, c.sliding_window}) {
        const int keys = window > 0 ? std::min(L, window) : L;
        // Variant 0: rope_kv_store + attention + merge; then attention_decode with the same
        // splits and merge launch, and with clusters of 1, 2, 4 and 8 splits (the plan's marked).
        std::vector<DecodeAttentionPlan> plans = {DecodeAttentionPlan{split_nsplit, false},
                                                  DecodeAttentionPlan{split_nsplit, false}};
        for (int cs = 1; cs <= kDecodeClusterMax; cs *= 2) plans.push_back(DecodeAttentionPlan{cs, true});
        // The same on tensor cores (attention_decode_mma.cu).
        plans.push_back(DecodeAttentionPlan{split_nsplit, false, true});
        for (int cs = 1; cs <= kDecodeClusterMax; cs *= 2) plans.push_back(DecodeAttentionPlan{cs, true, true});
        const DecodeAttentionPlan chosen = decode_attention_plan(n, Hkv, keys, split_nsplit);
        if (std::find(plans.begin() + 1, plans.end(), chosen) == plans.end()) plans.push_back(chosen);
        // rope_kv_store rotates qkv in place: the outputs compared start from the unrotated copy;
        // timed launches rotate over and over with the YaRN scaling at 1 (values stay bounded).
        auto launch = [&](size_t k, bf16_t* o, float scaling) {
          if (k == 0) {
            rope_kv_store(qkv.as<bf16_t>(), n, Hq, Hkv, D, inv.as<float>(), scaling, tm, kv, s);
            attention(qkv.as<bf16_t>(), n, Hq, Hkv, D, window, sinks.as<float>(), tm, kv, split_nsplit,
                      part.as<float>(), o, s, AttentionPath::kPerToken);
          } else {
            attention_decode(qkv.as<bf16_t>(), n, Hq, Hkv, D, window, sinks.as<float>(), inv.as<float>(), scaling,
                             tm, kv, plans[k], part.as<float>(), o, s);
          }
        };
        auto restore = [&] {
          GPTOSS_CUDA_CHECK(cudaMemcpyAsync(qkv.p, qkv0.p, size_t(n) * QKV * 2, cudaMemcpyDeviceToDevice, s));
        };
        auto time = [&](size_t k) {
          for (int i = 0; i < 3; ++i) launch(k, out1.as<bf16_t>(), 1.f);
          GPTOSS_CUDA_CHECK(cudaEventRecord(a, s));
          for (int i = 0; i < iters; ++i) launch(k, out1.as<bf16_t>(), 1.f);
          GPTOSS_CUDA_CHECK(cudaEventRecord(b, s));
          GPTOSS_CUDA_CHECK(cudaEventSynchronize(b));
          float ms = 0;
          GPTOSS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
          return 1000.0 * ms / iters;
        };
        restore();
        launch(0, out0.as<bf16_t>(), yarn.attention_scaling);
        std::vector<uint16_t> h0(size_t(n) * Hq * D), h1(h0.size());
        GPTOSS_CUDA_CHECK(cudaMemcpyAsync(h0.data(), out0.p, h0.size() * 2, cudaMemcpyDeviceToHost, s));
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
        const std::string shape = std::to_string(n) + " x " + std::to_string(L);
        const char* layer = window > 0 ? (fp8 ? "sliding, fp8" : "sliding, bf16") : (fp8 ? "full, fp8" : "full, bf16");
        for (size_t k = 0; k < plans.size(); ++k) {
          const double us = time(k);
          restore();
          launch(k, out1.as<bf16_t>(), yarn.attention_scaling);
          GPTOSS_CUDA_CHECK(cudaMemcpyAsync(h1.data(), out1.p, h1.size() * 2, cudaMemcpyDeviceToHost, s));
          GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
          double diff = 0;
          for (size_t i = 0; i < h0.size(); ++i) {
            const double d = std::fabs(double(bf16_bits_to_float(h0[i])) - bf16_bits_to_float(h1[i]));
            diff = std::isnan(d) ? INFINITY : std::max(diff, d);
          }
          const DecodeAttentionPlan& p = plans[k];
          std::string kern = k == 0 ? "rope_kv + attention + merge, " + std::to_string(p.nsplit) + " splits"
                                    : std::string(p.mma ? "fused mma, " : "fused, ") + std::to_string(p.nsplit) +
                                          (p.cluster ? " splits in a cluster" : " splits + merge");
          if (k > 0 && p == chosen) kern += " (plan)";
          std::printf("| attention | %s | %s | %s | %.2f | %g |\n", shape.c_str(), layer, kern.c_str(), us, diff);
          std::fflush(stdout);
        }
      }
    }
  }
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
}

}  // namespace gptoss::cuda
