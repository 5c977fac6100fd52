#include "structured/token_constraint.h"

#include <vector>

namespace gptoss::structured {

bool TokenConstraint::mask_logits(float* logits, int vocab) {
  thread_local std::vector<uint64_t> words;
  words.assign(allowed_words(vocab), 0);
  const bool any = allowed_tokens(words.data(), vocab);
  apply_mask(words.data(), words.size(), logits, vocab);
  return any;
}

}  // namespace gptoss::structured
