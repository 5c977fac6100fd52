#include "common/dtype.h"

#include <algorithm>
#include <cmath>

namespace gptoss {

const float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::U8: return "U8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

bool dtype_from_name(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16},         {"U8", DType::U8},
      {"I32", DType::I32}, {"I64", DType::I64},   {"F8_E4M3", DType::F8_E4M3}, {"BOOL", DType::BOOL}};
  for (auto& [n, t] : table)
    if (s == n) {
      *out = t;
      return true;
    }
  return false;
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::U8: case DType::F8_E4M3: case DType::BOOL: return 1;
    case DType::I64: return 8;
  }
  return 0;
}

float f16_to_f32(uint16_t h) {
  int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(float(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(float(man | 0x400), exp - 25);
  return sign ? -v : v;
}

float fp8_e4m3_to_f32(uint8_t v) {
  int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  float r;
  if (exp == 15 && man == 7) return NAN;
  if (exp == 0) r = std::ldexp(float(man), -9);
  else r = std::ldexp(float(8 + man), exp - 10);
  return sign ? -r : r;
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to the largest finite value
  // Find the nearest representable value (round to nearest even) by scanning the 127
  // non-negative codes' neighbourhood: compute exponent directly.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp_field = e - 1 + 7;  // unbiased exponent e-1
  float q;                    // quantum at this binade
  if (exp_field <= 0) q = std::ldexp(1.0f, -9);  // subnormal spacing
  else q = std::ldexp(1.0f, e - 1 - 3);
  float r = std::nearbyint(a / q) * q;  // default rounding mode: nearest even
  if (r >= 448.0f) return sign | 0x7e;
  if (r == 0.0f) return sign;
  int re;
  std::frexp(r, &re);
  int ef = re - 1 + 7;
  uint8_t code;
  if (ef <= 0) code = uint8_t(std::lround(r / std::ldexp(1.0f, -9)));
  else code = uint8_t((ef << 3) | (int(std::lround(r / std::ldexp(1.0f, re - 1 - 3))) - 8));
  return sign | code;
}

void mxfp4_dequant_row(const uint8_t* blocks, const uint8_t* scales, int cols, float* out) {
  for (int b = 0; b < cols / 32; ++b) {
    float s = e8m0_to_f32(scales[b]);
    const uint8_t* p = blocks + b * 16;
    for (int j = 0; j < 16; ++j) {
      out[b * 32 + 2 * j] = kE2M1Values[p[j] & 0xf] * s;
      out[b * 32 + 2 * j + 1] = kE2M1Values[p[j] >> 4] * s;
    }
  }
}

namespace {
// Nearest e2m1 code of |v| (ties to the even code: the one with mantissa bit 0).
uint8_t e2m1_code_of(float a) {
  // Midpoints between neighbours 0, .5, 1, 1.5, 2, 3, 4, 6; at a midpoint the lower code wins if
  // it is even (0, 1.0, 2.0, 4.0 have even codes 0, 2, 4, 6), else the upper one.
  static const float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t c = 0;
  while (c < 7 && (a > kMid[c] || (a == kMid[c] && (c & 1)))) ++c;
  return c;
}
}  // namespace

void mxfp4_quantize_row(const float* x, int cols, uint8_t* blocks, uint8_t* scales) {
  for (int b = 0; b < cols / 32; ++b) {
    const float* v = x + b * 32;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    int e = 0;
    if (amax > 0.f && std::isfinite(amax)) e = std::clamp(int(std::floor(std::log2(amax))) - 2, -127, 127);
    scales[b] = uint8_t(e + 127);
    const float inv = std::ldexp(1.0f, -e);
    for (int j = 0; j < 16; ++j) {
      uint8_t nib[2];
      for (int h = 0; h < 2; ++h) {
        float q = v[2 * j + h] * inv;
        uint8_t c = e2m1_code_of(std::fabs(q));
        nib[h] = uint8_t(c | (std::signbit(q) && c != 0 ? 8 : 0));
      }
      blocks[b * 16 + j] = uint8_t(nib[0] | (nib[1] << 4));
    }
  }
}

}  // namespace gptoss
