// /v1/responses (the OpenAI Responses API) and its stored responses (GET, DELETE).
#include "server/route_handlers.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "server/response_store.h"
#include "server/responses_format.h"
#include "server/structured_output.h"

namespace gptoss::server {

using namespace std::chrono_literals;

// /v1/responses: the conversation (stored turns of previous_response_id, then this input)
// becomes a chat request, rendered and mapped back through the chat path's harmony code; a
// ResponseBuilder turns the mapped output into items and events.
struct Server::Handlers::ResponsesStream {
  std::shared_ptr<RequestStream> rs;
  std::unique_ptr<ChatOutputMapper> mapper;
  std::unique_ptr<ResponseBuilder> builder;
  ojson items;  // the whole conversation as items, for the store
  bool store = false, started = false;
  int prompt_tokens = 0;
};

// Feeds one engine event; true once the response is finished (and stored, when asked).
bool Server::Handlers::responses_step(ResponsesStream& st, const EngineEvent& ev) {
  for (int32_t t : ev.tokens) {
    ChatDelta d = st.mapper->push(t);
    if (!d.reasoning.empty()) st.builder->count_reasoning_token();
    st.builder->push(d);
  }
  if (!ev.finished) return false;
  st.builder->push(st.mapper->finish());
  st.builder->finish(ev.finish_reason, st.prompt_tokens, ev.completion_tokens, ev.error);
  if (st.store && ev.finish_reason != FinishReason::kError && ev.finish_reason != FinishReason::kAbort) {
    ojson resp = st.builder->response();
    for (const auto& item : st.builder->output()) st.items.push_back(item);
    try {
      s.store_->put(resp["id"].get<std::string>(), StoredResponse{json::parse(resp.dump()), st.items});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gptoss serve: could not store response %s: %s\n", resp["id"].get<std::string>().c_str(),
                   e.what());
    }
  }
  return true;
}

void Server::Handlers::responses(const http::Request& req, http::Response& res) {
  check_draining();
  ojson body = parse_body(req.body);
  ResponsesRequest r = parse_responses_request(body);
  check_model(r.chat.model);
  ChatRequest& c = r.chat;
  auto st = std::make_shared<ResponsesStream>();
  st->items = ojson::array();
  if (r.previous_response_id) {
    std::optional<StoredResponse> prev = s.store_->get(*r.previous_response_id);
    if (!prev)
      throw ApiError{404, "Previous response with id '" + *r.previous_response_id + "' not found.",
                     "invalid_request_error", "previous_response_id", "previous_response_not_found"};
    st->items = prev->items;
    std::vector<ChatMessage> earlier = responses_items_to_messages(prev->items, "previous_response_id");
    c.messages.insert(c.messages.begin(), earlier.begin(), earlier.end());
  }
  for (const auto& it : r.input_items) st->items.push_back(it);
  if (r.instructions && !r.instructions->empty()) {
    ChatMessage dev;
    dev.role = "developer";
    dev.content = *r.instructions;
    c.messages.insert(c.messages.begin(), dev);
  }
  const std::vector<int32_t> prompt = render_prompt(c, "input");
  finalize(c, prompt.size(), "input", "max_output_tokens");
  // text.format and the tools' parameters: the same constraint as chat's response_format.
  c.sampling.constraint = s.structured_->for_chat(c, "text.format");
  const bool plain_output = c.sampling.constraint && s.structured_->whole_output();
  st->rs = submit(prompt, c.sampling);
  st->mapper = std::make_unique<ChatOutputMapper>(s.tok_, plain_output);
  st->store = r.store;
  st->prompt_tokens = int(prompt.size());
  ojson base = {{"id", make_id("resp_")},
                {"object", "response"},
                {"created_at", now_s()},
                {"status", "in_progress"},
                {"background", false},
                {"error", nullptr},
                {"incomplete_details", nullptr},
                {"instructions", r.echo["instructions"]},
                {"max_output_tokens", r.echo.value("max_output_tokens", ojson(nullptr))},
                {"model", s.opts_.served_model_name},
                {"output", ojson::array()},
                {"parallel_tool_calls", r.echo["parallel_tool_calls"]},
                {"previous_response_id", r.echo["previous_response_id"]},
                {"reasoning", r.echo["reasoning"]},
                {"store", r.store},
                {"temperature", c.sampling.temperature},
                {"text", r.echo["text"]},
                {"tool_choice", r.echo["tool_choice"]},
                {"tools", r.echo["tools"]},
                {"top_p", c.sampling.top_p},
                {"truncation", "disabled"},
                {"usage", nullptr},
                {"user", r.echo.value("user", ojson(nullptr))},
                {"metadata", r.echo.value("metadata", ojson::object())}};
  st->builder = std::make_unique<ResponseBuilder>(std::move(base), c.stream);

  if (!c.stream) {
    res.defer("application/json", std::make_shared<EngineBody>(s, st->rs, [this, st](std::string& out, EngineBody& b) {
      while (auto ev = st->rs->next(0ms)) {
        b.token_counts = {ev->prompt_tokens, ev->completion_tokens};
        if (!responses_step(*st, *ev)) continue;
        if (ev->finish_reason == FinishReason::kError) {
          b.status_code = 500;
          out = dumps(generation_failed(*ev));
        } else {
          out = st->builder->response().dump(-1, ' ', false, ojson::error_handler_t::replace);
        }
        return true;
      }
      return false;
    }));
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.stream("text/event-stream", std::make_shared<EngineBody>(s, st->rs, [this, st](std::string& out, EngineBody& b) {
    if (!st->started) {
      st->started = true;
      st->builder->start();
    }
    bool done = false;
    while (auto ev = st->rs->next(0ms)) {
      b.token_counts = {ev->prompt_tokens, ev->completion_tokens};
      if ((done = responses_step(*st, *ev))) break;
    }
    out += st->builder->take_events();
    return done;
  }));
}

ApiError Server::Handlers::response_not_found(const std::string& id) {
  return ApiError{404, "No response found with id '" + id + "'.", "invalid_request_error", "response_id", "not_found"};
}

void Server::Handlers::get_response(const http::Request& req, http::Response& res) {
  if (const size_t slash = req.path_param.find('/'); slash != std::string::npos) {
    if (req.path_param.substr(slash) == "/input_items")
      throw ApiError{404, "GET /v1/responses/{id}/input_items is not implemented by this server; GET /v1/responses/{id} "
                          "answers the response itself.",
                     "invalid_request_error", "", "not_implemented"};
    throw ApiError{404, "Not found: GET " + req.path, "invalid_request_error", "", "not_found"};
  }
  std::optional<StoredResponse> r = s.store_->get(req.path_param);
  if (!r) throw response_not_found(req.path_param);
  set_json(res, 200, r->response);
}

void Server::Handlers::delete_response(const http::Request& req, http::Response& res) {
  if (!s.store_->remove(req.path_param)) throw response_not_found(req.path_param);
  set_json(res, 200, {{"id", req.path_param}, {"object", "response.deleted"}, {"deleted", true}});
}

}  // namespace gptoss::server
