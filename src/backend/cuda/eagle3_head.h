#pragma once
// The Eagle3 draft head on the GPU: the CUDA backend's Backend::make_eagle3_head. Same math and
// cache rules as the host head (engine/eagle3_drafter.h, its test oracle), in bf16 weights and
// activations with f32 accumulation, over the backend's kernels (kernels.h: the bf16 GEMV/GEMM,
// RoPE + K/V store, paged attention, argmax) and a few of its own (kernels/eagle3/).
//
// Per sequence the head keeps its one layer's K/V in its own paged buffer (bf16, the backend's
// page layout, 16 positions a page; page i holds positions from (first_pos / 16 + i) * 16) and
// the pre-norm output of the last committed row, all on the device. Commits read the target's
// taps where the backend left them (ForwardBatch::taps_on_device) or upload host taps. A
// proposal chains on the device and copies back only the k token ids (and logits if asked).
#include <functional>
#include <memory>
#include <string>

#include "backend/eagle3_head.h"
#include "backend/cuda/kernels.h"
#include "model/config.h"
#include "model/eagle3_weights.h"

namespace gptoss::cuda {

// The taps of the backend's last forward with taps_on_device: bf16 [tokens, 3 * hidden].
struct DeviceTaps {
  const bf16_t* rows = nullptr;
  int32_t tokens = 0;
};

// What the head needs of the backend that makes it.
struct Eagle3HeadEnv {
  int device = 0;
  cudaStream_t stream = nullptr;  // the backend's: taps are written before a commit reads them
  GptOssConfig target;            // the model's (whole) config
  const bf16_t* target_embed = nullptr;  // [vocab, hidden] on the device: shared by a head without embed_tokens
  std::function<DeviceTaps()> taps;
};

// The head, or null with the reason in *why when its shapes do not suit the kernels (head_dim
// 32 or 64, at most 8 query heads per kv head, widths multiples of 32). Throws gptoss::Error
// when the head does not fit the target (hidden size, vocabulary).
std::unique_ptr<Eagle3Head> make_cuda_eagle3_head(std::shared_ptr<const Eagle3Weights> w, const Eagle3HeadEnv& env,
                                                  std::string* why);

}  // namespace gptoss::cuda
