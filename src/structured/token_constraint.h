#pragma once
// What the engine asks of a per-request constraint on the sampled tokens (structured output).
// The engine calls active() before each step: an active constraint's row is sampled on the host
// from logits that mask_logits() has masked; every sampled token then goes to accept().
// One object per request; mask_logits() and accept() are called from one thread at a time.
#include <cstdint>

namespace gptoss::structured {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // True when the next token is constrained.
  virtual bool active() const = 0;
  // Sets the logits of the tokens not allowed next to -infinity. False when no token is allowed.
  virtual bool mask_logits(float* logits, int vocab) = 0;
  // Advances on the sampled token (also while inactive). False when the token breaks the constraint.
  virtual bool accept(int32_t token) = 0;
};

}  // namespace gptoss::structured
