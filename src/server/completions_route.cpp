// /v1/completions: a text or token prompt continued, with echo and the legacy logprobs object,
// answered whole or streamed.
#include "server/route_handlers.h"
#include "server/structured_output.h"

#include <chrono>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace gptoss::server {

using namespace std::chrono_literals;

struct Server::Handlers::TextStream {
  std::shared_ptr<RequestStream> rs;
  std::string id, model;
  int64_t created = 0;
  bool include_usage = false, continuous_usage = false, logprobs = false;
  bool done = false;
  bool echo_pending = false;  // echo: the prompt text is still to be sent
  std::string echo;
  int32_t first_prompt_token = -1;  // echo with logprobs: listed first, with null logprobs
  size_t text_offset = 0;           // characters before the next token's text
  std::vector<TokenLogprob> pending_lps;  // logprobs of tokens whose text has not been sent yet
};

// Characters (Unicode code points) in UTF-8 bytes, as OpenAI counts text_offset: bytes that
// are not continuation bytes (a character cut between tokens counts where it starts).
size_t Server::Handlers::count_chars(std::string_view b) {
  size_t n = 0;
  for (unsigned char c : b) n += (c & 0xC0) != 0x80;
  return n;
}

// The completions logprobs object of `lps`, preceded (first_token >= 0) by a prompt's first
// token, which has no logprob (null, as OpenAI writes it). Advances `offset`.
json Server::Handlers::text_logprobs(const std::vector<TokenLogprob>& lps, size_t& offset, int32_t first_token) {
  json tokens = json::array(), tlp = json::array(), top = json::array(), offs = json::array();
  auto add = [&](int32_t id, json logprob, json top_map) {
    std::string t = token_str(s.tok_, id);
    tokens.push_back(t);
    tlp.push_back(std::move(logprob));
    top.push_back(std::move(top_map));
    offs.push_back(offset);
    offset += count_chars(t);
  };
  if (first_token >= 0) add(first_token, nullptr, nullptr);
  for (const auto& lp : lps) {
    json m = json::object();
    for (auto& [id, v] : lp.top) m[token_str(s.tok_, id)] = v;
    add(lp.token, lp.logprob, std::move(m));
  }
  return {{"tokens", tokens}, {"token_logprobs", tlp}, {"top_logprobs", top}, {"text_offset", offs}};
}

json Server::Handlers::text_chunk(const TextStream& st, const std::string& text, const json& lp, const char* finish) {
  return stream_chunk(st, "text_completion", {{"index", 0}, {"text", text}, {"logprobs", lp}}, finish);
}

const char* Server::Handlers::text_finish(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    default: return "error";
  }
}

void Server::Handlers::completions(const http::Request& req, http::Response& res) {
  check_draining();
  ojson body = parse_body(req.body);
  CompletionRequest r = parse_completion_request(body);
  check_model(r.model);
  std::vector<int32_t> prompt;
  std::string echo;
  if (auto* text = std::get_if<std::string>(&r.prompt)) {
    // Harmony special tokens written in the text ("<|start|>user<|message|>...") are those
    // tokens, as vLLM and `gptoss generate --prompt` read them.
    prompt = s.tok_.encode(*text, true);
    echo = *text;
    if (prompt.empty()) bad_request("'prompt' encodes to no tokens.", "prompt", "invalid_value");
  } else {
    prompt = std::get<std::vector<int32_t>>(r.prompt);
    for (int32_t id : prompt)
      if (id >= s.engine_.vocab())
        bad_request("Token id " + std::to_string(id) + " is outside the model's vocabulary of " +
                        std::to_string(s.engine_.vocab()) + ".",
                    "prompt", "invalid_value");
    if (r.echo) {
      std::vector<int32_t> ok;
      for (int32_t id : prompt)
        if (size_t(id) < s.tok_.vocab_size()) ok.push_back(id);
      try {
        echo = s.tok_.decode(ok);
      } catch (const std::exception&) {
      }
    }
  }
  finalize(r, prompt.size(), "prompt");
  r.sampling.constraint = s.structured_->for_completion(r);
  // echo with logprobs lists the prompt's tokens too: the engine computes their logprobs.
  if (r.echo && r.logprobs) r.sampling.prompt_logprobs = r.top_logprobs;
  auto rs = submit(prompt, r.sampling);
  auto st = std::make_shared<TextStream>();
  st->rs = rs;
  st->id = make_id("cmpl-");
  st->model = s.opts_.served_model_name;
  st->created = now_s();
  st->include_usage = r.include_usage;
  st->continuous_usage = r.continuous_usage;
  st->logprobs = r.logprobs;
  if (r.echo) {
    st->echo = echo;
    st->echo_pending = true;
    if (r.logprobs) st->first_prompt_token = prompt[0];
  }

  if (!r.stream) {
    struct Acc {
      std::string text;
      std::vector<TokenLogprob> lps;
    };
    auto acc = std::make_shared<Acc>();
    acc->text = st->echo;
    const bool want_lp = r.logprobs;
    respond_when_done(res, rs, [this, st, acc, want_lp](EngineEvent& ev) -> std::optional<json> {
      acc->text += ev.text;
      acc->lps.insert(acc->lps.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
      acc->lps.insert(acc->lps.end(), ev.logprobs.begin(), ev.logprobs.end());
      if (!ev.finished) return std::nullopt;
      if (ev.finish_reason == FinishReason::kError)
        return generation_failed(ev);
      // With echo and logprobs the offsets count from the prompt's first token; with echo
      // alone, from the end of the echoed prompt.
      size_t off = st->first_prompt_token >= 0 ? 0 : count_chars(st->echo);
      json choice = {{"index", 0},
                     {"text", acc->text},
                     {"logprobs", want_lp ? text_logprobs(acc->lps, off, st->first_prompt_token) : json(nullptr)},
                     {"finish_reason", text_finish(ev.finish_reason)}};
      return json{{"id", st->id},       {"object", "text_completion"}, {"created", st->created},
                  {"model", st->model}, {"choices", json::array({choice})},
                  {"usage", usage_json(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens)}};
    });
    return;
  }

  stream_sse(res, st, "text_completion", [this, st](std::string& out) -> std::optional<EngineEvent> {
    if (st->echo_pending && st->first_prompt_token < 0) {
      out += sse(text_chunk(*st, st->echo, nullptr, nullptr));
      st->text_offset = count_chars(st->echo);
      st->echo_pending = false;
    }
    auto ev = st->rs->next(0ms);
    while (ev) {
      if (st->echo_pending) {
        // echo with logprobs: the prompt goes out with its tokens' logprobs, which come with
        // the first generated token.
        json plp = text_logprobs(ev->prompt_logprobs, st->text_offset, st->first_prompt_token);
        out += sse(text_chunk(*st, st->echo, plp, nullptr));
        st->echo_pending = false;
      }
      // A token's logprobs go out with its text: those of tokens whose text the engine holds
      // back (a cut UTF-8 character, a possible stop string) wait for it, and those of tokens
      // with no text (the end token) go with the last chunk.
      st->pending_lps.insert(st->pending_lps.end(), ev->logprobs.begin(), ev->logprobs.end());
      auto take_lps = [&]() -> json {
        if (!st->logprobs || st->pending_lps.empty()) return nullptr;
        json lp = text_logprobs(st->pending_lps, st->text_offset);
        st->pending_lps.clear();
        return lp;
      };
      if (!ev->text.empty()) {
        json ch = text_chunk(*st, ev->text, take_lps(), nullptr);
        if (!st->logprobs) st->text_offset += count_chars(ev->text);
        out += sse_chunk(std::move(ch), st->continuous_usage, *ev);
      }
      if (ev->finished) {
        if (ev->finish_reason == FinishReason::kError)
          out += sse(generation_failed(*ev));
        else
          out += sse_chunk(text_chunk(*st, "", take_lps(), text_finish(ev->finish_reason)), st->continuous_usage, *ev);
        return ev;
      }
      ev = st->rs->next(0ms);
    }
    return std::nullopt;
  });
}

}  // namespace gptoss::server
