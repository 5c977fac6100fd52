#pragma once
// Host-side launchers of the CUDA backend's kernels. The backend composes them into a forward
// pass; tests call each one against the CPU reference (backend/cpu/cpu_ops.h). All pointers are
// device pointers; every launcher is asynchronous on `stream` and graph-capturable (no host sync,
// no allocation).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace gptoss {
struct RowSampling;  // backend/backend.h
struct LogitAdd;
struct TopLogprobs;
}

namespace gptoss::cuda {

using bf16_t = uint16_t;  // bf16 bits; kernels reinterpret as __nv_bfloat16

class CublasLtGemm;  // cublaslt_gemm.h: dense GEMMs through cuBLASLt, one per backend

// A weight matrix [N, K] (output rows, input columns), optionally one per expert.
struct WeightMat {
  // kBF16 / kMXFP4: the checkpoint's row-major layouts. kFrag*: repacked at load into the
  // tensor-core fragment order of the decode kernels (kernels/linear/frag_layout.cuh).
  enum Format { kBF16 = 0, kMXFP4 = 1, kFragBF16 = 2, kFragFP8 = 3, kFragMXFP4 = 4 };
  Format fmt = kBF16;
  const void* w = nullptr;          // bf16 [E][N][K], or MXFP4 nibbles [E][N][K/32][16]; kFrag*: see frag_layout.cuh
  const uint8_t* scales = nullptr;  // MXFP4 e8m0 [E][N][K/32] (kFragMXFP4: packed per tile chunk)
  const float* bias = nullptr;      // [E][N] f32 or null
  int N = 0, K = 0;
  const float* row_scale = nullptr;  // kFragFP8: [E][N], weight = e4m3 * row_scale
  bool swiglu_rows = false;          // kFrag*: gate/up rows paired inside each 16-row tile
};

// What happens to each output value v = (A . W^T)[row, n] + bias[n].
struct Epilogue {
  enum Mode {
    kStoreF32,    // out_f32[row, n] = v
    kStoreBF16,   // out_bf16[row, n] = v
    kAddF32,      // out_f32[row, n] += v (residual add)
    kSwiGLU,      // out_bf16[row, n/2] = swiglu(v[n even] (gate), v[n odd] (up))
    kScatterAdd,  // grouped only: out_f32[token(row), n] += weight(row) * v (atomic)
  };
  Mode mode = kStoreF32;
  void* out = nullptr;
  int ldo = 0;  // elements between output rows
  float swiglu_limit = 7.0f;
  bool out_f16 = false;  // kStoreBF16 / kSwiGLU: write fp16 instead of bf16 (skinny kernels only)
  // kSwiGLU on expert GEMM version 5 only: output columns stored in the fragment layout's K order
  // inside each 64-wide chunk, the order version 5 reads its activations in (the next GEMM, down,
  // then skips its transpose: linear_grouped's a_k_permuted).
  bool k_permuted = false;
};

// The router folded into o_proj at 1-kRouterFoldMaxTokens (8) tokens (kernels/moe/router_fold.cuh): no
// router launch.
// o_proj's blocks (linear_router_fold), as they finish their rows of the new residual x, add
// those rows' share of the router logits (sum over their rows of x * norm_w * router weight) and
// of x's sum of squares into acc, in fixed point (integer sums do not depend on the order the
// blocks add in, so every reader sees the same bits), and store x * norm_w in xg. The expert
// kernels then route from acc themselves (RMS, bias, top-k, softmax: the same function, so the
// same experts in gate_up and down): gate_up after its wait, stages its rows as xg * rms^-1 and,
// in its block 0, writes topk_w / topk_idx / slot_pair for the combine; down before its wait
// (acc was complete two launches back, as MoeRouting::settled says).
struct RouterFold {
  long long* acc = nullptr;       // [n][E + 1], zero before o_proj: logits x 2^32 [E], sum of squares x 2^24
  const bf16_t* w_t = nullptr;    // [H][E] the router's weights transposed (router_fold_transpose)
  const float* norm_w = nullptr;  // [H] the MoE's RMSNorm weights
  const float* bias = nullptr;    // [E] the router's bias
  float* bias_l2 = nullptr;       // [E] its copy, written by o_proj's block 0 (the readers find it in L2)
  float* xg = nullptr;            // [n][H] x * norm_w (o_proj writes, gate_up reads)
  float eps = 0.f;
  int E = 0, k = 0, H = 0;
  bool gate_up = false;  // this launch stages from xg and writes the combine's routing (else: down)
  // The combine folded as well (one token, every layer but the last; NormIn): down adds each
  // pair's weighted output rows into moe_out (fixed point, x 2^32, order-free as acc) instead of
  // storing them for a combine launch; the next layer's qkv normalizes x + moe itself
  // (linear_norm_in) and its o_proj adds moe into the residual (moe_in, here).
  long long* moe_out = nullptr;       // down: [H], zero before
  const long long* moe_in = nullptr;  // o_proj: the previous layer's moe_out, or null
  // Tokens of the pass (1 to kRouterFoldMaxTokens, n * k <= 32; the combine folds at one only): acc holds
  // [n][E + 1] sums and xg [n][H] rows. n_valid: a graph bucket's real tokens (MoeRouting::n_valid;
  // the rest take no expert pair), null where all n are.
  int n = 1;
  const int32_t* n_valid = nullptr;
};
// The next layer's input after a folded combine (RouterFold::moe_out): rows x + moe x 2^-32,
// normalized with norm_w (RMSNorm, eps) by the kernel that reads them (linear_norm_in).
struct NormIn {
  const float* x = nullptr;        // [H] the residual before the MoE's output
  const long long* moe = nullptr;  // [H] the MoE's output, fixed point x 2^32
  const float* norm_w = nullptr;   // [H]
  float eps = 0.f;
};
constexpr int kRouterFoldMaxE = 128;
// Tokens a folded pass takes (at most 8: one n-tile of o_proj's staged kernel, and the expert
// kernels sort every token's pairs in one warp, n * k <= 32).
constexpr int kRouterFoldMaxTokens = 8;
// The fold kernels' shared arrays are sized by a template capacity, 4 tokens up to 4, else 8, not
// by kRouterFoldMaxTokens: sized for 8 at every size, the one-token step ran 7% slower (thirtieth
// session, s30r4-r9: 120b fp8 tg64 512 against 547-551, bf16 452 against 484, 20b fp8 769 against
// 807-810), ~3% in the expert kernels' fold arrays (4544 -> 4944 bytes: the dynamic shared
// memory's start moved off 64 mod 128; aligned since, skinny_units.cu) and ~3% in o_proj's
// (shared rows 1040 -> 2064 bytes, unrolled sums, the staging margin: still 3.5% at one token when
// sized for 8, thirty-first session, s31r2-r3, and not from alignment).
constexpr int router_fold_capacity(int n) { return n <= 4 ? 4 : 8; }
// f(std::integral_constant<int, CAP>{}) with CAP the capacity of a folded pass of n tokens: how a
// launcher picks the instantiation.
template <class F>
auto with_router_fold_capacity(int n, F&& f) {
  return router_fold_capacity(n) == 4 ? f(std::integral_constant<int, 4>{}) : f(std::integral_constant<int, 8>{});
}
// Whether the expert kernels after a folded router take this expert matrix (fragment-layout
// MXFP4, K = 2880: gpt-oss's gate_up and down).
bool router_fold_experts_take(const WeightMat& W);
// [E][H] bf16 -> [H][E] (at load).
void router_fold_transpose(const bf16_t* w, int E, int H, bf16_t* w_t, cudaStream_t s);

// Device-side routing of a MoE layer: (token, expert) pairs sorted by expert. Filled by
// moe_route(); sized for at most `max_pairs` pairs and E experts.
struct MoeRouting {
  int32_t* counts = nullptr;        // [2]: n_groups, n_tiles
  int32_t* group_expert = nullptr;  // [E]
  int32_t* group_start = nullptr;   // [E] first sorted pair of the group
  int32_t* group_end = nullptr;     // [E]
  int32_t* tile_group = nullptr;    // [max_tiles] GEMM row tiles (kGemmBM pairs each)
  int32_t* tile_row = nullptr;      // [max_tiles]
  int32_t* pair_token = nullptr;    // [max_pairs] token of each sorted pair
  float* pair_weight = nullptr;     // [max_pairs]
  int32_t* topk_idx = nullptr;      // [max_pairs] token order: expert of (t, j)
  float* topk_w = nullptr;          // [max_pairs]
  int32_t* slot_pair = nullptr;     // [max_pairs] token order: sorted pair of (t, j)
  // A graph bucket's pass: tokens from *n_valid on are padding, and the fused decode router
  // (moe_router_route, every variant) gives them no pair (each 8 of them would be another pass of
  // an expert kernel); their slots (slot_pair) point at sorted pair 0, so the combine reads a
  // written row for them. Null: every token is real. moe_route ignores it (batch-invariant mode
  // and the unfused path route padding like real tokens).
  const int32_t* n_valid = nullptr;
  // Set by the caller when the routing was written by a kernel at least two launches back in the
  // stream (down after gate_up, not gate_up after the router): that kernel completed before the
  // previous one passed its griddepcontrol.wait, so a PDL kernel may read the routing (through
  // L2, __ldcg) and issue its first weight loads before its own wait.
  bool settled = false;
  // Set (fold.acc) on the expert launches of a 1-8-token pass after a folded o_proj: they route from the
  // fold's sums instead of reading the arrays above (which gate_up's block 0 fills in part).
  RouterFold fold;
};
constexpr int kGemmBM = 64;
inline int moe_max_tiles(int pairs, int E) { return (pairs + kGemmBM - 1) / kGemmBM + (pairs < E ? pairs : E); }
inline int moe_max_groups(int pairs, int E) { return pairs < E ? pairs : E; }
// Bytes of device memory a MoeRouting for (max_pairs, E) needs, and carving it from one block.
size_t moe_routing_bytes(int max_pairs, int E);
MoeRouting moe_routing_carve(void* mem, int max_pairs, int E);

// out = A . W^T + bias, with the epilogue. Dense: A [M, K] bf16 (row stride lda), rows 0..M-1.
// Picks a CUDA-core GEMV for small M and an mma.sync GEMM otherwise, or cuBLASLt (blas, when
// given and it takes the problem: bf16 weights from cublas_min_rows() rows, see
// choose_linear_kernel; our GEMM when it declines).
// invariant: the batch-invariant choice (--batch-invariant): one kernel family at every M, so
// a row's numerics do not depend on its batch companions (see choose_linear_kernel).
void linear(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi, cudaStream_t s,
            bool invariant = false, CublasLtGemm* blas = nullptr);
// Whether linear() with these arguments runs cuBLASLt, whose kernels let no programmatic dependent
// launch start early (the next kernel's wait then returns at once: attention_decode's row order).
bool linear_on_cublas(const WeightMat& W, int lda, int M, const Epilogue& epi, bool invariant, CublasLtGemm* blas);
// linear() with the router folded in (RouterFold): M = fold.n tokens (at most
// kRouterFoldMaxTokens and the rows o_proj's staged kernel stages), a residual-add epilogue,
// fragment weights whose decode kernel takes the fold (o_proj's staged shape). Returns false
// without launching anything where it does not; the caller then runs linear() and the router.
bool linear_router_fold(const WeightMat& W, const bf16_t* A, int lda, int M, const Epilogue& epi,
                        const RouterFold& fold, cudaStream_t s);
// linear() over one token whose row is rmsnorm(in.x + in.moe) (NormIn), normalized by the kernel
// as it stages it (qkv after a folded combine: its staged one-token kernel). Returns false without
// launching where that kernel does not take the problem.
bool linear_norm_in(const WeightMat& W, const NormIn& in, int M, const Epilogue& epi, cudaStream_t s);
// Whether linear(W, A, lda, M, epi, s, invariant) over dense weights runs the skinny kernel's
// 8-warp, two-row-tile block shape (skinny_dense_8x2); the int8 screen of lm_head recomputes its
// candidates with that kernel's arithmetic (lm_head_screen.h).
bool linear_runs_dense_8x2(const WeightMat& W, int M, bool invariant);
// out = rmsnorm(x; norm_w) . W^T + bias, with x the f32 residual stream [M, K]. Decode-sized M
// with bf16 W: the norm runs inside the GEMV (no normalized copy, no extra launch), and xn gets
// the normalized rows only if need_xn. Otherwise rmsnorm() into xn, then linear(). xn: bf16
// [M, K] workspace, always required.
// xn_f16: xn gets fp16 instead of bf16 (fused decode path only: linear_rmsnorm_fuses()).
// blas: as linear()'s, for the unfused path.
void linear_rmsnorm(const WeightMat& W, const float* x, const float* norm_w, float eps, int M, bf16_t* xn,
                    bool need_xn, const Epilogue& epi, cudaStream_t s, bool xn_f16 = false,
                    CublasLtGemm* blas = nullptr);
inline bool linear_rmsnorm_fuses(const WeightMat& W, int M) { return W.fmt == WeightMat::kBF16 && M <= 8; }
// Grouped (MoE): W holds E experts. Sorted pair p uses expert group_expert[g] for p in its group.
// gather_a: A row of pair p is pair_token[p] (else p). `pairs` is the host-known upper bound.
// tokens: the batch's token count (a group has at most that many rows; 0 = pairs); a_f16: A
// holds fp16 (skinny kernels only).
// a_k_permuted: A's rows are stored in the fragment layout's K order inside each 64-wide chunk
// (permute_rows_frag_k, or a k_permuted epilogue): only where expert_gemm_v5_runs() says version 5
// takes this call (else an error), which then skips its own transpose.
void linear_grouped(const WeightMat& W, const void* A, int lda, int pairs, int E, bool gather_a,
                    const MoeRouting& r, const Epilogue& epi, cudaStream_t s, int tokens = 0, bool a_f16 = false,
                    bool invariant = false, bool a_k_permuted = false);
// Whether linear_grouped with these arguments runs expert GEMM version 5 (so k-permuted
// activations and epilogues may be used).
bool expert_gemm_v5_runs(const WeightMat& W, const void* A, int lda, int pairs, int E, bool gather_a,
                         const Epilogue& epi, int tokens = 0, bool invariant = false);
// Rows [rows, K] bf16 (row stride K, K % 64 == 0) -> the same rows with each 64-wide chunk in the
// fragment layout's K order (the order expert GEMM version 5 stores activations in).
void permute_rows_frag_k(const bf16_t* src, int rows, int K, bf16_t* dst, cudaStream_t s);

// Prefill expert GEMM versions (kernels/moe/expert_gemm_mxfp4_bf16.cu): linear_grouped's GEMM
// path over MXFP4 experts (checkpoint or fragment layout) runs version 1 (gemm_kernel, gemm_mma.cu)
// or version 2 (tall tiles, 4-stage cp.async, weights decoded into the MMA's registers). Chosen by
// GPTOSS_EXPERT_GEMM=v1|v2|v3|v5|auto (read once; default auto: version 5 where
// expert_gemm_v5_preferred, else version 3 = Hopper wgmma, below; version 2 where those are
// unavailable) or set_expert_gemm_version (tests, bench; 0 = back to the environment's choice).
constexpr int kExpertGemmAuto = 10;
int expert_gemm_version();
void set_expert_gemm_version(int v);
// Whether version 2 takes this problem (MXFP4, K % 64 == 0, K <= 4096, N * K / 32 % 16 == 0,
// 16-byte aligned rows; a_rows: rows A holds).
bool expert_gemm_v2_supports(const WeightMat& W, const void* A, int lda, int a_rows, const Epilogue& epi);
// Version 2 itself (grouped, every epilogue; `pairs`: host bound as in linear_grouped).
void expert_gemm_v2(const WeightMat& W, const bf16_t* A, int lda, int pairs, int E, bool gather_a, const MoeRouting& r,
                    const Epilogue& epi, cudaStream_t s);
// Version 3 (kernels/moe/expert_gemm_wgmma.cu): Hopper wgmma, weights decoded into shared memory.
// Available only where the build has sm_90a code and the device is compute capability 9.0;
// elsewhere linear_grouped falls back to version 2. Takes what version 2 takes.
bool expert_gemm_v3_available();
bool expert_gemm_v3_supports(const WeightMat& W, const void* A, int lda, int a_rows, const Epilogue& epi);
// Row tiles of 64 sorted pairs (one warpgroup a CTA) or 128 (two warpgroups sharing each decoded
// weight tile), picked per launch by expert_gemm_v3_auto_tile_rows(pairs, E) unless forced:
// GPTOSS_EXPERT_GEMM_TILE_M=64|128|auto (read once) or set_expert_gemm_v3_tile_rows (tests,
// bench: 64, 128, 0 = auto, -1 = back to the environment's choice). expert_gemm_v3_tile_rows():
// the forced height, 0 when automatic.
void expert_gemm_v3(const WeightMat& W, const bf16_t* A, int lda, int pairs, int E, bool gather_a, const MoeRouting& r,
                    const Epilogue& epi, cudaStream_t s);
int expert_gemm_v3_tile_rows();
void set_expert_gemm_v3_tile_rows(int rows);
int expert_gemm_v3_auto_tile_rows(int pairs, int E);
// Version 5 (kernels/moe/expert_gemm_wgmma_wa.cu): Hopper wgmma with the weights as the A operand,
// decoded from the fragment layout straight into registers, the activations as B in shared memory
// (stored in the fragment layout's K order). Fragment layout, N % 64 == 0, and where version 3 is
// available; linear_grouped falls back to version 3 elsewhere.
bool expert_gemm_v5_supports(const WeightMat& W, const void* A, int lda, int a_rows, const Epilogue& epi);
// a_rows: the rows of A (tokens when gather_a, else pairs), which the warp-specialized kernel's
// tensor copies are bounded by (expert_gemm_v5_warp_specialized, expert_gemm_v5.h).
void expert_gemm_v5(const WeightMat& W, const bf16_t* A, int lda, int pairs, int E, bool gather_a, bool a_k_permuted,
                    const MoeRouting& r, const Epilogue& epi, cudaStream_t s, int a_rows);
// Pairs a version 5 tile (wgmma N): 32, 48, 64, 80, 96, 128, or 0 (auto: expert_gemm_v5_auto_tile_pairs).
// GPTOSS_EXPERT_GEMM_V5_N (read once) or set_expert_gemm_v5_tile_pairs (tests, bench; -1 = back
// to the environment's choice).
int expert_gemm_v5_tile_pairs();
void set_expert_gemm_v5_tile_pairs(int pairs);
// The automatic width for `pairs` sorted pairs over E experts: the least expected decode work
// (every tile decodes its CTA's weights once) under a cost a tile measured on the H200.
int expert_gemm_v5_auto_tile_pairs(int pairs, int E);
// The automatic choice between versions 5 and 3 for a pass of `pairs` over E experts: version 5
// at every size since the thirteenth session's measurements (the function keeps the rule and
// its evidence in one place).
bool expert_gemm_v5_preferred(int pairs, int E);
// Test hook for version 3's shared-memory layout and descriptors: C [64][128] f32 = A [64][K] .
// B [128][K]^T (bf16, row-major, K % 64 == 0) through one warpgroup's wgmma.
void wgmma_dense_tile_selfcheck(const bf16_t* A, const bf16_t* B, float* C, int K, cudaStream_t s);

// Which kernel a linear layer runs: one pure function of the problem, printed by bench-kernels.
enum class LinearKernel { kNone, kGemvBf16, kGemvMxfp4, kSkinnyMma, kStreamK, kGemmMma, kCublasLt };
// The tensor-core decode kernels over fragment weights (they take fp16 activations for MXFP4/fp8).
inline bool is_skinny_family(LinearKernel k) { return k == LinearKernel::kSkinnyMma || k == LinearKernel::kStreamK; }
constexpr int kSkinnyMaxTokens = 64;
struct LinearProblem {
  WeightMat::Format fmt;
  int rows;    // dense: M; grouped: sorted pairs
  int tokens;  // most rows one weight matrix (expert) sees
  int N, K;
  bool grouped;
  int force_path;  // 0 auto, 1 GEMV, 2 GEMM (tests, bench-kernels)
  // Batch-invariant: fragment weights take the skinny kernels at every size, narrow bf16 ones
  // (the router) the K-split GEMV; other weights have no batch-invariant kernel (kNone).
  bool invariant = false;
  // A cuBLASLt GEMM is offered for this (dense) problem (CublasLtGemm::supports): bf16 weights
  // from cublas_min_rows() rows take it unless invariant (its algorithm may change with M) or a
  // path is forced. The decode graphs of 17-64 rows hold such calls (captured like any kernel).
  bool cublas = false;
  int experts = 0;  // grouped: experts the pairs can touch (0: unknown, `tokens` bounds a group)
  // Decode kernel family for fragment weights at <= 8 tokens a group: 0 = stream-K (opt-in,
  // GPTOSS_DECODE_KERNEL=streamk), 1 = the block-per-tile skinny kernel (the default; see
  // decode_kernel_choice()). Both are the skinny family (fp16 activations).
  int decode_kernel = 0;
};
LinearKernel choose_linear_kernel(const LinearProblem& p);
const char* linear_kernel_name(LinearKernel k);
// Rows from which a dense bf16 layer offered cuBLASLt takes it (choose_linear_kernel) and the
// backend runs qkv, o_proj and lm_head over their bf16 weights instead of the decode copies: 17,
// or GPTOSS_CUBLAS_MIN_ROWS (read once; 65 = only past the skinny kernels' range). The skinny
// kernels pass over the weights once per 32 tokens, so 33-64 tokens read them twice
// (bench-kernels, H200, 20b, us, skinny bf16 -> cuBLASLt: qkv 16.79 -> 11.41 at 32 tokens,
// 28.65 -> 11.44 at 64; lm_head 300.79 -> 280.77, 560.22 -> 308.64). o_proj measured slower on
// cuBLASLt alone at 32 and 48 tokens (10.99 -> 17.70, 17.48 -> 20.60) and faster in the step
// (20b tg64 x32 6212 with it on the skinny kernel, 6528 on cuBLASLt; eleventh session).
int cublas_min_rows();
// Tensor-core decode kernels over fragment-layout weights (kFrag*), 1-64 tokens (per group when
// grouped; more loop). A: bf16 or fp16 (a_f16) rows; fp16 suits kFragFP8/kFragMXFP4 (bf16 is
// converted in registers), kFragBF16 needs bf16. Grouped: `pairs` sorted pairs of routing r, M =
// the batch's tokens (bounds the tokens of one group). Epilogues: store f32/bf16/fp16, add f32,
// SwiGLU (paired rows). ks_override: warps per row tile (0 = auto: 8, or another shape
// where one measured faster; 4 or 8 force that count, as the batch-invariant mode does with 8).
void skinny_linear(const WeightMat& W, const void* A, bool a_f16, int lda, int M, int pairs, int E, bool grouped,
                   bool gather_a, const MoeRouting& r, const Epilogue& epi, int ks_override, cudaStream_t s);
// o_proj's staged kernel (1-8 tokens) with the router's partial sums in its epilogue
// (linear_router_fold); false where that kernel does not take the problem (nothing launched).
bool skinny_router_fold(const WeightMat& W, const bf16_t* A, int lda, const Epilogue& epi, const RouterFold& fold,
                        cudaStream_t s);
// qkv's one-token staged kernel staging its row as rmsnorm(x + moe) (linear_norm_in).
bool skinny_norm_in(const WeightMat& W, const NormIn& in, const Epilogue& epi, cudaStream_t s);
// Whether skinny_linear over dense bf16 weights W (kFragBF16) at M tokens (one n-tile) with this
// ks_override launches skinny_mma_kernel with 8 warps over K and two row tiles a block (the shape
// launch_fmt picks for large grids such as lm_head's).
bool skinny_dense_8x2(const WeightMat& W, int M, int ks_override);
// The stream-K decode kernel (kernels/linear/streamk_mma.cu): what skinny_linear computes for
// <= 8 tokens a group, with the launch's chunks spread evenly over every warp of a full-GPU grid
// and split tiles finished in a fixed order (deterministic). streamk_takes: the problem fits its
// job counters; streamk_prepare: allocates the current device's workspace (before any graph
// capture; the first call outside a capture does it too).
bool streamk_takes(WeightMat::Format fmt, int N, int K, int pairs, int E, bool grouped, int M);
void streamk_prepare();
void streamk_linear(const WeightMat& W, const void* A, bool a_f16, int lda, int M, int pairs, int E, bool grouped,
                    bool gather_a, const MoeRouting& r, const Epilogue& epi, cudaStream_t s);
int decode_kernel_choice();          // GPTOSS_DECODE_KERNEL: streamk or skinny (default) -> 0 / 1
void set_decode_kernel_choice(int v);  // tests, bench-kernels
// bench-kernels: the stream-K kernel's (chunks in flight, blocks an SM) shape, 0 = the default.
constexpr int kStreamKVariants = 4;
void set_streamk_variant(int v);
const char* streamk_variant_name(WeightMat::Format fmt, int v);
// Diagnostic: reads the routed experts' kFragMXFP4 bytes with the skinny grid, no math.
void stream_experts(const WeightMat& W, int pairs, int E, const MoeRouting& r, uint32_t* sink, cudaStream_t s);
// The same bytes in the unit-walking kernel's pattern (four row tiles a block, 512 bytes a warp)
// (bench-kernels: what the pattern costs). mode 0: codes only; 1: with each chunk's scale sector
// from the scale array; 2: codes and scales read from inline_buf as if each chunk held its scales
// after its codes (544 bytes a chunk; inline_buf: E * N / 16 * K / 64 * 544 bytes); 3: from inline_buf
// in aligned groups of four chunks (their 2048 code bytes, then their 128 scale bytes; inline_buf
// rounded up to whole groups); 4: the scale array in 128-byte requests, one every fourth chunk step;
// 5: the warp-per-tile walk's pattern (a warp streams a whole row tile, 8 tiles a block); 6: the
// same reads at the addresses of a layout interleaving 8 tiles chunk by chunk (timing only); 7 / 8:
// mode 5 at 2 blocks an SM (the walk's 16 warps) / 1 block (shared memory reserved to hold it
// there); 9 / 10: the walk's own grid (two blocks an SM, a contiguous run of 8-tile units a block),
// each warp asking for 8 chunks at once (9) or refilling its ring a slot at a time as the walk
// does (10).
void stream_experts_units(const WeightMat& W, int pairs, int E, const MoeRouting& r, int mode, uint32_t* sink,
                          cudaStream_t s, const void* inline_buf = nullptr);
// Repacking into the fragment layout (once, at load): kBF16 -> kFragBF16 or kFragFP8 (aux_out:
// f32 row scales [E][N]), kMXFP4 -> kFragMXFP4 (aux_out: scales, E*N*K/32 bytes; d_flag gets
// bit 0 set if a scale byte exceeds 240, which the kernels do not take). w_out:
// frag_weight_bytes(to, E, N, K) bytes.
bool frag_packable(const WeightMat& W);
size_t frag_weight_bytes(WeightMat::Format fmt, int E, int N, int K);
WeightMat pack_frag(const WeightMat& W, int E, bool swiglu_rows, WeightMat::Format to, void* w_out, void* aux_out,
                    int* d_flag, cudaStream_t s);
// The int8 codes of the lm_head screen (lm_head_screen.h) in kFragFP8's byte layout: each bf16
// weight of row r as screen::quantize(w, scale[r * scale_stride]) + 128.
void pack_frag_i8(const WeightMat& W, const float* scale, int scale_stride, void* w_out, cudaStream_t s);
// The MoE's weighted sum in a fixed order (deterministic, unlike atomics): x[t] += sum_j
// topk_w[t, j] * y[slot_pair[t, j]] for n tokens of width H, y f32 [pairs][H]. If norm_w: also
// xn[t] = rmsnorm(x[t]) * norm_w (bf16), the next layer's input. Past decode sizes a block per token
// (unless invariant: one kernel at every size, the same sums).
void moe_combine(const float* y, const MoeRouting& r, int n, int k, int H, float* x, const float* norm_w, float eps,
                 bf16_t* xn, cudaStream_t s, bool invariant = false);

// Forces a path (tests): 0 = auto, 1 = GEMV, 2 = GEMM.
void set_linear_path(int path);
// Picks a dense GEMV kernel (benchmarks and tests): 0 = best known, 1 = the row-pair GEMV for all.
void set_gemv_variant(int v);
// bench-kernels: the MXFP4 skinny kernel's shape for one n-tile (0 = the default; 1..kSkinnyVariants-1 others).
constexpr int kSkinnyVariants = 27;
void set_skinny_variant(int v);
const char* skinny_variant_name(int v);
// Tests: the blocks a cluster of qkv's one-token norm-in kernel stages its row with (1, 2, 4 or 8;
// GPTOSS_NORM_IN_CLUSTER sets it for a run, 4 by default).
void set_norm_in_cluster(int blocks);
// Tests: clusters of 4 bring the row in by the bulk-copy engine's multicast where they can
// (GPTOSS_NORM_IN_MULTICAST=0 turns it off for a run); returns the previous setting. Where the
// last norm-in launch staged its row: "block", "cluster" or "multicast" ("none" before any).
bool set_norm_in_multicast(bool on);
const char* last_norm_in_staging();

// x (f32 [n, H]) -> y (bf16 [n, H]) = x / rms(x) * w. rows: optional row gather (y row i = x row rows[i]).
void rmsnorm(const float* x, const float* w, int n, int H, float eps, const int32_t* rows, bf16_t* y,
             cudaStream_t s);
// out[r * ldo + n] = bf16(x[r * N + n]) for M rows of N (round to nearest even).
void f32_rows_to_bf16(const float* x, int M, int N, bf16_t* out, int ldo, cudaStream_t s);
// x[i] = the bf16 nearest x[i], as f32 (in place).
void round_f32_to_bf16_values(float* x, size_t n, cudaStream_t s);
// x[i] = embed[tokens[i]] (bf16 -> f32).
void embed(const bf16_t* table, const int32_t* tokens, int n, int H, float* x, cudaStream_t s);

// Paged KV for one layer: [num_pages][2][page_size][Hkv][D] of bf16 or fp8 e4m3.
struct KvLayer {
  void* base = nullptr;
  bool fp8 = false;
  int page_size = 16;
};
// Per-token batch metadata shared by rope/KV-store and attention.
struct TokenMeta {
  const int32_t* pos = nullptr;      // [n] absolute position
  const int32_t* pt_off = nullptr;   // [n] offset of this token's sequence page table in `pt`
  const int32_t* pt = nullptr;       // page ids
};
// Rotates q and k of qkv ([n, (Hq + 2 Hkv) D] bf16, in place) with YaRN and stores k, v into
// the pages. inv_freq: [D/2] f32.
void rope_kv_store(bf16_t* qkv, int n, int Hq, int Hkv, int D, const float* inv_freq, float attn_scaling,
                   const TokenMeta& tm, const KvLayer& kv, cudaStream_t s);
// Attention with sinks over the pages (the token's own K/V must be stored already). q from qkv
// (row stride (Hq + 2 Hkv) D); out [n, Hq D] bf16. window 0 = full. nsplit: KV splits per token
// (flash-decoding); partial: workspace of attention_partial_floats() floats.
// path: kPerToken is the CUDA-core kernel above (any shape; decode's choice, with KV splits);
// kFlash is flash_attention below for every token where the shape allows it (else kPerToken);
// kAuto, when some sequence of the pass brings at least kFlashMinSeqTokens new tokens
// (info.max_seq_tokens; info.min_seq_tokens spares the per-token launch when no block needs
// it), gives the flash kernel the blocks of tokens
// it suits and the per-token kernel the rest (decode tokens among them: see
// kernels/attention/flash_blocks.cuh), else kPerToken. The flash kernel's result for a token
// depends only on that token's data, so kFlash always (--batch-invariant) keeps rows invariant.
enum class AttentionPath { kAuto, kPerToken, kFlash };
constexpr int kFlashMinSeqTokens = 16;
// Host-side facts of a pass for the kernel choice (0: unknown).
struct AttentionPassInfo {
  int num_seqs = 0;        // sequences with tokens in the pass
  int max_seq_tokens = 0;  // most new tokens of one sequence
  int min_seq_tokens = 0;  // fewest
  // New tokens of each sequence, in the pass's row order (empty: unknown). With it, kAuto's
  // per-token launches cover only the tokens from the first to the last block the flash kernel
  // leaves, not all n: a serving pass of 47 decode tokens and 3,600 prompt tokens otherwise runs
  // ~29K per-token and ~117K merge blocks a layer that only find their block taken and return.
  std::vector<int> seq_tokens;
};
// The token range [begin, end) of the blocks of tq tokens that hold more than kFlashMaxRuns
// sequences' tokens (flash_blocks.cuh: the per-token kernel's, under kAuto); {0, n} when
// seq_tokens is empty, {0, 0} when the flash kernel takes every block.
struct TokenRange {
  int begin = 0, end = 0;
};
TokenRange attention_per_token_range(const std::vector<int>& seq_tokens, int n, int tq);
size_t attention_partial_floats(int n, int Hq, int D, int nsplit);
void attention(const bf16_t* qkv, int n, int Hq, int Hkv, int D, int window, const float* sinks,
               const TokenMeta& tm, const KvLayer& kv, int nsplit, float* partial, bf16_t* out, cudaStream_t s,
               AttentionPath path = AttentionPath::kAuto, const AttentionPassInfo& info = {});
// Decode attention (kernels/attention/attention.cu) for passes where every token is the one new
// token of its sequence (plain decode; padding tokens at position 0 of a spare page are fine):
// rope_kv_store + attention in one launch. Each (token, kv head, split) block ropes its query
// heads, and the block whose split holds the token's position ropes k and stores k and v into the
// pages (bf16 or fp8), using the stored values for that key directly. qkv is only read (q and k
// stay unrotated there). The same K/V bytes as rope_kv_store; with plan.mma false (the CUDA-core
// kernel) the same result bits as rope_kv_store + attention with the same splits, with plan.mma
// (tensor cores, attention_decode_mma.cu) results within bf16 output rounding of them.
// plan.cluster: the plan.nsplit (a power of two <= kDecodeClusterMax; past 8 Hopper's
// non-portable cluster sizes) splits of a (token, kv head) form a thread-block cluster and merge
// through distributed shared memory (one launch); else plan.nsplit (<= 32) splits go through
// `partial` and the merge kernel, as attention().
constexpr int kDecodeClusterMax = 16;
// plan.mma: the tensor-core kernel (attention_decode_mma.cu) where the shape allows it (head_dim
// 64, <= 8 query heads a kv head); else the CUDA-core kernel, whose results equal rope_kv_store +
// attention's bit for bit.
struct DecodeAttentionPlan {
  int nsplit = 1;
  bool cluster = true;
  bool mma = false;
  bool operator==(const DecodeAttentionPlan&) const = default;
};
// The plan for n tokens whose longest key range (positions seen) is max_keys: a cluster of as
// many splits as the launch has room for (at most max_cluster; 8 is the portable size, 16 needs
// Hopper's opt-in), unless the context is long enough that split_nsplit (the backend's splits for
// split-and-merge, more than a cluster) walks fewer tiles a block. mma: the tensor-core kernel's
// plan (attention_decode_mma.h: fewer, longer splits), with plan.mma set.
DecodeAttentionPlan decode_attention_plan(int n, int Hkv, int max_keys, int split_nsplit, int max_cluster = 8,
                                          bool mma = true);
// kv_stored: rope_kv_store already ran over the pass (q rotated in qkv, every token's K/V in the
// pages), so a sequence may bring several tokens (speculative verify passes): each token attends
// to the pages up to its position, on the tensor-core kernel in its stored mode where plan.mma and
// the shape allow (the same K/V bytes, so a pass of one token a sequence gives the fused mode's
// bits), else attention()'s per-token kernel with plan.nsplit splits. qkv_overlaps: the kernel
// that wrote qkv lets this one launch early (programmatic dependent launch), so the tensor-core
// kernel fills its ring of K/V tiles before its wait and asks for its row after; false (cuBLASLt
// wrote qkv, the wait returns at once): the row first, so it does not queue behind the ring.
void attention_decode(const bf16_t* qkv, int n, int Hq, int Hkv, int D, int window, const float* sinks,
                      const float* inv_freq, float attn_scaling, const TokenMeta& tm, const KvLayer& kv,
                      const DecodeAttentionPlan& plan, float* partial, bf16_t* out, cudaStream_t s,
                      bool kv_stored = false, bool qkv_overlaps = true);
// Flash attention on tensor cores (kernels/attention/flash_attention.cu) for passes of long
// runs of tokens per sequence: same inputs and output as attention(), no KV splits. Shapes:
// head_dim 64 and 1, 2, 4 or 8 query heads per kv head (flash_attention_supported). all_blocks
// false: only the blocks of flash_attention_block_tokens() tokens flash_blocks.cuh gives it.
// max_runs: CTAs a block (gridDim.z), each taking every max_runs-th run of one sequence's tokens
// in the block; any value is correct, the most runs a block holds is the fastest.
bool flash_attention_supported(int Hq, int Hkv, int D);
int flash_attention_block_tokens(int Hq, int Hkv);
void flash_attention(const bf16_t* qkv, int n, int Hq, int Hkv, int D, int window, const float* sinks,
                     const TokenMeta& tm, const KvLayer& kv, bf16_t* out, cudaStream_t s, bool all_blocks = true,
                     int max_runs = 1);

// Router logits [n, E] f32 -> top-k + softmax, pairs sorted by expert (fills r).
// Expert parallelism: only experts [expert_begin, expert_end) get groups (numbered from
// expert_begin: group_expert holds the index among the held experts, as their weights are
// stored); the other experts' pairs keep their sorted slots but no kernel computes them.
void moe_route(const float* logits, int n, int E, int k, const MoeRouting& r, cudaStream_t s, int expert_begin = 0,
               int expert_end = -1);

// Tests only: the device's top-k of `rows` rows of E order keys (device arrays; k <= 4, E <= 256)
// by the shuffle-merge form (merge) or the round-by-round form, into sel_e / sel_v [rows][k].
void warp_top_k_probe(const uint32_t* keys, int rows, int E, int k, bool merge, int* sel_e, float* sel_v);

// Decode sizes (router_route_fuses): the router's RMSNorm + bf16 GEMV + moe_route in one launch.
// Leaves the normalized rows in xn (fp16 if xn_f16) when xn is not null, the logits in `logits`.
// ticket: a device int, zero before the first launch; the kernel leaves it zero.
bool router_route_fuses(int n, int K, int E, int k);
void moe_router_route(const bf16_t* w, const float* bias, int E, int K, const float* x, const float* norm_w, float eps,
                      int n, void* xn, bool xn_f16, float* logits, int k, const MoeRouting& r, int* ticket,
                      cudaStream_t s, int expert_begin = 0, int expert_end = -1);
// The decode router and combine come in variants (kernels/moe/route_decode.cu), for comparing
// them in one GPU run: 1 = the old kernels (route.cu: router up to 8 tokens, 16 blocks meeting at
// a ticket; combine clusters of 8 blocks x 128 threads), the others version 2's cluster shapes
// (router: tensor-core GEMV over K slices, 1-64 tokens, a cluster of 8 blocks x 16 warps or 16 x 8;
// "x": sums of squares always exchanged, "s": router rows staged in shared memory, not registers;
// combine: 1, 2, 4 or 8 blocks a token, 16-byte loads, one barrier).
// 0 = the environment's choice: GPTOSS_ROUTER_KERNEL=old|c8|c16|c8x|c8s|c16s and
// GPTOSS_COMBINE_KERNEL=old|c1|c2|c4|c8 (unset or "new": version 2's default). set_*: tests and
// bench-kernels (0 = back to the environment's choice).
constexpr int kRouterVariants = 7, kCombineVariants = 6;
int router_variant();
void set_router_variant(int v);
const char* router_variant_name(int v);
int combine_variant();
void set_combine_variant(int v);
const char* combine_variant_name(int v);

// out[i] = argmax of row i of logits [n, V] (ties to the lowest index; 0 for a row of NaNs).
void argmax_rows(const float* logits, int n, int V, int32_t* out, cudaStream_t s);
// Vocab-parallel greedy (tensor parallelism): a row's largest logit in one rank's vocab slice
// and its vocabulary id.
struct RowMax {
  float value;
  int32_t id;  // INT32_MAX: none (the slice is empty or all NaN)
};
// out[i] = (max, slice column + id0) of row i of one rank's slice logits [n][ld], V columns,
// by argmax_rows' rule.
void argmax_rows_slice(const float* logits, int n, int V, int ld, int id0, RowMax* out, cudaStream_t s);
// ids[i] = the id of the best of parts[r * n + i] over ranks r < world: with the parts of
// disjoint slices covering the row, exactly argmax_rows of the whole row; with sampler_rule,
// exactly sample_rows' pick at temperature 0 (the same but for a row whose largest logit is
// -inf: id 0, where argmax_rows takes the first -inf past any NaNs).
void argmax_merge_parts(const RowMax* parts, int world, int n, int32_t* ids, cudaStream_t s,
                        bool sampler_rule = false);

// out[i] = the token drawn from row i by how[i] (backend.h's RowSampling rule; how is device
// memory). Overwrites the rows with their unnormalized probabilities; a keep_logits row is not
// drawn (out -1) and keeps its logits. lp_out (optional, [n]):
// each drawn token's logprob under the row's logits (Backend::forward_sample's logprobs_out).
// top_out (device, [n], with lp_out): a row with how[i].top_logprobs = k > 0 gets its k best
// tokens there (row_top_logprobs' rule, the masked row before its changes).
// allowed (device, [masks][(V + 63) / 64] words): a row with how[i].allowed_row >= 0 first has
// the logits its mask refuses set to -inf (the logprob is then the masked row's). adds (device,
// with add_raw beside it, as long): the logit changes how[i].adds_begin / adds_count index
// (distinct ids of the vocabulary, in increasing order), added to the row before the rule;
// add_raw[k] receives entry k's logit before its change (the logprob is the row's before them).
void sample_rows(float* logits, int n, int V, const RowSampling* how, int32_t* out, cudaStream_t s,
                 float* lp_out = nullptr, const LogitAdd* adds = nullptr, float* add_raw = nullptr,
                 const uint64_t* allowed = nullptr, TopLogprobs* top_out = nullptr);

// Deterministic random fill from (seed, stream id): bf16 ~ uniform with the given std and mean;
// bytes uniform in [lo, hi].
void fill_random_bf16(bf16_t* p, size_t n, uint64_t seed, float mean, float std, cudaStream_t s);
void fill_random_f32(float* p, size_t n, uint64_t seed, float mean, float std, cudaStream_t s);
void fill_random_u8(uint8_t* p, size_t n, uint64_t seed, int lo, int hi, cudaStream_t s);

}  // namespace gptoss::cuda
