#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"

namespace gptoss::cpu {

namespace {

// Eight independent partial sums let the compiler vectorize without reassociating anything
// beyond this fixed order, so a row's result never depends on the rest of the batch.
inline float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Shared driver of the two linear layers: `row(o, buf)` writes weight row o as floats.
// Below this many multiply-adds a parallel region costs more than it saves (and under a
// loaded machine, idle OpenMP threads spinning for work make small ops much slower).
constexpr size_t kParallelWork = size_t(1) << 18;

template <class RowFn>
void linear_rows(const float* x, int n, int in, int out, const float* bias, float* y, RowFn row) {
#pragma omp parallel if (size_t(n) * in * out >= kParallelWork)
  {
    std::vector<float> w(in);
#pragma omp for schedule(static)
    for (int o = 0; o < out; ++o) {
      row(o, w.data());
      float b = bias ? bias[o] : 0.0f;
      for (int t = 0; t < n; ++t) y[size_t(t) * out + o] = dot(x + size_t(t) * in, w.data(), in) + b;
    }
  }
}

}  // namespace

void rmsnorm(const float* x, const float* w, int n, int H, float eps, float* y) {
  for (int t = 0; t < n; ++t) {
    const float* xr = x + size_t(t) * H;
    double ss = 0;
    for (int i = 0; i < H; ++i) ss += double(xr[i]) * xr[i];
    float r = 1.0f / std::sqrt(float(ss / H) + eps);
    for (int i = 0; i < H; ++i) y[size_t(t) * H + i] = w[i] * (xr[i] * r);
  }
}

void linear_bf16(const float* x, int n, int in, const uint16_t* W, int out, const float* bias, float* y) {
  linear_rows(x, n, in, out, bias, y, [&](int o, float* w) {
    const uint16_t* r = W + size_t(o) * in;
    for (int i = 0; i < in; ++i) w[i] = bf16_to_f32(r[i]);
  });
}

void linear_mxfp4(const float* x, int n, int in, const uint8_t* blocks, const uint8_t* scales, int out,
                  const float* bias, float* y) {
  linear_rows(x, n, in, out, bias, y, [&](int o, float* w) {
    mxfp4_dequant_row(blocks + size_t(o) * in / 2, scales + size_t(o) * in / 32, in, w);
  });
}

void rope(float* x, int n, int n_heads, int head_dim, const int32_t* positions, const YarnTables& yarn) {
  const int half = head_dim / 2;
  std::vector<float> c(half), s(half);
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j < half; ++j) {
      float angle = float(positions[t]) * yarn.inv_freq[j];  // float32 product, as torch
      c[j] = float(std::cos(double(angle))) * yarn.attention_scaling;
      s[j] = float(std::sin(double(angle))) * yarn.attention_scaling;
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (size_t(t) * n_heads + h) * head_dim;
      for (int j = 0; j < half; ++j) {
        float a = v[j], b = v[j + half];
        v[j] = a * c[j] - b * s[j];
        v[j + half] = b * c[j] + a * s[j];
      }
    }
  }
}

void attention(const float* q, int n, int start_pos, const float* k, const float* v, int kv_first, int kv_len,
               int Hq, int Hkv, int D, int window, const float* sinks, float* out) {
  if (n <= 0) return;
  // The keys must cover what every query sees (the first query's window start .. the last
  // query's position): anything else would read outside k and v.
  const int first_seen = window > 0 ? std::max(0, start_pos - window + 1) : 0;
  if (first_seen < kv_first || start_pos + n > kv_first + kv_len)
    throw Error("cpu attention: queries at " + std::to_string(start_pos) + " .. " + std::to_string(start_pos + n - 1) +
                " see keys from " + std::to_string(first_seen) + ", given keys " + std::to_string(kv_first) + " .. " +
                std::to_string(kv_first + kv_len - 1));
  const float scale = 1.0f / std::sqrt(float(D));
  const int group = Hq / Hkv;
#pragma omp parallel if (size_t(n) * Hq * D * (start_pos + n) >= kParallelWork)
  {
    std::vector<float> p;
#pragma omp for collapse(2) schedule(static)
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < Hq; ++h) {
        const int pos = start_pos + t;
        const int lo = window > 0 ? std::max(0, pos - window + 1) : 0;
        const int kvh = h / group;
        const float* qr = q + (size_t(t) * Hq + h) * D;
        p.assign(pos - lo + 1, 0.0f);
        float m = sinks[h];
        for (int j = lo; j <= pos; ++j) {
          const float* kr = k + (size_t(j - kv_first) * Hkv + kvh) * D;
          float sc = dot(qr, kr, D) * scale;
          p[j - lo] = sc;
          m = std::max(m, sc);
        }
        float denom = std::exp(sinks[h] - m);
        for (auto& e : p) {
          e = std::exp(e - m);
          denom += e;
        }
        float* o = out + (size_t(t) * Hq + h) * D;
        std::fill(o, o + D, 0.0f);
        for (int j = lo; j <= pos; ++j) {
          const float* vr = v + (size_t(j - kv_first) * Hkv + kvh) * D;
          float w = p[j - lo] / denom;
          for (int d = 0; d < D; ++d) o[d] += w * vr[d];
        }
      }
  }
}

void router_topk(const float* logits, int n, int E, int k, int32_t* idx, float* weight) {
  std::vector<int32_t> order(E);
  for (int t = 0; t < n; ++t) {
    const float* l = logits + size_t(t) * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    float m = l[order[0]], sum = 0;
    for (int j = 0; j < k; ++j) {
      idx[t * k + j] = order[j];
      weight[t * k + j] = std::exp(l[order[j]] - m);
      sum += weight[t * k + j];
    }
    for (int j = 0; j < k; ++j) weight[t * k + j] /= sum;
  }
}

void swiglu(const float* gate_up, int n, int I, float limit, float* out) {
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < I; ++i) {
      float g = std::min(gate_up[size_t(t) * 2 * I + 2 * i], limit);
      float u = std::clamp(gate_up[size_t(t) * 2 * I + 2 * i + 1], -limit, limit);
      float glu = g / (1.0f + std::exp(-1.702f * g));
      out[size_t(t) * I + i] = glu * (u + 1.0f);
    }
}

}  // namespace gptoss::cpu
