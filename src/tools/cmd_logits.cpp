// `gptoss logits`: the logits of every position of one full prefill, as float32 safetensors.
#include <cstdio>
#include <cstring>

#include "backend/backend_factory.h"
#include "backend/solo_sequence.h"
#include "common/error.h"
#include "model/safetensors.h"
#include "tools/command.h"
#include "tools/load_progress.h"
#include "tools/model_source.h"
#include "tools/options.h"
#include "tools/prompt_ids.h"

namespace {

struct Args {
  gptoss::BackendOptions backend;
  std::string ids, out;
};

gptoss::tools::RegisterCommand reg({"logits", "Write the logits of a full prefill to a safetensors file", [](CLI::App* app) {
  auto a = std::make_shared<Args>();
  gptoss::tools::add_backend_options(app, a->backend);
  gptoss::tools::add_prompt_ids_option(app, a->ids)->required();
  app->add_option("--out", a->out, "Output .safetensors (tensor \"logits\" [n, vocab] F32)")->required();
  return [a]() {
    if (auto rc = gptoss::tools::run_if_tp_worker(a->backend)) return *rc;
    auto ids = gptoss::tools::parse_ids(a->ids);
    gptoss::tools::choose_model(a->backend);
    a->backend.load_progress = gptoss::tools::stderr_load_progress();
    auto backend = gptoss::create_backend(a->backend);
    const int V = backend->config().vocab;
    for (int32_t t : ids)
      if (t >= V)
        throw gptoss::Error("prompt token " + std::to_string(t) + " is outside the model's vocabulary of " + std::to_string(V));
    gptoss::SoloSequence seq(*backend, int(ids.size()));
    std::vector<float> logits = seq.append(ids, /*all_logits=*/true);
    gptoss::TensorSpec spec{"logits", gptoss::DType::F32, {int64_t(ids.size()), V}};
    gptoss::write_safetensors(a->out, {spec}, [&](const gptoss::TensorSpec& s, uint8_t* out) {
      std::memcpy(out, logits.data(), s.nbytes());
    });
    std::printf("wrote %s: logits [%zu, %d]\n", a->out.c_str(), ids.size(), V);
    return 0;
  };
}});

}  // namespace
