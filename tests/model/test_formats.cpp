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

}  // namespace
}  // namespace gptoss
