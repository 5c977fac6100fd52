// See kernel_bench.h.
#include "backend/cuda/kernel_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "common/error.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels/linear/lm_head_screen.h"
#include "backend/cuda/kernels/misc/sm_blocker.h"
#include "backend/cuda/kernels/moe/expert_gemm_v5.h"
#include "backend/parallel/tp_shard.h"
#include "model/config.h"

namespace gptoss::cuda {

namespace {

constexpr size_t kRotateBytes = size_t(256) << 20;  // well above the H200's 50 MB L2

struct Timer {
  cudaStream_t s;
  cudaEvent_t a, b;
  int held_sms = 0;  // --sm-limit: SMs an SmBlocker holds during each timing
  explicit Timer(cudaStream_t st) : s(st) {
    GPTOSS_CUDA_CHECK(cudaEventCreate(&a));
    GPTOSS_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  // Mean microseconds per call of f(i) over iters calls, after a warm-up of 10.
  double us(int iters, const std::function<void(int)>& f) {
    SmBlocker hold(held_sms);
    for (int i = 0; i < 10; ++i) f(i);
    GPTOSS_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < iters; ++i) f(i);
    GPTOSS_CUDA_CHECK(cudaEventRecord(b, s));
    GPTOSS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    GPTOSS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return 1000.0 * ms / iters;
  }
};

template <typename T>
T* dev_alloc(size_t n, std::vector<void*>& owned) {
  void* p = nullptr;
  GPTOSS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T) + 16));
  GPTOSS_CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T) + 16));
  owned.push_back(p);
  return static_cast<T*>(p);
}

}  // namespace

// Greedy ids over lm_head at 1-8 rows: the bf16 decode copy's full launch and argmax_rows, against
// the int8 screen (kernels/linear/lm_head_screen.h: the int8 bytes, then the candidates' 32-row
// tile pairs again in bf16). GB/s counts the int8 bytes only for the screen; the line after the
// rows gives the pairs it recomputed a step (random weights, N(0, 1) rows).
template <class Row>
void bench_lm_head_screen(const std::vector<WeightMat>& ws, const std::vector<WeightMat>& ps, const bf16_t* xb, int M,
                          float* out, Timer& timer, cudaStream_t s, int iters, Row&& row) {
  // (Called with the skinny family chosen: the screen serves only that family's copies.)
  if (!lm_head_screen_takes(ps[0], M, false)) return;
  const int N = ps[0].N, K = ps[0].K, copies = int(ps.size());
  DeviceBuffer ids(8 * sizeof(int32_t));
  std::vector<std::unique_ptr<LmHeadScreen>> scs;
  for (const WeightMat& W : ws) {
    scs.push_back(std::make_unique<LmHeadScreen>());
    scs.back()->build(W, s);
  }
  const std::string shape = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
  const double bytes = double(N) * K * 2;
  const double full = timer.us(iters, [&](int i) {
    linear(ps[i % copies], xb, K, M, Epilogue{Epilogue::kStoreF32, out, N}, s);
    argmax_rows(out, M, N, ids.get<int32_t>(), s);
  });
  row("lm_head greedy", shape, "skinny_mma bf16 + argmax_rows", full, bytes);
  const int pf0 = lm_head_screen_pf();
  for (int pf : {2, 1, 3, 4}) {  // the default first (its line below counts all)
    set_lm_head_screen_pf(pf);
    const double scr = timer.us(iters, [&](int i) {
      scs[i % copies]->argmax(ps[i % copies], xb, K, M, out, N, ids.get<int32_t>(), false, s);
    });
    row("lm_head greedy", shape, (std::string("int8 screen + candidates in bf16, pf ") + std::to_string(pf)).c_str(),
        scr, bytes / 2);
  }
  set_lm_head_screen_pf(pf0);
  long long pairs = 0, steps = 0;
  for (const auto& sc : scs) {
    const LmHeadScreen::Stats st = sc->stats(s);
    pairs += st.pairs;
    steps += st.steps;
  }
  std::printf("(lm_head screen at %d rows: %.1f of %d tile pairs recomputed a step)\n", M,
              steps ? double(pairs) / steps : 0.0, N / 32);
}

int run_kernel_bench(const KernelBenchOptions& o) {
  if (!cuda_device_available()) throw Error("bench-kernels: no CUDA device is available");
  GptOssConfig c = GptOssConfig::preset(o.model);
  if (o.tp > 1) {  // one rank's shard (Megatron style, experts split on the intermediate dimension)
    if (o.tp_rank < 0 || o.tp_rank >= o.tp) throw Error("bench-kernels: --tp-rank must be in [0, --tp)");
    const TpShard sh{o.tp_rank, o.tp, ExpertSharding::kIntermediate};
    const GptOssConfig full = c;
    c.num_heads = sh.q_heads(full).size();
    c.num_kv_heads = sh.kv_heads(full).size();
    c.intermediate = sh.intermediate(full).size();
    c.vocab = sh.vocab(full).size();
    std::printf("rank %d of %d: %d q heads, %d kv heads, intermediate %d, vocab %d\n", o.tp_rank, o.tp, c.num_heads,
                c.num_kv_heads, c.intermediate, c.vocab);
  }
  if (o.attention_only) {
    bench_decode_attention(c, o.tokens, o.iters);
    bench_prefill_attention(c, o.iters);
    return 0;
  }
  const int H = c.hidden, E = c.num_experts, I = c.intermediate, k = c.experts_per_token;
  const int QKV = c.q_dim() + 2 * c.kv_dim(), M = o.tokens;
  std::vector<void*> owned;
  cudaStream_t s;
  GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Timer timer(s);
  if (o.sm_limit > 0) {
    const int all = sm_count_all();
    if (o.sm_limit >= all) throw Error("bench-kernels: --sm-limit must be under the GPU's " + std::to_string(all) + " SMs");
    set_sm_count_limit(o.sm_limit);
    timer.held_sms = all - o.sm_limit;
    std::printf("(--sm-limit %d: %d of %d SMs held idle during each timing; grids sized to %d SMs)\n", o.sm_limit,
                all - o.sm_limit, all, o.sm_limit);
  }
  std::mt19937 rng(1);
  auto fill = [&](void* p, size_t bytes) {
    fill_random_u8(static_cast<uint8_t*>(p), bytes, rng(), 0, 255, s);
  };
  auto* x = dev_alloc<float>(size_t(M) * 4096, owned);
  auto* xb = dev_alloc<bf16_t>(size_t(M) * 4096, owned);
  fill_random_f32(x, size_t(M) * 4096, 7, 0.f, 1.f, s);
  fill_random_bf16(xb, size_t(M) * 4096, 8, 0.f, 1.f, s);
  auto* normw = dev_alloc<float>(4096, owned);
  fill_random_f32(normw, 4096, 9, 1.f, 0.1f, s);
  auto* out = dev_alloc<float>(size_t(M) * 201088, owned);
  auto* xn = dev_alloc<bf16_t>(size_t(M) * 4096, owned);

  std::printf("| kernel | shape | variant | us/launch | GB/s (weights) |\n|---|---|---|---|---|\n");
  // (Expert rows count each (token, expert) pair's weights, so past one token per expert the GB/s
  // column overstates the bytes actually read.)
  auto row = [&](const char* name, const std::string& shape, const char* variant, double us, double bytes) {
    std::printf("| %s | %s | %s | %.2f | %.0f |\n", name, shape.c_str(), variant, us, bytes / us / 1e3);
    std::fflush(stdout);
  };

  // Dense bf16 GEMVs: weights rotated over copies.
  // decode_copy: the name of the skinny rows, which time the model's decode copy (qkv's runs on rows
  // the previous layer's combine already normalized); null: the layer has none (the router).
  struct Dense {
    const char* name;
    int N, K;
    bool norm;
    const char* decode_copy;
  };
  // --sm-limit times the expert rows only: cuBLASLt's kernels and the cluster kernels of the other
  // rows may size their grids by the whole GPU and wait on blocks that never start.
  const bool experts_only = o.sm_limit > 0;
  for (const Dense& d : {Dense{"qkv (+rmsnorm)", QKV, H, true, "qkv (rows normalized before)"},
                         Dense{"o_proj", H, c.q_dim(), false, "o_proj"}, Dense{"router (+rmsnorm)", E, H, true, nullptr},
                         Dense{"lm_head", c.vocab, H, false, "lm_head"}}) {
    if (experts_only) break;
    const size_t bytes = size_t(d.N) * d.K * 2;
    const int copies = int(std::max<size_t>(1, (kRotateBytes + bytes - 1) / bytes));
    std::vector<WeightMat> ws;
    for (int i = 0; i < copies; ++i) {
      auto* w = dev_alloc<bf16_t>(size_t(d.N) * d.K, owned);
      fill_random_bf16(w, size_t(d.N) * d.K, 100 + i, 0.f, 0.02f, s);
      auto* b = dev_alloc<float>(d.N, owned);
      ws.push_back(WeightMat{WeightMat::kBF16, w, nullptr, b, d.N, d.K});
    }
    std::string shape = std::to_string(M) + "x" + std::to_string(d.N) + "x" + std::to_string(d.K);
    // Variants: the first decode GEMV (row pairs), the default choice, and for batches past the
    // GEMV range the GEMV forced (path 1) against the default mma GEMM.
    for (int v : {1, 0, 2}) {
      if (v == 2 && M <= 8) continue;
      set_gemv_variant(v == 1 ? 1 : 0);
      set_linear_path(v == 2 ? 1 : 0);
      double us = timer.us(o.iters, [&](int i) {
        const WeightMat& W = ws[i % copies];
        if (d.norm)
          linear_rmsnorm(W, x, normw, 1e-5f, M, xn, true, Epilogue{Epilogue::kStoreF32, out, d.N}, s);
        else
          linear(W, xb, d.K, M, Epilogue{Epilogue::kStoreF32, out, d.N}, s);
      });
      row(d.name, shape, v == 1 ? "row pairs" : v == 2 ? "GEMV forced" : "default", us, double(bytes));
    }
    set_gemv_variant(0);
    set_linear_path(0);
    // The tensor-core decode kernels over the fragment layout (bf16 and fp8 decode copies, and
    // the layer in MXFP4 as `--mxfp4-layers` holds it: random codes, values do not change speed).
    if (M <= kSkinnyMaxTokens && d.decode_copy && frag_packable(ws[0])) {
      const char* sname = d.decode_copy;
      for (auto fmt : {WeightMat::kFragBF16, WeightMat::kFragFP8, WeightMat::kFragMXFP4}) {
        std::vector<WeightMat> ps;
        auto* flag = dev_alloc<int>(1, owned);
        if (fmt == WeightMat::kFragMXFP4) {
          // Its own copies (a quarter of bf16's bytes, so more of them to outrun L2); the model's
          // kernel choice only.
          const size_t mx_bytes = size_t(d.N) * d.K / 2;
          const int mx_copies = int(std::max<size_t>(1, (kRotateBytes + mx_bytes - 1) / mx_bytes));
          for (int i = 0; i < mx_copies; ++i) {
            auto* codes = dev_alloc<uint8_t>(mx_bytes, owned);
            auto* scales = dev_alloc<uint8_t>(mx_bytes / 16, owned);
            fill_random_u8(codes, mx_bytes, 300 + i, 0, 255, s);
            fill_random_u8(scales, mx_bytes / 16, 400 + i, 118, 121, s);
            const WeightMat W{WeightMat::kMXFP4, codes, scales, ws[0].bias, d.N, d.K};
            ps.push_back(pack_frag(W, 1, false, fmt, dev_alloc<uint8_t>(mx_bytes, owned),
                                   dev_alloc<uint8_t>(mx_bytes / 16, owned), flag, s));
          }
          double us = timer.us(o.iters, [&](int i) {
            linear(ps[i % mx_copies], xb, d.K, M, Epilogue{Epilogue::kStoreF32, out, d.N}, s);
          });
          row(sname, shape, "default mxfp4 (--mxfp4-layers)", us, double(mx_bytes) * 17 / 16);
          continue;
        }
        for (const WeightMat& W : ws)
          ps.push_back(pack_frag(W, 1, false, fmt, dev_alloc<uint8_t>(frag_weight_bytes(fmt, 1, d.N, d.K), owned),
                                 dev_alloc<float>(d.N, owned), flag, s));
        // The decode kernel families: block-per-tile skinny, then (<= 8 tokens) stream-K's shapes.
        const char* fname = fmt == WeightMat::kFragBF16 ? "bf16" : "fp8";
        set_decode_kernel_choice(1);
        double us = timer.us(o.iters, [&](int i) {
          linear(ps[i % copies], xb, d.K, M, Epilogue{Epilogue::kStoreF32, out, d.N}, s);
        });
        row(sname, shape, (std::string("skinny_mma ") + fname).c_str(), us, double(frag_weight_bytes(fmt, 1, d.N, d.K)));
        if (fmt == WeightMat::kFragBF16 && std::string(d.name) == "lm_head") bench_lm_head_screen(ws, ps, xb, M, out, timer, s, o.iters, row);
        set_decode_kernel_choice(0);  // stream-K for its shapes below
        if (M <= 8)
          for (int v = 0; v < kStreamKVariants; ++v) {
            set_streamk_variant(v);
            double uv = timer.us(o.iters, [&](int i) {
              linear(ps[i % copies], xb, d.K, M, Epilogue{Epilogue::kStoreF32, out, d.N}, s);
            });
            row(sname, shape, (std::string("streamk ") + fname + " " + streamk_variant_name(fmt, v)).c_str(), uv,
                double(frag_weight_bytes(fmt, 1, d.N, d.K)));
          }
        set_streamk_variant(0);
        set_decode_kernel_choice(-1);  // back to GPTOSS_DECODE_KERNEL's choice
        if (M <= 8) {
          // Other shapes of the one-n-tile kernel (warps splitting K, row tiles, chunks in flight).
          static const char* bf16_names[] = {"", "ks16 rt1 pf1", "ks16 rt1 pf2", "ks8 rt1 pf2", "ks16 rt2 pf1"};
          static const char* fp8_names[] = {"", "ks8 rt1 pf4", "ks8 rt1 pf3", "ks16 rt1 pf2", "ks16 rt2 pf1"};
          const char* const* names = fmt == WeightMat::kFragBF16 ? bf16_names : fp8_names;
          set_decode_kernel_choice(1);
          for (int v = 1; v <= 4; ++v) {
            set_skinny_variant(v);
            double uv = timer.us(o.iters, [&](int i) {
              linear(ps[i % copies], xb, d.K, M, Epilogue{Epilogue::kStoreF32, out, d.N}, s);
            });
            row(sname, shape, (std::string("skinny_mma ") + fname + " " + names[v]).c_str(), uv,
                double(frag_weight_bytes(fmt, 1, d.N, d.K)));
          }
          set_skinny_variant(0);
          set_decode_kernel_choice(-1);  // back to GPTOSS_DECODE_KERNEL's choice
        }
      }
    }
  }

  // MoE expert GEMVs (MXFP4): one layer's experts, a different routing every launch.
  {
    const size_t gu_bytes = size_t(E) * 2 * I * H / 2, dn_bytes = size_t(E) * H * I / 2;
    auto* gub = dev_alloc<uint8_t>(gu_bytes, owned);
    auto* gus = dev_alloc<uint8_t>(gu_bytes / 16, owned);
    auto* dnb = dev_alloc<uint8_t>(dn_bytes, owned);
    auto* dns = dev_alloc<uint8_t>(dn_bytes / 16, owned);
    fill(gub, gu_bytes);
    fill(dnb, dn_bytes);
    fill_random_u8(gus, gu_bytes / 16, 11, 118, 121, s);
    fill_random_u8(dns, dn_bytes / 16, 12, 118, 121, s);
    auto* gubias = dev_alloc<float>(size_t(E) * 2 * I, owned);
    auto* dnbias = dev_alloc<float>(size_t(E) * H, owned);
    WeightMat gu{WeightMat::kMXFP4, gub, gus, gubias, 2 * I, H};
    WeightMat dn{WeightMat::kMXFP4, dnb, dns, dnbias, H, I};
    const int R = 32, P = M * k;
    std::vector<MoeRouting> routes;
    auto* logits = dev_alloc<float>(size_t(M) * E, owned);
    for (int r = 0; r < R; ++r) {
      MoeRouting rt = moe_routing_carve(dev_alloc<uint8_t>(moe_routing_bytes(P, E), owned), P, E);
      fill_random_f32(logits, size_t(M) * E, 500 + r, 0.f, 1.f, s);
      moe_route(logits, M, E, k, rt, s);
      routes.push_back(rt);
    }
    // down runs two launches after the routing in the model (gate_up between), so it may read it
    // before its wait (MoeRouting::settled); timed the same way here.
    std::vector<MoeRouting> down_routes = routes;
    for (MoeRouting& rt : down_routes) rt.settled = true;
    auto* act = dev_alloc<bf16_t>(size_t(P) * I, owned);
    Epilogue g{Epilogue::kSwiGLU, act, I};
    g.swiglu_limit = c.swiglu_limit;
    std::string shape = std::to_string(M) + " tok x top-" + std::to_string(k) + " of " + std::to_string(E);
    double us = 0;
    for (int v : {0, 1}) {
      if (v == 1 && (P <= 32 || experts_only)) continue;  // (2-13 ms a launch at 64 tokens)
      set_linear_path(v == 1 ? 1 : 0);
      const char* vn = v == 1 ? "GEMV forced" : "default";
      us = timer.us(o.iters, [&](int i) { linear_grouped(gu, xb, H, P, E, true, routes[i % R], g, s); });
      row("experts gate_up (mxfp4)", shape + ", " + std::to_string(2 * I) + "x" + std::to_string(H), vn, us,
          double(P) * 2 * I * H * 17 / 32);
      us = timer.us(o.iters, [&](int i) {
        linear_grouped(dn, act, I, P, E, false, down_routes[i % R], Epilogue{Epilogue::kScatterAdd, out, H}, s);
      });
      row("experts down (mxfp4)", shape + ", " + std::to_string(H) + "x" + std::to_string(I), vn, us,
          double(P) * H * I * 17 / 32);
    }
    set_linear_path(0);
    // Prefill: the grouped expert GEMM, version 1 (gemm_kernel) against version 2 (tall tiles,
    // 4-stage pipeline, weights decoded into the MMA registers) and, on Hopper, version 3 (wgmma,
    // weights decoded into shared memory) with 64-row and with 128-row tiles (its automatic
    // choice here is named in the row), on the checkpoint layout and on
    // the fragment layout; gate_up with the SwiGLU epilogue and down storing f32 rows as the
    // backend runs them. TFLOP/s count 2 * pairs * N * K.
    auto* y2 = M > kSkinnyMaxTokens ? dev_alloc<float>(size_t(P) * H, owned) : nullptr;
    auto prefill_versions = [&](const WeightMat& gw, const WeightMat& dw, const char* layout) {
      if (M <= kSkinnyMaxTokens) return;
      set_linear_path(2);
      const int auto_rows = expert_gemm_v3_auto_tile_rows(P, E);
      // v1, v2, v3 with 64- and 128-row tiles, v5 with 32- to 128-pair tiles, and v5 with the
      // activations handed over in the fragment K order (kperm: gate_up's input permuted by
      // permute_rows_frag_k, timed with it; its SwiGLU output stored permuted for down).
      static const struct {
        int version, tile_rows;
        bool kperm;
      } configs[] = {{1, 0, false}, {2, 0, false}, {3, 64, false}, {3, 128, false},
                     {5, 32, false}, {5, 48, false}, {5, 64, false}, {5, 80, false}, {5, 96, false},
                     {5, 128, false}, {5, 32, true}, {5, 48, true}, {5, 64, true}, {5, 80, true},
                     {5, 96, true}, {5, 128, true}, {5, 0, true}};  // (v5 0: the automatic tiling, split or not)
      bf16_t* xperm = nullptr;
      // GPTOSS_BENCH_V5_KPERM_ONLY=1: only the rows the model runs (v5, k-permuted), for sweeps.
      const bool v5_only = env_int("GPTOSS_BENCH_V5_KPERM_ONLY", 0) != 0;
      for (const auto [version, tile_rows, kperm] : configs) {
        if (v5_only && (version != 5 || !kperm)) continue;
        if (version >= 3 && !expert_gemm_v3_available()) continue;  // Hopper wgmma only
        if (version == 5 && gw.fmt != WeightMat::kFragMXFP4) continue;  // fragment layout only
        if (kperm && !xperm) xperm = dev_alloc<bf16_t>(size_t(M) * H, owned);
        set_expert_gemm_version(version);
        if (version == 5)
          set_expert_gemm_v5_tile_pairs(tile_rows);
        else if (tile_rows)
          set_expert_gemm_v3_tile_rows(tile_rows);
        Epilogue gk = g;
        gk.k_permuted = kperm;
        const double us_gu = timer.us(o.iters, [&](int i) {
          if (kperm) permute_rows_frag_k(xb, M, H, xperm, s);
          linear_grouped(gw, kperm ? xperm : xb, H, P, E, true, routes[i % R], gk, s, M, false, false, kperm);
        });
        const double us_dn = timer.us(o.iters, [&](int i) {
          linear_grouped(dw, act, I, P, E, false, down_routes[i % R], Epilogue{Epilogue::kStoreF32, y2, H}, s, M, false,
                         false, kperm);
        });
        const double tf_gu = 2.0 * P * 2 * I * H / us_gu / 1e6, tf_dn = 2.0 * P * H * I / us_dn / 1e6;
        std::string v = "expert GEMM v" + std::to_string(version);
        if (version == 5) {  // (tile_rows 0: the automatic tiling, split or not, as the model runs it)
          const V5Tiling t = tile_rows ? V5Tiling{tile_rows, 0} : expert_gemm_v5_tiling(P, E);
          const char* how = tile_rows == 0 ? " (auto tiling)"
                            : tile_rows == expert_gemm_v5_auto_tile_pairs(P, E) ? " (auto)" : "";
          const int ws = expert_gemm_v5_warp_specialized();
          const char* hand_off = !expert_gemm_v5_uses_mbarriers(t.bulk, P, kperm) ? ""
                                 : ws == 1                                          ? " ws-tma"
                                 : ws == 2                                          ? " ws-cpasync"
                                                                                    : " mbar";
          v += " n" + std::to_string(t.bulk) + (t.rem ? "+" + std::to_string(t.rem) : "") + (kperm ? " kperm" : "") +
               how + " wg" + std::to_string(expert_gemm_v5_chosen_warpgroups(t.bulk, P)) + hand_off;
        } else if (tile_rows) {
          v += " m" + std::to_string(tile_rows) + (tile_rows == auto_rows ? " (auto)" : "");
        }
        v += std::string(" ") + layout;
        const std::string vg = v + ", " + std::to_string(int(tf_gu)) + " TFLOP/s";
        const std::string vd = v + ", " + std::to_string(int(tf_dn)) + " TFLOP/s";
        row("experts gate_up (mxfp4, swiglu)", shape + ", " + std::to_string(2 * I) + "x" + std::to_string(H),
            vg.c_str(), us_gu, double(P) * 2 * I * H * 17 / 32);
        row("experts down (mxfp4, f32 rows)", shape + ", " + std::to_string(H) + "x" + std::to_string(I), vd.c_str(),
            us_dn, double(P) * H * I * 17 / 32);
        std::printf("| experts gate_up + down | %s | %s | %.2f | |\n", shape.c_str(), v.c_str(), us_gu + us_dn);
      }
      set_expert_gemm_version(0);  // back to GPTOSS_EXPERT_GEMM's choice
      set_expert_gemm_v3_tile_rows(-1);  // and GPTOSS_EXPERT_GEMM_TILE_M's
      set_expert_gemm_v5_tile_pairs(-1);  // and GPTOSS_EXPERT_GEMM_V5_N's
      set_linear_path(0);
    };
    prefill_versions(gu, dn, "checkpoint");
    {
      // Fragment layout (--mxfp4-backend mma, the default): skinny kernels up to 64 tokens,
      // the GEMM on the same layout past them; expert outputs summed by moe_combine.
      auto* flag = dev_alloc<int>(1, owned);
      WeightMat pgu = pack_frag(gu, E, true, WeightMat::kFragMXFP4, dev_alloc<uint8_t>(gu_bytes, owned),
                                dev_alloc<uint8_t>(gu_bytes / 16, owned), flag, s);
      WeightMat pdn = pack_frag(dn, E, false, WeightMat::kFragMXFP4, dev_alloc<uint8_t>(dn_bytes, owned),
                                dev_alloc<uint8_t>(dn_bytes / 16, owned), flag, s);
      prefill_versions(pgu, pdn, "fragments");
      LinearProblem kp{pgu.fmt, P, M, pgu.N, pgu.K, true, 0};
      kp.decode_kernel = decode_kernel_choice();  // the family the model runs (GPTOSS_DECODE_KERNEL)
      const LinearKernel kk = choose_linear_kernel(kp);
      const bool sk = is_skinny_family(kk);
      Epilogue gf = g;
      gf.out_f16 = sk;
      auto* y = dev_alloc<float>(size_t(P) * H, owned);
      std::string vn = std::string(linear_kernel_name(kk)) + " (fragments)";
      // Distinct experts a batch touches (the bytes actually read), averaged over the routings.
      double touched = 0;
      for (int r = 0; r < R; ++r) {
        int ng = 0;
        GPTOSS_CUDA_CHECK(cudaMemcpyAsync(&ng, routes[r].counts, 4, cudaMemcpyDeviceToHost, s));
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
        touched += ng;
      }
      touched /= R;
      double us_st = timer.us(o.iters, [&](int i) {
        stream_experts(pgu, P, E, routes[i % R], reinterpret_cast<uint32_t*>(y), s);
      });
      row("experts gate_up bytes, plain read", shape, "stream (memory floor)", us_st, touched * 2 * I * H * 17 / 32);
      // stream_experts_units' modes (kernels.h); the inline layouts read a buffer of their size
      // (chunks rounded up to whole groups of four: 2176 bytes a group).
      auto* inl = dev_alloc<uint8_t>((size_t(E) * (2 * I / 16) * (H / 64) + 3) / 4 * 2176, owned);
      const char* mode_names[] = {"units pattern, weights", "units pattern, weights + scales",
                                  "units pattern, weights + scales inline (544-byte chunks)",
                                  "units pattern, weights + scales inline (aligned groups of 4 chunks)",
                                  "units pattern, weights + scales in 128-byte requests",
                                  "warp-walk pattern, weights + scales",
                                  "warp-walk pattern, 8 tiles interleaved by chunk",
                                  "warp-walk pattern, 2 blocks an SM (the walk's 16 warps)",
                                  "warp-walk pattern, 1 block an SM (8 warps)",
                                  "warp-walk pattern, the walk's grid, 8 chunks asked for at once",
                                  "warp-walk pattern, the walk's grid, the walk's sliding ring"};
      for (int mode = 0; mode < 11; ++mode) {
        const double us_u = timer.us(o.iters, [&](int i) {
          stream_experts_units(pgu, P, E, routes[i % R], mode, reinterpret_cast<uint32_t*>(y), s, inl);
        });
        row("experts gate_up bytes, plain read", shape, mode_names[mode], us_u, touched * 2 * I * H * 17 / 32);
      }
      // Warps per row tile (K split), against the automatic choice.
      if (sk) {
        auto* xh = dev_alloc<bf16_t>(size_t(M) * H, owned);  // fp16 activations, as the router leaves them
        fill_random_bf16(xh, size_t(M) * H, 77, 0.f, 0.5f, s);
        for (int ks : {4, 8}) {
          double us = timer.us(o.iters, [&](int i) {
            skinny_linear(pgu, xh, M <= 8, H, M, P, E, true, true, routes[i % R], gf, ks, s);
          });
          std::string v = "skinny ks=" + std::to_string(ks) + (M <= 8 ? " fp16 act" : " bf16 act");
          row("experts gate_up (mxfp4)", shape, v.c_str(), us, touched * 2 * I * H * 17 / 32);
          us = timer.us(o.iters, [&](int i) {
            skinny_linear(pdn, act, true, I, M, P, E, true, false, down_routes[i % R], Epilogue{Epilogue::kStoreF32, y, H}, ks, s);
          });
          v = "skinny ks=" + std::to_string(ks);
          row("experts down (mxfp4)", shape, v.c_str(), us, touched * H * I * 17 / 32);
        }
      }
      // Stream-K's shapes (fp16 activations, as in the model), at <= 8 tokens an expert.
      LinearProblem kp_sk = kp;
      kp_sk.decode_kernel = 0;
      if (choose_linear_kernel(kp_sk) == LinearKernel::kStreamK) {
        set_decode_kernel_choice(0);
        auto* xh = dev_alloc<bf16_t>(size_t(M) * H, owned);
        fill_random_bf16(xh, size_t(M) * H, 77, 0.f, 0.5f, s);
        Epilogue gh = g;
        gh.out_f16 = true;
        for (int v = 0; v < kStreamKVariants; ++v) {
          set_streamk_variant(v);
          double ug = timer.us(o.iters, [&](int i) { linear_grouped(pgu, xh, H, P, E, true, routes[i % R], gh, s, M, true); });
          double ud = timer.us(o.iters, [&](int i) {
            linear_grouped(pdn, act, I, P, E, false, down_routes[i % R], Epilogue{Epilogue::kStoreF32, y, H}, s, M, true);
          });
          std::string v_name = std::string("streamk fp16 act ") + streamk_variant_name(WeightMat::kFragMXFP4, v);
          row("experts gate_up (mxfp4)", shape, v_name.c_str(), ug, touched * 2 * I * H * 17 / 32);
          row("experts down (mxfp4)", shape, v_name.c_str(), ud, touched * H * I * 17 / 32);
          std::printf("| experts gate_up + down | %s | %s | %.2f | |\n", shape.c_str(), v_name.c_str(), ug + ud);
        }
        set_streamk_variant(0);
        set_decode_kernel_choice(-1);
      }
      // Other shapes of the one-n-tile MXFP4 kernel (warps splitting K, row tiles, chunks in flight).
      set_decode_kernel_choice(1);
      if (sk && (P + std::min(P, E) - 1) / std::min(P, E) <= 8) {
        for (int v = 1; v < kSkinnyVariants; ++v) {
          set_skinny_variant(v);
          double ug = timer.us(o.iters, [&](int i) { linear_grouped(pgu, xb, H, P, E, true, routes[i % R], gf, s, M); });
          double ud = timer.us(o.iters, [&](int i) {
            linear_grouped(pdn, act, I, P, E, false, down_routes[i % R], Epilogue{Epilogue::kStoreF32, y, H}, s, M, sk);
          });
          std::string v_name = std::string("skinny ") + skinny_variant_name(v);
          row("experts gate_up (mxfp4)", shape, v_name.c_str(), ug, touched * 2 * I * H * 17 / 32);
          row("experts down (mxfp4)", shape, v_name.c_str(), ud, touched * H * I * 17 / 32);
        }
        set_skinny_variant(0);
      }
      set_decode_kernel_choice(-1);  // back to GPTOSS_DECODE_KERNEL's choice
      double us_gu = timer.us(o.iters, [&](int i) { linear_grouped(pgu, xb, H, P, E, true, routes[i % R], gf, s, M); });
      row("experts gate_up (mxfp4)", shape + ", " + std::to_string(2 * I) + "x" + std::to_string(H), vn.c_str(),
          us_gu, touched * 2 * I * H * 17 / 32);
      double us_dn = timer.us(o.iters, [&](int i) {
        linear_grouped(pdn, act, I, P, E, false, down_routes[i % R], Epilogue{Epilogue::kStoreF32, y, H}, s, M, sk);
      });
      row("experts down (mxfp4)", shape + ", " + std::to_string(H) + "x" + std::to_string(I), vn.c_str(), us_dn,
          touched * H * I * 17 / 32);
      double us_c = timer.us(o.iters, [&](int i) { moe_combine(y, routes[i % R], M, k, H, x, normw, 1e-5f, xn, s); });
      row("moe combine (+next rmsnorm)", std::to_string(M) + "x" + std::to_string(H), "default", us_c, 0);
      // Every combine variant (kernels.h: old, version 2 with 1/2/4/8 blocks per token).
      for (int v = 1; v < kCombineVariants; ++v) {
        set_combine_variant(v);
        const double u = timer.us(o.iters, [&](int i) { moe_combine(y, routes[i % R], M, k, H, x, normw, 1e-5f, xn, s); });
        row("moe combine (+next rmsnorm)", std::to_string(M) + "x" + std::to_string(H),
            (std::string("variant ") + combine_variant_name(v)).c_str(), u, 0);
      }
      set_combine_variant(0);
      std::printf("| experts gate_up + down + combine | %s | %.1f experts touched | %.2f | %.0f |\n", shape.c_str(),
                  touched, us_gu + us_dn + us_c, touched * 3 * I * H * 17 / 32 / (us_gu + us_dn + us_c) / 1e3);
    }
    if (!experts_only) {  // (the router rows: cluster kernels)
      auto* router_w = dev_alloc<bf16_t>(size_t(E) * H, owned);
      fill_random_bf16(router_w, size_t(E) * H, 13, 0.f, 0.02f, s);
      us = timer.us(o.iters, [&](int i) {
        linear_rmsnorm(WeightMat{WeightMat::kBF16, router_w, nullptr, nullptr, E, H}, x, normw, 1e-5f, M, xn, true,
                       Epilogue{Epilogue::kStoreF32, logits, E}, s);
        moe_route(logits, M, E, k, routes[i % R], s);
      });
      row("router + route", std::to_string(M) + "x" + std::to_string(E), "norm+GEMV, then route", us, double(E) * H * 2);
      // The fused router variants (kernels.h: old up to 8 tokens, version 2's cluster shapes up to 64),
      // router rows resident in L2 (as the loop above) and rotated over copies that exceed it (as in
      // a decode step, where the experts' weights pass through L2 between two layers' routers).
      auto* ticket = dev_alloc<int>(1, owned);
      GPTOSS_CUDA_CHECK(cudaMemsetAsync(ticket, 0, sizeof(int), s));
      const size_t rbytes = size_t(E) * H * 2;
      const int rcopies = int(std::max<size_t>(1, (kRotateBytes / 2 + rbytes - 1) / rbytes));
      std::vector<bf16_t*> router_ws;
      for (int v = 0; v < kRouterVariants; ++v) {
        set_router_variant(v);
        if (!router_route_fuses(M, H, E, k)) continue;
        if (router_ws.empty())
          for (int i = 0; i < rcopies; ++i) {
            router_ws.push_back(dev_alloc<bf16_t>(size_t(E) * H, owned));
            fill_random_bf16(router_ws.back(), size_t(E) * H, 1000 + i, 0.f, 0.02f, s);
          }
        for (bool rotate : {false, true}) {
          us = timer.us(o.iters, [&](int i) {
            moe_router_route(rotate ? router_ws[i % rcopies] : router_w, nullptr, E, H, x, normw, 1e-5f, M, xn, M <= 8,
                             logits, k, routes[i % R], ticket, s);
          });
          const std::string vn = std::string("fused, variant ") + router_variant_name(v) +
                                 (v == 0 ? std::string(" (") + router_variant_name(router_variant()) + ")" : "") +
                                 (rotate ? ", rows from DRAM" : ", rows in L2");
          row("router + route", std::to_string(M) + "x" + std::to_string(E), vn.c_str(), us, double(rbytes));
        }
      }
      set_router_variant(0);
    }
  }
  if (!experts_only) {
    double us = timer.us(o.iters, [&](int) { argmax_rows(out, M, c.vocab, reinterpret_cast<int32_t*>(xn), s); });
    row("argmax", std::to_string(M) + "x" + std::to_string(c.vocab), "default", us, 0);
  }
  GPTOSS_CUDA_CHECK(cudaStreamSynchronize(s));
  if (!experts_only) {
    bench_prefill_dense(c, M, o.iters);
    bench_decode_attention(c, M, o.iters);
    bench_prefill_attention(c, o.iters);
  }
  for (void* p : owned) cudaFree(p);
  cudaStreamDestroy(s);
  return 0;
}

}  // namespace gptoss::cuda
