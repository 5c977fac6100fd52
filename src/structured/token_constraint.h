#pragma once
// What the engine asks of a per-request constraint on the sampled tokens (structured output).
// The engine calls active() before each step: an active constraint's row is drawn from logits
// masked to allowed_tokens() (by the backend, or on the host by mask_logits()); every sampled
// token then goes to accept().
// An inactive constraint's row may be drawn without a mask (on the device): the engine then asks
// rejects() of the drawn token, and a refused token is dropped and its position drawn again
// after mask_next() (from the masked row: rejection sampling, so the token comes from the masked
// distribution exactly). One object per request; called from one thread at a time.
#include <cstddef>
#include <cstdint>

#include "common/token_mask.h"

namespace gptoss::structured {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // True when the next token must be drawn from masked logits.
  virtual bool active() const = 0;
  // The tokens allowed next, a bit each (common/token_mask.h: allowed_words(vocab) words, ids at
  // or past vocab clear; also while inactive, for a row sampled on the host anyway). False when
  // no token is allowed.
  virtual bool allowed_tokens(uint64_t* words, int vocab) = 0;
  // Sets the logits of the tokens allowed_tokens() leaves out to -infinity. False when no token
  // is allowed.
  bool mask_logits(float* logits, int vocab);
  // Advances on the sampled token. False when the token breaks the constraint.
  virtual bool accept(int32_t token) = 0;
  // For a token drawn without the mask (asked only then): true when mask_logits() would have
  // removed it.
  virtual bool rejects(int32_t /*token*/) const { return false; }
  // After a refused draw: the next draw is masked (active() is true until the next accept()).
  virtual void mask_next() {}
  // True when the constraint is inactive and stays so after accepting `token` (the engine may
  // then take the token and plan the next step before accept()).
  virtual bool stays_inactive(int32_t /*token*/) const { return false; }
};

}  // namespace gptoss::structured
