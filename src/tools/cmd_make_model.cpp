// `gptoss make-model`: a random-weight checkpoint in the published layout.
#include <cstdio>

#include <filesystem>

#include "model/eagle3_weights.h"
#include "common/error.h"
#include "model/make_model.h"
#include "tokenizer/tokenizer.h"
#include "tools/command.h"
#include "tools/options.h"

namespace {

struct Args {
  std::string preset = "tiny", out;
  uint64_t seed = 0;
  int layers = 0;
  double shard_gb = 4.0;
  bool no_tokenizer = false;
  bool no_embed = false;
  int loop_tokens = 0;
};

gptoss::tools::RegisterCommand reg({"make-model", "Write a random-weight gpt-oss checkpoint (HF layout)", [](CLI::App* app) {
  auto a = std::make_shared<Args>();
  app->add_option("--preset", a->preset,
                  "Shape of the model: tiny, 20b or 120b; or an Eagle3 draft head for one of them: eagle3-tiny, "
                  "eagle3-20b, eagle3-120b")
      ->capture_default_str()
      ->check(gptoss::tools::one_of({"tiny", "20b", "120b", "eagle3-tiny", "eagle3-20b", "eagle3-120b"}));
  app->add_option("--out", a->out, "Output directory")->required();
  app->add_option("--seed", a->seed, "Random seed (same seed, same files)")
      ->capture_default_str()
      ->check(gptoss::tools::seed_value());
  app->add_option("--layers", a->layers, "Number of layers instead of the preset's (e.g. 2 layers of 120b shape)")
      ->check(gptoss::tools::int_range(1, 1000));
  app->add_option("--shard-gb", a->shard_gb, "Approximate shard size in GB, at most 1000000")
      ->capture_default_str()
      ->check(gptoss::tools::positive_number(true, 1e6));
  app->add_flag("--no-tokenizer", a->no_tokenizer, "Do not write tokenizer.json (o200k_harmony)");
  app->add_option("--loop-tokens", a->loop_tokens,
                  "A loop model: random weights whose greedy continuation of token 1000 + i is 1000 + (i + 1) % N "
                  "(speculative-decoding benchmarks; see LoopSpec in model/make_model.h)")
      ->check(gptoss::tools::int_range(1, 1 << 20));
  app->add_flag("--no-embed", a->no_embed,
                "Eagle3 heads: leave out embed_tokens.weight (the head then shares the target's embedding)");
  return [a]() {
    if (a->preset.rfind("eagle3-", 0) == 0) {
      if (a->layers > 0) throw gptoss::Error("--layers does not apply to an Eagle3 head (one layer)");
      if (a->loop_tokens > 0) throw gptoss::Error("--loop-tokens does not apply to an Eagle3 head");
      gptoss::make_random_eagle3(gptoss::Eagle3Config::preset(a->preset), a->out, a->seed, !a->no_embed);
      std::printf("wrote %s (Eagle3 head %s, seed %llu%s)\n", a->out.c_str(), a->preset.c_str(),
                  (unsigned long long)a->seed, a->no_embed ? ", no embed_tokens" : "");
      return 0;
    }
    if (a->no_embed) throw gptoss::Error("--no-embed is for Eagle3 heads (--preset eagle3-...)");
    auto c = gptoss::GptOssConfig::preset(a->preset);
    if (a->layers > 0) {
      c.num_layers = a->layers;
      c.layer_sliding.resize(a->layers);
      for (int i = 0; i < a->layers; ++i) c.layer_sliding[i] = i % 2 == 0;
    }
    gptoss::LoopSpec loop;
    loop.tokens = a->loop_tokens;
    gptoss::make_random_model(c, a->out, a->seed, size_t(a->shard_gb * 1e9), loop);
    if (!a->no_tokenizer)
      gptoss::write_harmony_tokenizer_json(gptoss::default_tiktoken_path(),
                                           (std::filesystem::path(a->out) / "tokenizer.json").string());
    std::printf("wrote %s (preset %s, %d layers, seed %llu%s)\n", a->out.c_str(), a->preset.c_str(), c.num_layers,
                (unsigned long long)a->seed,
                loop.active() ? (", loop of " + std::to_string(loop.tokens) + " tokens from id " +
                                 std::to_string(loop.first_id)).c_str()
                              : "");
    return 0;
  };
}});

}  // namespace
