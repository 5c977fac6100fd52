#pragma once
// Number formats of gpt-oss checkpoints: bf16 weights, MXFP4 experts (e2m1 values with one
// e8m0 scale per 32), and fp8 e4m3 for the optional KV cache. Host-side, exact conversions.
#include <cstdint>
#include <cstring>
#include <string>

namespace gptoss {

enum class DType { F32, BF16, F16, U8, I32, I64, F8_E4M3, BOOL };  // BOOL: one byte (Eagle3's t2d)

const char* dtype_name(DType t);           // safetensors spelling: "F32", "BF16", ...
bool dtype_from_name(const std::string& s, DType* out);
size_t dtype_size(DType t);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);

// fp8 e4m3 (the "fn" variant: no infinities, 0x7f/0xff are NaN, max 448), saturating.
float fp8_e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f);

// MXFP4: e2m1 code (0..15) -> value; e8m0 scale byte -> 2^(s-127).
extern const float kE2M1Values[16];
inline float e8m0_to_f32(uint8_t s) {
  if (s == 0xff) return __builtin_nanf("");
  uint32_t u = s == 0 ? 0x00400000u : uint32_t(s) << 23;  // 2^-127 is subnormal
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Dequantize one row of an MXFP4 matrix: `cols` values (multiple of 32) from cols/2 bytes of
// nibbles (low nibble = even element) and cols/32 scales.
void mxfp4_dequant_row(const uint8_t* blocks, const uint8_t* scales, int cols, float* out);

// Quantize one row to MXFP4 (OCP MX v1.0): per 32 values the scale is 2^(floor(log2(max|x|)) - 2)
// (e2m1's largest exponent is 2; all-zero blocks get 2^0), each value x / scale rounds to the
// nearest e2m1 value (ties to the even code), saturating at +-6. Values already of the form
// e2m1 * 2^k round-trip exactly. Used for `--mxfp4-layers` (dense layers quantized at load).
void mxfp4_quantize_row(const float* x, int cols, uint8_t* blocks, uint8_t* scales);

}  // namespace gptoss
