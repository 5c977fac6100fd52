#pragma once
// The seam between the engine and whoever runs an Eagle3 draft head (docs/EAGLE3.md): the
// engine commits the rows whose tokens stand after verification and asks for the next drafts;
// an Eagle3Head does the math and keeps, per sequence, the head's own one-layer K/V cache.
//
// Two implementations: the host one (engine/eagle3_drafter.h, exact fp32 over cpu_ops, any
// backend with hidden-state taps) and the ones a backend makes for itself
// (Backend::make_eagle3_head; the CUDA backend runs the head on its GPU in bf16 and keeps the
// target's taps there, ForwardBatch::taps_on_device). Both follow the same rules, so the host
// head is the device head's test oracle (tests/cuda/test_cuda_eagle3.cpp).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gptoss {

// Where the target's taps of a commit's rows are ([n, 3 * target_hidden] floats a row).
struct Eagle3Taps {
  const float* host = nullptr;  // host rows (ForwardBatch::tap_out), or null:
  int32_t batch_token = 0;      // the rows from this batch token on of the last forward's device taps
};

class Eagle3Head {
 public:
  // One sequence's state: the head's K/V cache of committed rows and the pre-norm output of the
  // last one. Destroying it frees the cache.
  struct Seq {
    virtual ~Seq() = default;
  };

  virtual ~Eagle3Head() = default;
  // "host" or the backend's name ("cuda"): where the draft step runs.
  virtual std::string where() const = 0;
  // True when commit wants Eagle3Taps::batch_token (the forward was asked for taps_on_device).
  virtual bool device_taps() const { return false; }
  virtual std::unique_ptr<Seq> new_seq() const = 0;
  // Commits rows for positions pos .. pos + n - 1: next_tokens[i] is the token at pos + i + 1,
  // taps row i the target's taps at pos + i. A pos before the committed end rewinds to it
  // (recomputed rows; scratch rows of a proposal are always dropped); a pos after it (positions
  // whose taps the head never saw, e.g. a prefix-cache hit) restarts the cache there.
  virtual void commit(Seq& s, int32_t pos, int n, const int32_t* next_tokens, const Eagle3Taps& taps) = 0;
  // Up to k draft tokens (target ids) following the committed rows; empty when nothing is
  // committed. `logits`, when given, receives each step's draft-vocabulary logits ([k, draft_vocab]).
  virtual std::vector<int32_t> propose(Seq& s, int k, std::vector<float>* logits = nullptr) = 0;
};

}  // namespace gptoss
