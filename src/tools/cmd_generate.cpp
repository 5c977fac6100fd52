// `gptoss generate`: prefill a prompt, then decode token by token through the KV cache.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <cstdio>
#include <random>

#include "backend/backend_factory.h"
#include "backend/solo_sequence.h"
#include "common/error.h"
#include "engine/sampling.h"
#include "tools/backend_options.h"
#include "tools/builtin_model.h"
#include "tools/command.h"
#include "tools/prompt_ids.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Args {
  gptoss::BackendOptions backend;
  std::string ids, text;
  int max_tokens = 16;
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
};

gptoss::tools::RegisterCommand reg({"generate", "Generate tokens after a prompt", [](CLI::App* app) {
  auto a = std::make_shared<Args>();
  gptoss::tools::add_backend_options(app, a->backend);
  auto* ids = app->add_option("--prompt-ids", a->ids, "Comma-separated token ids");
  auto* txt = app->add_option("--prompt", a->text, "Prompt text (tokenized with the model's tokenizer)");
  ids->excludes(txt);
  app->add_option("--max-tokens", a->max_tokens, "Tokens to generate")->capture_default_str()->check(CLI::PositiveNumber);
  app->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str()->check(CLI::NonNegativeNumber);
  app->add_option("--top-p", a->top_p, "Nucleus sampling mass")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
  return [a]() {
    if (a->backend.model_dir.empty() && a->backend.random_weights.empty())
      a->backend.model_dir = gptoss::tools::ensure_builtin_model();
    if (a->ids.empty() && a->text.empty()) throw gptoss::Error("pass --prompt-ids or --prompt");
    std::optional<gptoss::Tokenizer> tok;
    auto tok_path = std::filesystem::path(a->backend.model_dir) / "tokenizer.json";
    if (!a->backend.model_dir.empty() && std::filesystem::exists(tok_path)) tok = gptoss::Tokenizer::from_file(tok_path.string());
    if (!a->text.empty() && !tok) throw gptoss::Error("--prompt needs a tokenizer.json in the model directory; pass --prompt-ids");
    auto prompt = a->text.empty() ? gptoss::tools::parse_ids(a->ids) : tok->encode(a->text, /*allow_special=*/true);
    if (prompt.empty()) throw gptoss::Error("the prompt is empty");
    auto backend = gptoss::create_backend(a->backend);
    const int V = backend->config().vocab;
    for (int32_t t : prompt)
      if (t >= V) throw gptoss::Error("prompt token " + std::to_string(t) + " is outside the model's vocabulary of " + std::to_string(V));
    gptoss::SoloSequence seq(*backend, int(prompt.size()) + a->max_tokens);
    // The backends' sampling rule (backend.h), with one uniform a token from the seeded generator.
    std::mt19937_64 rng(a->seed);
    gptoss::RowSampling how;
    how.temperature = a->temperature;
    how.top_p = a->top_p;
    std::vector<float> logits = seq.append(prompt, false), scratch;
    std::vector<int32_t> out;
    for (int i = 0; i < a->max_tokens; ++i) {
      how.u = float(gptoss::uniform01(rng));
      int32_t t = gptoss::sample_row(logits.data(), V, how, scratch);
      out.push_back(t);
      if (i + 1 < a->max_tokens) logits = seq.append({t}, false);
    }
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
    // The text too, when the model has a tokenizer and every id is one of its tokens.
    if (tok && std::all_of(out.begin(), out.end(), [&](int32_t t) { return size_t(t) < tok->vocab_size(); }))
      std::fprintf(stderr, "%s\n", tok->decode(out).c_str());
    return 0;
  };
}});

}  // namespace
