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
  app->add_option("--mxfp4-layers", o.mxfp4_layers, "Layers in MXFP4: experts (as published; quantizing the dense layers is not implemented yet)")
      ->capture_default_str();
  app->add_option("--mxfp4-backend", o.mxfp4_backend, "MXFP4 kernel family (cuda): auto (the one implemented so far)")->capture_default_str();
  app->add_option("--threads", o.threads, "CPU threads (0 = all cores)");
  app->add_option("--device-index", o.device_index, "CUDA device ordinal");
}

}  // namespace gptoss::tools
