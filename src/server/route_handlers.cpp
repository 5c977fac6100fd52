// See route_handlers.h.
#include "server/route_handlers.h"

#include <chrono>
#include <ctime>

#include "common/error.h"

namespace gptoss::server {

using namespace std::chrono_literals;

std::string dumps(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void set_json(http::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dumps(j), "application/json");
}

void set_error(http::Response& res, const ApiError& e) { set_json(res, e.status, error_body(e)); }

int64_t now_s() { return int64_t(std::time(nullptr)); }

std::string token_str(const Tokenizer& tok, int32_t id) {
  if (id < 0 || size_t(id) >= tok.vocab_size()) return "<|unk_" + std::to_string(id) + "|>";
  try {
    return std::string(tok.token_bytes(id));
  } catch (const std::exception&) {
    return "<|unk_" + std::to_string(id) + "|>";
  }
}

json chat_logprob_entry(const Tokenizer& tok, const TokenLogprob& lp) {
  auto one = [&](int32_t id, float v) {
    std::string s = token_str(tok, id);
    json bytes = json::array();
    for (unsigned char c : s) bytes.push_back(int(c));
    return json{{"token", s}, {"logprob", v}, {"bytes", bytes}};
  };
  json e = one(lp.token, lp.logprob);
  json top = json::array();
  for (auto& [id, v] : lp.top) top.push_back(one(id, v));
  e["top_logprobs"] = top;
  return e;
}

// `cached`: prompt tokens whose KV came from the prefix cache (as OpenAI reports them).
json usage_json(int prompt, int completion, int cached) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json delta_json(const ChatDelta& d) {
  json j = json::object();
  if (!d.content.empty()) j["content"] = d.content;
  if (!d.reasoning.empty()) {
    j["reasoning_content"] = d.reasoning;
    j["reasoning"] = d.reasoning;
  }
  if (!d.tool_calls.empty()) {
    json arr = json::array();
    for (const auto& t : d.tool_calls) {
      json c = {{"index", t.index}};
      if (!t.id.empty()) {
        c["id"] = t.id;
        c["type"] = "function";
        c["function"] = {{"name", t.name}, {"arguments", t.arguments}};
      } else {
        c["function"] = {{"arguments", t.arguments}};
      }
      arr.push_back(c);
    }
    j["tool_calls"] = arr;
  }
  return j;
}

std::string sse(const json& j) { return "data: " + dumps(j) + "\n\n"; }

std::string sse_chunk(json chunk, bool continuous_usage, const EngineEvent& ev) {
  if (continuous_usage) chunk["usage"] = usage_json(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens);
  return sse(chunk);
}

const char* chat_finish_reason(FinishReason r, bool tool_calls) {
  switch (r) {
    case FinishReason::kStop: return tool_calls ? "tool_calls" : "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    default: return "error";
  }
}

json generation_failed(const EngineEvent& ev) {
  return error_body(ApiError{500, "Generation failed: " + ev.error, "server_error", "", ""});
}

void Server::Handlers::finalize(CommonRequest& r, size_t prompt_len, const char* param, const char* max_param) {
  const int mml = s.engine_.max_model_len();
  if (int64_t(prompt_len) >= mml)
    throw ApiError{400,
                   "This model's maximum context length is " + std::to_string(mml) + " tokens. However, your prompt has " +
                       std::to_string(prompt_len) + " tokens.",
                   "invalid_request_error", param, "context_length_exceeded"};
  int room = mml - int(prompt_len);
  if (r.max_tokens) {
    if (*r.max_tokens > room)
      throw ApiError{400,
                     "This model's maximum context length is " + std::to_string(mml) + " tokens. However, you requested " +
                         std::to_string(prompt_len + *r.max_tokens) + " tokens (" + std::to_string(prompt_len) +
                         " in the prompt, " + std::to_string(*r.max_tokens) + " for the completion).",
                     "invalid_request_error", max_param, "context_length_exceeded"};
    r.sampling.max_tokens = *r.max_tokens;
  } else {
    r.sampling.max_tokens = room;
  }
  for (int32_t id : r.sampling.stop_token_ids)
    if (id < 0 || id >= s.engine_.vocab())
      throw ApiError{400, "stop_token_ids holds an id outside the vocabulary.", "invalid_request_error",
                     "stop_token_ids", "invalid_value"};
  for (auto [id, bias] : r.sampling.logit_bias)
    if (id < 0 || id >= s.engine_.vocab())
      throw ApiError{400, "logit_bias holds token id " + std::to_string(id) + ", outside the vocabulary.",
                     "invalid_request_error", "logit_bias", "invalid_value"};
}

std::shared_ptr<RequestStream> Server::Handlers::submit(const std::vector<int32_t>& prompt, const SamplingParams& sp) {
  try {
    return s.engine_.submit(prompt, sp);
  } catch (const Error& e) {
    throw ApiError{400, e.what(), "invalid_request_error", "", "invalid_value"};
  }
}

std::vector<int32_t> Server::Handlers::render_prompt(const ChatRequest& r, const char* param) {
  try {
    return render_chat_prompt(s.renderer_, r);
  } catch (ApiError& e) {
    if (e.param == "messages") e.param = param;  // the route's name for the conversation ("input" on /v1/responses)
    throw;
  } catch (const std::exception& e) {
    throw ApiError{400, std::string("Could not render the conversation: ") + e.what(), "invalid_request_error", param,
                   "invalid_value"};
  }
}

void Server::Handlers::respond_when_done(http::Response& res, std::shared_ptr<RequestStream> rs,
                       std::function<std::optional<json>(EngineEvent&)> step) {
  res.defer("application/json",
            std::make_shared<EngineBody>(s, rs, [rs, step](std::string& out, EngineBody& body) {
              while (auto ev = rs->next(0ms)) {
                body.token_counts = {ev->prompt_tokens, ev->completion_tokens};
                if (auto j = step(*ev)) {
                  if (j->contains("error")) body.status_code = 500;  // generation failed
                  out = dumps(*j);
                  return true;
                }
              }
              return false;
            }));
}

}  // namespace gptoss::server
