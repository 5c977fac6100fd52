// /v1/chat/completions: the conversation rendered in harmony, the model's output mapped back to
// content, reasoning and tool calls, answered whole or streamed.
#include "server/route_handlers.h"

#include <chrono>
#include <string>
#include <vector>

#include "server/structured_output.h"

namespace gptoss::server {

using namespace std::chrono_literals;

struct Server::Handlers::ChatStream {
  std::shared_ptr<RequestStream> rs;
  std::unique_ptr<ChatOutputMapper> mapper;
  std::string id, model;
  int64_t created = 0;
  bool include_usage = false, continuous_usage = false, logprobs = false;
  bool started = false, done = false;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  std::unique_ptr<StopMatcher> stops;  // stop strings, on the content only
  json pending_lps = json::array();    // logprobs of tokens whose text has not been sent yet
};

json Server::Handlers::chat_chunk(const ChatStream& st, const json& delta, const json& logprobs, const char* finish) {
  return stream_chunk(st, "chat.completion.chunk", {{"index", 0}, {"delta", delta}, {"logprobs", logprobs}}, finish);
}

void Server::Handlers::chat(const http::Request& req, http::Response& res) {
  check_draining();
  ojson body = parse_body(req.body);
  ChatRequest r = parse_chat_request(body);
  check_model(r.model);
  const std::vector<int32_t> prompt = render_prompt(r, "messages");
  finalize(r, prompt.size(), "messages");
  r.sampling.constraint = s.structured_->for_chat(r);
  const bool plain_output = r.sampling.constraint && s.structured_->whole_output();
  // Chat stop strings apply to the visible content, not to harmony headers or reasoning: the
  // server matches them and cancels the request.
  std::vector<std::string> stop_strings = std::move(r.sampling.stop);
  r.sampling.stop.clear();
  auto rs = submit(prompt, r.sampling);
  auto st = std::make_shared<ChatStream>();
  st->stops = std::make_unique<StopMatcher>(std::move(stop_strings));
  st->rs = rs;
  st->mapper = std::make_unique<ChatOutputMapper>(s.tok_, plain_output);
  st->id = make_id("chatcmpl-");
  st->model = s.opts_.served_model_name;
  st->created = now_s();
  st->include_usage = r.include_usage;
  st->continuous_usage = r.continuous_usage;
  st->logprobs = r.logprobs;
  st->prompt_tokens = int(prompt.size());

  if (!r.stream) {
    struct Acc {
      json lps = json::array();
      std::string content;
    };
    auto acc = std::make_shared<Acc>();
    const bool want_lp = r.logprobs;
    respond_when_done(res, rs, [this, st, acc, want_lp](EngineEvent& ev) -> std::optional<json> {
      ChatDelta d;
      for (size_t i = 0; i < ev.tokens.size(); ++i) {
        d.append(st->mapper->push(ev.tokens[i]));
        if (i < ev.logprobs.size()) acc->lps.push_back(chat_logprob_entry(s.tok_, ev.logprobs[i]));
      }
      if (ev.finished) d.append(st->mapper->finish());
      acc->content += st->stops->feed(d.content);
      FinishReason reason = ev.finish_reason;
      if (st->stops->matched()) {
        st->rs->cancel();
        reason = FinishReason::kStop;
      } else if (ev.finished) {
        acc->content += st->stops->flush();
      } else {
        return std::nullopt;
      }
      if (reason == FinishReason::kError)
        return generation_failed(ev);
      json msg = {{"role", "assistant"}};
      msg["content"] = acc->content.empty() && st->mapper->has_tool_calls() ? json(nullptr) : json(acc->content);
      if (!st->mapper->reasoning().empty()) {
        msg["reasoning_content"] = st->mapper->reasoning();
        msg["reasoning"] = st->mapper->reasoning();
      }
      if (st->mapper->has_tool_calls()) {
        json calls = json::array();
        for (const auto& c : st->mapper->tool_calls())
          calls.push_back(
              {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        msg["tool_calls"] = calls;
      }
      json choice = {{"index", 0},
                     {"message", msg},
                     {"logprobs", want_lp ? json{{"content", acc->lps}} : json(nullptr)},
                     {"finish_reason", chat_finish_reason(reason, st->mapper->has_tool_calls())}};
      return json{{"id", st->id},       {"object", "chat.completion"}, {"created", st->created},
                  {"model", st->model}, {"choices", json::array({choice})},
                  {"usage", usage_json(st->prompt_tokens, ev.completion_tokens, ev.cached_tokens)}};
    });
    return;
  }

  stream_sse(res, st, "chat.completion.chunk", [this, st](std::string& out) -> std::optional<EngineEvent> {
    if (!st->started) {
      st->started = true;
      out += sse(chat_chunk(*st, json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
    }
    auto ev = st->rs->next(0ms);
    while (ev) {
      ChatDelta d;
      for (size_t i = 0; i < ev->tokens.size(); ++i) {
        d.append(st->mapper->push(ev->tokens[i]));
        if (st->logprobs && i < ev->logprobs.size())
          st->pending_lps.push_back(chat_logprob_entry(s.tok_, ev->logprobs[i]));
      }
      if (ev->finished) d.append(st->mapper->finish());
      st->completion_tokens = ev->completion_tokens;
      d.content = st->stops->feed(d.content);
      if (st->stops->matched()) {
        // A stop string in the content: end here with "stop".
        st->rs->cancel();
        ev->finished = true;
        ev->finish_reason = FinishReason::kStop;
        ev->prompt_tokens = st->prompt_tokens;
      } else if (ev->finished) {
        d.content += st->stops->flush();
      }
      // A token's logprobs go out with its text: those of tokens whose text is still held
      // back (a harmony header, a possible stop string) wait for it; those of tokens that
      // show no text at all (headers, the end token) go with the next text or the last chunk.
      auto take_lps = [&]() -> json {
        if (!st->logprobs || st->pending_lps.empty()) return nullptr;
        json lp = {{"content", std::move(st->pending_lps)}};
        st->pending_lps = json::array();
        return lp;
      };
      if (!d.empty()) out += sse_chunk(chat_chunk(*st, delta_json(d), take_lps(), nullptr), st->continuous_usage, *ev);
      if (ev->finished) {
        if (ev->finish_reason == FinishReason::kError)
          out += sse(generation_failed(*ev));
        else
          out += sse_chunk(chat_chunk(*st, json::object(), take_lps(),
                                      chat_finish_reason(ev->finish_reason, st->mapper->has_tool_calls())),
                           st->continuous_usage, *ev);
        return ev;
      }
      ev = st->rs->next(0ms);
    }
    return std::nullopt;
  });
}

}  // namespace gptoss::server
