#pragma once
// Allowed-token masks: one bit a token id (bit i % 64 of word i / 64 set when token i may be
// drawn), as structured output builds them (structured/) and the backends apply them
// (LogitChanges::allowed). The host's application of a mask, shared by both.
#include <cstddef>
#include <cstdint>

namespace gptoss {

// The words of a mask over `vocab` ids.
inline size_t allowed_words(int vocab) { return vocab > 0 ? (size_t(vocab) + 63) / 64 : 0; }

// Sets logits[i] = -inf for every i < vocab whose bit is clear in words[0, n_words) (ids past
// them included), as the CUDA sampler does (a refused NaN becomes -inf too).
void apply_mask(const uint64_t* words, size_t n_words, float* logits, int vocab);

}  // namespace gptoss
