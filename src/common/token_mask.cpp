#include "common/token_mask.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace gptoss {

namespace {
constexpr uint32_t kNegInfBits = 0xFF800000u;  // -inf
// kKeep[byte][i]: all ones where bit i of the byte is set, zero where clear; selecting by it
// masks 8 logits at once (vectorized), so a mask costs about a pass over the row.
struct KeepTable {
  uint32_t v[256][8];
  KeepTable() {
    for (int b = 0; b < 256; ++b)
      for (int i = 0; i < 8; ++i) v[b][i] = (b >> i) & 1 ? ~0u : 0u;
  }
};
const KeepTable kKeep;
}  // namespace

void apply_mask(const uint64_t* words, size_t n_words, float* logits, int vocab) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const size_t n = size_t(std::max(vocab, 0));
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = w < n_words ? words[w] : 0;
    float* row = logits + w * 64;
    const size_t len = std::min<size_t>(64, n - w * 64);
    if (len < 64) {
      for (size_t i = 0; i < len; ++i) row[i] = ((bits >> i) & 1) ? row[i] : ninf;
      continue;
    }
    if (bits == ~uint64_t(0)) continue;
    if (bits == 0) {
      std::fill(row, row + 64, ninf);
      continue;
    }
    uint32_t x[64];
    std::memcpy(x, row, sizeof(x));
    for (int k = 0; k < 8; ++k) {
      const uint32_t* keep = kKeep.v[(bits >> (8 * k)) & 0xFF];
      for (int i = 0; i < 8; ++i) x[8 * k + i] = (x[8 * k + i] & keep[i]) | (kNegInfBits & ~keep[i]);
    }
    std::memcpy(row, x, sizeof(x));
  }
}

}  // namespace gptoss
