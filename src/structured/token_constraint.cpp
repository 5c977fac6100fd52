#include "structured/token_constraint.h"

#include <vector>

#include "structured/token_masker.h"

namespace gptoss::structured {

bool TokenConstraint::mask_logits(float* logits, int vocab) {
  thread_local std::vector<uint64_t> words;
  words.assign(words_for(vocab), 0);
  const bool any = allowed_tokens(words.data(), vocab);
  apply_mask(words.data(), words.size(), logits, vocab);
  return any;
}

}  // namespace gptoss::structured
