#pragma once
// The command-line options every model-running command shares (vLLM/llama.cpp spelling).
#include <CLI/CLI.hpp>

#include "backend/backend_factory.h"

namespace gptoss::tools {

inline void add_backend_options(CLI::App* app, BackendOptions& o, bool model_required = false) {
  auto* m = app->add_option("--model", o.model_dir, "Model directory (Hugging Face layout)");
  if (model_required) m->required();
  app->add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  app->add_option("--random-weights", o.random_weights, "Random weights of a preset (120b, 20b) built on the GPU");
  app->add_option("--weights-seed", o.seed, "Seed of --random-weights");
  app->add_option("--mxfp4-layers", o.mxfp4_layers,
                  "Layers in MXFP4 (cuda): experts (as published), all, or a list of qkv,o,lm_head "
                  "quantized at load (lossy: see docs/BENCHMARKS.md)")
      ->capture_default_str();
  app->add_option("--mxfp4-backend", o.mxfp4_backend,
                  "MXFP4 kernel family (cuda): auto, mma (tensor-core decode kernels over weights repacked at "
                  "load), gemv (CUDA-core GEMVs over the checkpoint layout)")
      ->capture_default_str();
  app->add_option("--dense-dtype", o.dense_dtype,
                  "Decode weights of q/k/v/o and lm_head (cuda): bf16 (exact) or fp8 (e4m3, one scale per row, "
                  "half the bytes; prefill stays bf16)")
      ->capture_default_str();
  app->add_option("--threads", o.threads, "CPU threads (0 = all cores)");
  app->add_option("--device-index", o.device_index, "CUDA device ordinal");
  app->add_flag("--batch-invariant", o.batch_invariant,
                "Deterministic kernels: a row's result independent of batch size and companions (cuda; cpu always is)");
}

}  // namespace gptoss::tools
