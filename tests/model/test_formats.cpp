#include "common/dtype.h"
#include "test_util.h"

namespace gptoss {
namespace {

TEST(Formats, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Formats, Fp8E4M3EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    float v = fp8_e4m3_to_f32(uint8_t(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(f32_to_fp8_e4m3(v) & (v == 0 ? 0x7f : 0xff), c & (v == 0 ? 0x7f : 0xff)) << c << " " << v;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_fp8_e4m3(1e6f), 0x7e);  // saturates
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  // Nearest: 1.0625 is halfway between 1.0 and 1.125 -> even mantissa (1.0).
  EXPECT_EQ(fp8_e4m3_to_f32(f32_to_fp8_e4m3(1.0625f)), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(f32_to_fp8_e4m3(1.07f)), 1.125f);
}

TEST(Formats, Mxfp4Values) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(120), std::ldexp(1.0f, -7));
  uint8_t blocks[16], scales[1] = {128};
  for (int i = 0; i < 16; ++i) blocks[i] = uint8_t(i | ((15 - i) << 4));
  float out[32];
  mxfp4_dequant_row(blocks, scales, 32, out);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(out[2 * i], 2 * kE2M1Values[i]);
    EXPECT_EQ(out[2 * i + 1], 2 * kE2M1Values[15 - i]);
  }
}

// The quantizer behind --mxfp4-layers: exact on representable blocks, nearest value otherwise.
TEST(Formats, Mxfp4QuantizeRoundTripsAndRounds) {
  std::mt19937 r(7);
  // Representable rows (e2m1 codes times a power of two per block) come back bit-exactly,
  // whatever the block's largest code is.
  for (int t = 0; t < 200; ++t) {
    float x[64], back[64];
    for (int b = 0; b < 2; ++b) {
      int e = int(r() % 40) - 20, maxc = 1 + int(r() % 7);
      for (int i = 0; i < 32; ++i)
        x[b * 32 + i] = kE2M1Values[(r() % (maxc + 1)) | (r() % 2 ? 8 : 0)] * std::ldexp(1.0f, e);
    }
    uint8_t blocks[32], scales[2];
    mxfp4_quantize_row(x, 64, blocks, scales);
    mxfp4_dequant_row(blocks, scales, 64, back);
    for (int i = 0; i < 64; ++i) ASSERT_EQ(back[i], x[i]) << "t=" << t << " i=" << i;
  }
  // Rounding: block max 6 sets the scale to 1; then each value goes to its nearest e2m1 value,
  // ties to the even code; beyond 6 saturates (only possible through the max's own rounding).
  float x[32] = {6.f, 0.2f, 0.25f, 0.3f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -5.1f, -0.74f, 2.9f};
  const float want[13] = {6.f, 0.f, 0.f, 0.5f, 1.f, 1.f, 2.f, 2.f, 4.f, 4.f, -6.f, -0.5f, 3.f};
  uint8_t blocks[16], scales[1];
  float back[32];
  mxfp4_quantize_row(x, 32, blocks, scales);
  mxfp4_dequant_row(blocks, scales, 32, back);
  EXPECT_EQ(scales[0], 127);
  for (int i = 0; i < 13; ++i) EXPECT_EQ(back[i], want[i]) << "x=" << x[i];
  for (int i = 13; i < 32; ++i) EXPECT_EQ(back[i], 0.f);
  // Relative error on random gaussian-ish rows stays within e2m1's half-step bound.
  std::vector<float> row = test::random_floats(2880, r, 0.02f), q(2880);
  std::vector<uint8_t> qb(2880 / 2), qs(2880 / 32);
  mxfp4_quantize_row(row.data(), 2880, qb.data(), qs.data());
  mxfp4_dequant_row(qb.data(), qs.data(), 2880, q.data());
  EXPECT_LT(test::rel_error(q.data(), row.data(), row.size()), 0.12);
  // All-zero blocks: scale 2^0, zeros back.
  float z[32] = {}, zb[32];
  mxfp4_quantize_row(z, 32, blocks, scales);
  mxfp4_dequant_row(blocks, scales, 32, zb);
  EXPECT_EQ(scales[0], 127);
  for (float v : zb) EXPECT_EQ(v, 0.f);
}

}  // namespace
}  // namespace gptoss
