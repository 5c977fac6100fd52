// `gptoss generate`: prefill a prompt, then decode token by token through the KV cache, printing
// the text to stdout as it is generated (or the ids, with --print-ids) and the speed to stderr.
// It stops at the tokens that end a turn (<|return|>, <|call|>, the model's eos: the rule
// the server's engine uses) unless --ignore-eos.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>

#include "backend/backend_factory.h"
#include "backend/solo_sequence.h"
#include "common/error.h"
#include "engine/sampling.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "tools/command.h"
#include "tools/load_progress.h"
#include "tools/model_source.h"
#include "tools/options.h"
#include "tools/prompt_ids.h"

namespace {

struct Args {
  gptoss::BackendOptions backend;
  gptoss::tools::SamplingArgs sampling;
  std::string ids, text, tokenizer;
  bool print_ids = false, ignore_eos = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(Args& a) {
  using namespace gptoss;
  if (auto rc = tools::run_if_tp_worker(a.backend)) return *rc;
  tools::choose_model(a.backend);
  if (a.ids.empty() && a.text.empty()) throw Error("pass --prompt TEXT or --prompt-ids 1,2,3");
  // The text needs a tokenizer; ids only need one to print text.
  std::optional<Tokenizer> tok;
  try {
    tok = tools::choose_tokenizer(a.tokenizer, a.backend.model_dir);
  } catch (const Error& e) {
    if (!a.text.empty()) throw;
    std::fprintf(stderr, "generate: no tokenizer (%s); printing token ids\n", e.what());
    a.print_ids = true;
  }
  auto prompt = a.text.empty() ? tools::parse_ids(a.ids) : tok->encode(a.text, /*allow_special=*/true);
  if (prompt.empty()) throw Error("the prompt is empty");
  a.backend.load_progress = tools::stderr_load_progress();
  auto backend = create_backend(a.backend);
  const GptOssConfig& mc = backend->config();
  const int V = mc.vocab;
  for (int32_t t : prompt)
    if (t >= V) throw Error("prompt token " + std::to_string(t) + " is outside the model's vocabulary of " + std::to_string(V));
  const int max_tokens = a.sampling.max_tokens;
  if (int64_t(prompt.size()) + max_tokens > mc.max_position_embeddings)
    throw Error("prompt (" + std::to_string(prompt.size()) + " tokens) + --max-tokens " + std::to_string(max_tokens) +
                " exceed the model's max_position_embeddings (" + std::to_string(mc.max_position_embeddings) + ")");
  std::vector<int32_t> stops;
  if (tok && !a.ignore_eos) stops = server::default_stop_tokens(*tok, mc);
  else if (!a.ignore_eos && mc.eos_token_id >= 0) stops = {mc.eos_token_id};

  SoloSequence seq(*backend, int(prompt.size()) + max_tokens);
  // The backends' sampling rule (backend.h), with one uniform a token from the seeded generator.
  std::mt19937_64 rng(a.sampling.seed);
  RowSampling how;
  how.temperature = a.sampling.temperature;
  how.top_p = a.sampling.top_p;
  how.top_k = a.sampling.top_k;
  how.min_p = a.sampling.min_p;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = seq.append(prompt, false), scratch;
  const double prefill_s = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();
  std::optional<StreamingDecoder> dec;
  if (tok) dec.emplace(*tok);
  int n = 0;
  int32_t stopped_at = -1;
  for (; n < max_tokens;) {
    how.u = float(uniform01(rng));
    int32_t t = sample_row(logits.data(), V, how, scratch);
    ++n;
    bool stop = std::find(stops.begin(), stops.end(), t) != stops.end();
    if (a.print_ids) {
      std::printf("%s%d", n > 1 ? "," : "", t);
    } else if (!stop) {
      // A token the tokenizer does not know (a model with a larger vocabulary) shows as its id.
      std::string s = tok->has_token(t) ? dec->push(t) : "<" + std::to_string(t) + ">";
      std::fwrite(s.data(), 1, s.size(), stdout);
    }
    std::fflush(stdout);
    if (stop) {
      stopped_at = t;
      break;
    }
    if (n < max_tokens) logits = seq.append({t}, false);
  }
  if (!a.print_ids && dec) {
    std::string rest = dec->flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);
  const double decode_s = seconds_since(t1);
  std::string why = stopped_at < 0 ? "--max-tokens reached"
                                   : "stopped at " + (tok && tok->has_token(stopped_at) ? std::string(tok->token_bytes(stopped_at))
                                                                                        : "token " + std::to_string(stopped_at));
  std::fprintf(stderr, "generate: prompt %zu tokens in %.3f s (%.1f tok/s); %d tokens generated in %.3f s (%.1f tok/s); %s\n",
               prompt.size(), prefill_s, prefill_s > 0 ? double(prompt.size()) / prefill_s : 0.0, n, decode_s,
               decode_s > 0 ? n / decode_s : 0.0, why.c_str());
  return 0;
}

gptoss::tools::RegisterCommand reg({"generate", "Generate text after a prompt (text streamed to stdout)", [](CLI::App* app) {
  auto a = std::make_shared<Args>();
  gptoss::tools::add_backend_options(app, a->backend);
  auto* ids = gptoss::tools::add_prompt_ids_option(app, a->ids);
  auto* txt = app->add_option("--prompt", a->text,
                              "The prompt as text (harmony special tokens such as <|start|> written in it are parsed)");
  ids->excludes(txt);
  gptoss::tools::add_sampling_options(app, a->sampling);
  gptoss::tools::add_tokenizer_option(app, a->tokenizer);
  app->add_flag("--print-ids", a->print_ids, "Print the generated token ids (comma-separated, an ending token included) instead of the text");
  gptoss::tools::add_ignore_eos_option(app, a->ignore_eos);
  return [a]() { return run(*a); };
}});

}  // namespace
