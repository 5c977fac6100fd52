#pragma once
// Per-kernel timing of the decode-path kernels at gpt-oss shapes (`gptoss bench-kernels`): each
// kernel launched back to back on one stream as in a decode step, weights rotated over copies
// that together exceed the L2 cache so every launch reads them from DRAM. Prints a markdown
// table (microseconds per launch, GB/s of weights read). A tool for kernel work: it prints and
// never fails on a number.
#include <string>

namespace gptoss::cuda {

struct KernelBenchOptions {
  std::string model = "120b";  // shapes of this preset
  int iters = 200;             // timed launches per kernel
  int tokens = 1;              // decode batch
  bool attention_only = false; // only the attention rows (bench_prefill_attention, bench_decode_attention)
  int tp = 1, tp_rank = 0;     // tp > 1: the shapes one tensor-parallel rank runs (experts split on the intermediate)
  int sm_limit = 0;            // > 0: only the expert rows, on this many SMs, the rest held idle
                               // (kernels/misc/sm_blocker.h: a bigger card's bandwidth per SM)
};

int run_kernel_bench(const KernelBenchOptions& opts);

}  // namespace gptoss::cuda

namespace gptoss {
struct GptOssConfig;
}

namespace gptoss::cuda {

// Prefill attention at the preset's shapes (attention_bench.cpp): the per-token kernel against
// the flash kernel at 2048 and 4096 tokens (4096 more behind a 4096-token prefix), full and
// sliding layers, bf16 and fp8 KV; prints us, TFLOP/s and the kernels' max abs difference.
void bench_prefill_attention(const GptOssConfig& c, int iters);
// Decode attention at the preset's shapes for `tokens` sequences (attention_bench.cpp) at
// contexts 512, 4096 and 32768 (those whose pages stay under 2^18 tokens in all): rope_kv_store +
// attention + merge against attention_decode with the same splits and with its plan; prints us
// per step and the largest difference from the three-launch output.
void bench_decode_attention(const GptOssConfig& c, int tokens, int iters);
// The dense GEMMs (qkv, o_proj, router, lm_head) at M tokens (M >= 16; else nothing) on our
// mma.sync GEMM and on cuBLASLt when it loads (dense_gemm_bench.cpp): us, TFLOP/s and cuBLASLt's
// relative difference to ours. (At decode sizes the model runs the skinny kernels below
// cublas_min_rows(); bench-kernels' main table times those.) At 16-64 tokens a second table
// times cuBLASLt's e4m3 GEMM with a scale a weight row and a token at qkv, o_proj and lm_head's
// shapes: what an fp8 dense path at those sizes would buy (a probe; the model does not run it).
void bench_prefill_dense(const GptOssConfig& c, int M, int iters);

}  // namespace gptoss::cuda
