#pragma once
// Small helpers the engine tests share.
#include <gtest/gtest.h>

#include "engine/engine.h"

namespace gptoss::test {

// Greedy decoding of exactly `max_tokens` tokens (end-of-turn tokens do not stop it).
inline SamplingParams greedy(int max_tokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  return sp;
}

// After every request has finished: no KV page is held and no sequence is active.
inline void expect_pools_balanced(const Engine& e) {
  for (int g = 0; g < 2; ++g) EXPECT_EQ(e.stats().kv_pages_used[g], 0) << "group " << g;
  EXPECT_EQ(e.num_active(), 0);
}

}  // namespace gptoss::test
