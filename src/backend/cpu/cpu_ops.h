#pragma once
// The ops of the gpt-oss forward pass in plain fp32, one function each: the CPU backend is
// composed of them, and every CUDA kernel is tested against them. Row-major everywhere;
// `n` is a number of tokens (rows). Parallel over output rows with OpenMP.
#include <cstdint>

#include "model/config.h"

namespace gptoss::cpu {

// y[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w, per row of H.
void rmsnorm(const float* x, const float* w, int n, int H, float eps, float* y);

// y[n, out] = x[n, in] . W^T + bias, W stored bf16 [out, in]. bias may be null.
void linear_bf16(const float* x, int n, int in, const uint16_t* W, int out, const float* bias, float* y);

// The same with an MXFP4 matrix [out, in]: `blocks` [out, in/32, 16] nibbles (low = even
// element), `scales` [out, in/32] e8m0.
void linear_mxfp4(const float* x, int n, int in, const uint8_t* blocks, const uint8_t* scales, int out,
                  const float* bias, float* y);

// Rotates `x` [n, n_heads, head_dim] in place at absolute `positions` (YaRN; the two halves of
// each head are the pair: dim j with dim j + head_dim/2).
void rope(float* x, int n, int n_heads, int head_dim, const int32_t* positions, const YarnTables& yarn);

// Causal attention with sinks for one sequence. q: [n, Hq, D] for positions start_pos ..
// start_pos+n-1. k, v: [kv_len, Hkv, D] for positions kv_first .. kv_first+kv_len-1 (must cover
// every position a query sees, else gptoss::Error). window > 0: query i sees keys i-window+1 ..
// i; 0 = full (from position 0).
// sinks: [Hq]. out: [n, Hq, D]. Scores scaled by 1/sqrt(D).
void attention(const float* q, int n, int start_pos, const float* k, const float* v, int kv_first, int kv_len,
               int Hq, int Hkv, int D, int window, const float* sinks, float* out);

// Top-k of each row of router logits [n, E] (descending; ties to the lower index) and the
// softmax over those k values.
void router_topk(const float* logits, int n, int E, int k, int32_t* idx, float* weight);

// gate_up: [n, 2I] interleaved (even = gate, odd = up) -> out [n, I]:
// glu = min(gate, limit); lin = clamp(up, -limit, limit); out = glu * sigmoid(1.702 glu) * (lin + 1).
void swiglu(const float* gate_up, int n, int I, float limit, float* out);

}  // namespace gptoss::cpu
