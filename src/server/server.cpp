#include "server/server.h"

#include <sys/time.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

#include "common/error.h"
#include "server/chat_format.h"
#include "server/http/http_server.h"
#include "server/openai_api.h"
#include "server/structured_output.h"
#include "server/response_store.h"
#include "server/responses_format.h"

namespace gptoss::server {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::vector<int32_t> default_stop_tokens(const Tokenizer& tok, const GptOssConfig& c) {
  std::vector<int32_t> ids;
  for (const char* name : {"<|return|>", "<|call|>"})
    if (auto id = tok.token_id(name); id && *id < c.vocab) ids.push_back(*id);
  if (c.eos_token_id >= 0 && c.eos_token_id < c.vocab &&
      std::find(ids.begin(), ids.end(), c.eos_token_id) == ids.end())
    ids.push_back(c.eos_token_id);
  return ids;
}

std::function<std::string(int32_t)> token_text_fn(const Tokenizer& tok) {
  return [tok](int32_t id) -> std::string {
    if (id < 0 || size_t(id) >= tok.vocab_size()) return {};
    try {
      if (tok.is_special(id)) return {};
      return std::string(tok.token_bytes(id));
    } catch (const std::exception&) {
      return {};
    }
  };
}

namespace {

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

const char* chat_finish_reason(FinishReason r, bool tool_calls) {
  switch (r) {
    case FinishReason::kStop: return tool_calls ? "tool_calls" : "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    default: return "error";
  }
}

}  // namespace

struct Server::Handlers {
  Server& s;

  void check_model(const std::string& model) {
    if (!model.empty() && model != s.opts_.served_model_name)
      throw ApiError{404, "The model `" + model + "` does not exist.", "invalid_request_error", "model",
                     "model_not_found"};
  }

  void check_draining() {
    if (s.draining_) throw ApiError{503, "The server is shutting down.", "service_unavailable", "", "shutting_down"};
  }

  // Fills max_tokens and checks the context length.
  void finalize(CommonRequest& r, size_t prompt_len, const char* param, const char* max_param = "max_tokens") {
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

  std::shared_ptr<RequestStream> submit(const std::vector<int32_t>& prompt, const SamplingParams& sp) {
    try {
      return s.engine_.submit(prompt, sp);
    } catch (const Error& e) {
      throw ApiError{400, e.what(), "invalid_request_error", "", "invalid_value"};
    }
  }

  // A response body that follows one engine request. The connection pulls it on its I/O
  // thread whenever the engine has queued events (the engine only posts a wake-up, it never
  // waits on a socket); `fill` turns the queued events into bytes without waiting. A client
  // that goes away, is too slow for too long, or a server that stops, cancels the request.
  struct EngineBody : http::BodySource {
    Server& srv;
    std::shared_ptr<RequestStream> rs;
    std::function<bool(std::string&, EngineBody&)> fill;  // true once the body is complete
    bool done = false, finished = false;
    int status_code = 200;
    std::pair<int, int> token_counts{-1, -1};

    EngineBody(Server& s, std::shared_ptr<RequestStream> r, std::function<bool(std::string&, EngineBody&)> f)
        : srv(s), rs(std::move(r)), fill(std::move(f)) {
      ++srv.streams_open_;
    }
    ~EngineBody() override {
      if (!finished) finish(false);
    }
    void start(std::function<void()> wake) override { rs->set_listener(std::move(wake)); }
    bool pull(std::string& out) override {
      if (!done) done = fill(out, *this);
      return done;
    }
    void finish(bool delivered) override {
      if (finished) return;
      finished = true;
      rs->set_listener(nullptr);
      if (!delivered || !done) {
        rs->cancel();
        ++srv.client_disconnects_;
      }
      --srv.streams_open_;
    }
    std::pair<int, int> tokens() const override { return token_counts; }
    int status() const override { return status_code; }
  };

  // Answers a non-streamed request once `step` returns the body. Meanwhile the connection
  // watches its client, and one that goes away cancels the request.
  void respond_when_done(http::Response& res, std::shared_ptr<RequestStream> rs,
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

  // The SSE plumbing shared by chat and text streams. `fill(out)` appends this round's chunks
  // (from the events queued so far, without waiting) and, once the request has finished, its
  // finishing chunk, returning the finishing event; this adds the usage chunk and [DONE].
  template <class Stream, class Fill>
  void stream_sse(http::Response& res, std::shared_ptr<Stream> st, const char* object, Fill fill) {
    res.set_header("Cache-Control", "no-cache");
    res.stream("text/event-stream",
               std::make_shared<EngineBody>(s, st->rs, [st, object, fill](std::string& out, EngineBody& body) {
                 if (std::optional<EngineEvent> last = fill(out)) {
                   body.token_counts = {last->prompt_tokens, last->completion_tokens};
                   if (st->include_usage) {
                     json u = {{"id", st->id},       {"object", object}, {"created", st->created},
                               {"model", st->model}, {"choices", json::array()},
                               {"usage", usage_json(last->prompt_tokens, last->completion_tokens, last->cached_tokens)}};
                     out += sse(u);
                   }
                   out += "data: [DONE]\n\n";
                   st->done = true;
                 }
                 return st->done;
               }));
  }

  // ---------------------------------------------------------------- chat
  struct ChatStream {
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

  // One streamed chunk of a chat or text stream (both carry id, created, model, include_usage):
  // a single choice, plus "usage": null while a usage chunk is still to come.
  template <typename Stream>
  static json stream_chunk(const Stream& st, const char* object, json choice, const char* finish) {
    choice["finish_reason"] = finish ? json(finish) : json(nullptr);
    json j = {{"id", st.id}, {"object", object}, {"created", st.created}, {"model", st.model},
              {"choices", json::array({choice})}};
    if (st.include_usage) j["usage"] = nullptr;
    return j;
  }

  json chat_chunk(const ChatStream& st, const json& delta, const json& logprobs, const char* finish) {
    return stream_chunk(st, "chat.completion.chunk", {{"index", 0}, {"delta", delta}, {"logprobs", logprobs}}, finish);
  }

  void chat(const http::Request& req, http::Response& res) {
    check_draining();
    ojson body = parse_body(req.body);
    ChatRequest r = parse_chat_request(body);
    check_model(r.model);
    std::vector<int32_t> prompt;
    try {
      prompt = render_chat_prompt(s.renderer_, r);
    } catch (const ApiError&) {
      throw;
    } catch (const std::exception& e) {
      throw ApiError{400, std::string("Could not render the conversation: ") + e.what(), "invalid_request_error",
                     "messages", "invalid_value"};
    }
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
          return error_body(ApiError{500, "Generation failed: " + ev.error, "server_error", "", ""});
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
        if (!d.empty()) {
          json ch = chat_chunk(*st, delta_json(d), take_lps(), nullptr);
          if (st->continuous_usage) ch["usage"] = usage_json(ev->prompt_tokens, ev->completion_tokens, ev->cached_tokens);
          out += sse(ch);
        }
        if (ev->finished) {
          if (ev->finish_reason == FinishReason::kError) {
            out += sse(error_body(ApiError{500, "Generation failed: " + ev->error, "server_error", "", ""}));
          } else {
            json ch = chat_chunk(*st, json::object(), take_lps(),
                                 chat_finish_reason(ev->finish_reason, st->mapper->has_tool_calls()));
            if (st->continuous_usage) ch["usage"] = usage_json(ev->prompt_tokens, ev->completion_tokens, ev->cached_tokens);
            out += sse(ch);
          }
          return ev;
        }
        ev = st->rs->next(0ms);
      }
      return std::nullopt;
    });
  }

  // ---------------------------------------------------------------- completions
  struct TextStream {
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
  static size_t count_chars(std::string_view b) {
    size_t n = 0;
    for (unsigned char c : b) n += (c & 0xC0) != 0x80;
    return n;
  }

  // The completions logprobs object of `lps`, preceded (first_token >= 0) by a prompt's first
  // token, which has no logprob (null, as OpenAI writes it). Advances `offset`.
  json text_logprobs(const std::vector<TokenLogprob>& lps, size_t& offset, int32_t first_token = -1) {
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

  json text_chunk(const TextStream& st, const std::string& text, const json& lp, const char* finish) {
    return stream_chunk(st, "text_completion", {{"index", 0}, {"text", text}, {"logprobs", lp}}, finish);
  }

  static const char* text_finish(FinishReason r) {
    switch (r) {
      case FinishReason::kStop: return "stop";
      case FinishReason::kLength: return "length";
      case FinishReason::kAbort: return "abort";
      default: return "error";
    }
  }

  void completions(const http::Request& req, http::Response& res) {
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
          return error_body(ApiError{500, "Generation failed: " + ev.error, "server_error", "", ""});
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
          if (st->continuous_usage) ch["usage"] = usage_json(ev->prompt_tokens, ev->completion_tokens, ev->cached_tokens);
          out += sse(ch);
        }
        if (ev->finished) {
          if (ev->finish_reason == FinishReason::kError)
            out += sse(error_body(ApiError{500, "Generation failed: " + ev->error, "server_error", "", ""}));
          else {
            json ch = text_chunk(*st, "", take_lps(), text_finish(ev->finish_reason));
            if (st->continuous_usage) ch["usage"] = usage_json(ev->prompt_tokens, ev->completion_tokens, ev->cached_tokens);
            out += sse(ch);
          }
          return ev;
        }
        ev = st->rs->next(0ms);
      }
      return std::nullopt;
    });
  }

  // ---------------------------------------------------------------- responses
  // /v1/responses: the conversation (stored turns of previous_response_id, then this input)
  // becomes a chat request, rendered and mapped back through the chat path's harmony code; a
  // ResponseBuilder turns the mapped output into items and events.
  struct ResponsesStream {
    std::shared_ptr<RequestStream> rs;
    std::unique_ptr<ChatOutputMapper> mapper;
    std::unique_ptr<ResponseBuilder> builder;
    ojson items;  // the whole conversation as items, for the store
    bool store = false, started = false;
    int prompt_tokens = 0;
  };

  // Feeds one engine event; true once the response is finished (and stored, when asked).
  bool responses_step(ResponsesStream& st, const EngineEvent& ev) {
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

  void responses(const http::Request& req, http::Response& res) {
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
    std::vector<int32_t> prompt;
    try {
      prompt = render_chat_prompt(s.renderer_, c);
    } catch (const ApiError&) {
      throw;
    } catch (const std::exception& e) {
      throw ApiError{400, std::string("Could not render the conversation: ") + e.what(), "invalid_request_error",
                     "input", "invalid_value"};
    }
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
            out = dumps(error_body(ApiError{500, "Generation failed: " + ev->error, "server_error", "", ""}));
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

  ApiError response_not_found(const std::string& id) {
    return ApiError{404, "No response found with id '" + id + "'.", "invalid_request_error", "response_id", "not_found"};
  }

  void get_response(const http::Request& req, http::Response& res) {
    std::optional<StoredResponse> r = s.store_->get(req.path_param);
    if (!r) throw response_not_found(req.path_param);
    set_json(res, 200, r->response);
  }

  void delete_response(const http::Request& req, http::Response& res) {
    if (!s.store_->remove(req.path_param)) throw response_not_found(req.path_param);
    set_json(res, 200, {{"id", req.path_param}, {"object", "response.deleted"}, {"deleted", true}});
  }

  // ---------------------------------------------------------------- small endpoints
  json model_card() {
    return {{"id", s.opts_.served_model_name}, {"object", "model"},     {"created", s.created_},
            {"owned_by", "gptoss"},            {"root", s.opts_.served_model_name},
            {"max_model_len", s.engine_.max_model_len()}};
  }

  // vLLM's /tokenize: {"prompt"} or {"messages", ...} -> {"count", "max_model_len", "tokens",
  // "token_strs"}; token_strs (with return_token_strs) spells tokens as convert_ids_to_tokens does.
  void tokenize(const http::Request& req, http::Response& res) {
    ojson body = parse_body(req.body);
    TokenizeRequest r = parse_tokenize_request(body);
    if (const auto m = body.find("model"); m != body.end() && m->is_string()) check_model(m->get<std::string>());
    std::vector<int32_t> ids;
    if (r.chat) {
      harmony::Conversation c = build_conversation(*r.chat);
      ids = r.add_generation_prompt ? s.renderer_.render_for_completion(c, harmony::Role::Assistant)
                                    : s.renderer_.render_conversation(c);
    } else {
      ids = s.tok_.encode(*r.prompt, true);  // special tokens spelled in the text, as /v1/completions reads them
    }
    json out = {{"count", ids.size()}, {"max_model_len", s.engine_.max_model_len()}, {"tokens", ids}};
    if (r.return_token_strs) {
      json strs = json::array();
      for (int32_t id : ids) strs.push_back(s.tok_.token_piece(id));
      out["token_strs"] = strs;
    } else {
      out["token_strs"] = nullptr;
    }
    set_json(res, 200, out);
  }

  // vLLM's /detokenize: {"tokens"} -> {"prompt"}.
  void detokenize(const http::Request& req, http::Response& res) {
    ojson body = parse_body(req.body);
    DetokenizeRequest r = parse_detokenize_request(body);
    if (const auto m = body.find("model"); m != body.end() && m->is_string()) check_model(m->get<std::string>());
    for (int32_t id : r.tokens)
      if (!s.tok_.has_token(id))
        bad_request("Token id " + std::to_string(id) + " is not in the vocabulary.", "tokens", "invalid_value");
    set_json(res, 200, {{"prompt", s.tok_.decode(r.tokens)}});
  }
};

Server::Server(Engine& engine, const Tokenizer& tok, ServerOptions opts)
    : engine_(engine), tok_(tok), renderer_(tok), opts_(std::move(opts)) {
  structured_ = std::make_unique<StructuredOutput>(tok_, opts_.harmony_output);
  created_ = now_s();
  store_ = std::make_unique<ResponseStore>(opts_.response_store);
  setup_routes();
}

Server::~Server() = default;

namespace {

// "2026-11-30T15:03:30.123Z"
std::string utc_timestamp() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm t{};
  gmtime_r(&tv.tv_sec, &t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                t.tm_hour, t.tm_min, t.tm_sec, int(tv.tv_usec / 1000));
  return buf;
}

// An error the transport answers itself (404, 405, 413, 503 past the connection cap, ...).
http::Response transport_error(int status, const std::string& message) {
  ApiError e;
  e.status = status;
  e.message = message;
  switch (status) {
    case 404: e.code = "not_found"; break;
    case 405: e.code = "method_not_allowed"; break;
    case 408: e.code = "request_timeout"; break;
    case 413: e.code = "request_too_large"; break;
    case 431: e.code = "request_header_fields_too_large"; break;
    case 503: e.type = "service_unavailable"; e.code = "too_many_connections"; break;
    default: break;
  }
  if (status >= 500 && e.type == "invalid_request_error") e.type = "server_error";
  http::Response res;
  set_error(res, e);
  return res;
}

}  // namespace

void Server::setup_routes() {
  auto h = std::make_shared<Handlers>(Handlers{*this});
  http::HttpOptions ho;
  ho.host = opts_.host;
  ho.port = opts_.port;
  ho.io_threads = opts_.http_threads > 0 ? opts_.http_threads : 2;
  ho.worker_threads = ho.io_threads;
  ho.max_body_bytes = opts_.max_body_bytes;
  ho.max_connections = opts_.max_connections;
  ho.idle_timeout_s = opts_.idle_timeout_s;
  ho.read_timeout_s = opts_.read_timeout_s;
  ho.write_timeout_s = opts_.write_timeout_s;
  ho.allowed_origins = opts_.allowed_origins;
  ho.error_response = transport_error;

  // /v1/* needs the API key when one is set (CORS preflights excepted: browsers send none).
  ho.filter = [this](const http::Request& req, http::Response& res) {
    if (opts_.api_key.empty() || req.path.rfind("/v1", 0) != 0) return false;
    std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + opts_.api_key) return false;
    if (auth.empty())
      set_error(res, ApiError{401,
                              "You didn't provide an API key. You need to provide your API key in an Authorization "
                              "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                              "invalid_request_error", "", "invalid_api_key"});
    else
      set_error(res, ApiError{401, "Incorrect API key provided.", "invalid_request_error", "", "invalid_api_key"});
    return true;
  };

  // Counts every answer, and with --log-requests logs it: time, client, request, status,
  // latency (request received -> last byte written), tokens in/out.
  ho.on_complete = [this](const http::Completion& c) {
    ++http_requests_;
    if (c.status >= 400) ++http_errors_;
    if (!opts_.log_requests) return;
    std::string tokens;
    if (c.tokens.first >= 0)
      tokens = " in=" + std::to_string(c.tokens.first) + " out=" + std::to_string(std::max(0, c.tokens.second));
    std::fprintf(stderr, "%s %s \"%s %s\" %d %.3fs%s%s\n", utc_timestamp().c_str(), c.request->remote.c_str(),
                 c.request->method.c_str(), c.request->target.c_str(), c.status, c.seconds, tokens.c_str(),
                 c.delivered ? "" : " (client gone: request cancelled)");
  };
  http_ = std::make_unique<http::HttpServer>(ho);

  // Wraps a handler: OpenAI error objects for ApiError and anything else.
  auto wrap = [](std::function<void(const http::Request&, http::Response&)> f) {
    return [f](const http::Request& req, http::Response& res) {
      try {
        f(req, res);
      } catch (const ApiError& e) {
        set_error(res, e);
      } catch (const Error& e) {
        set_error(res, ApiError{400, e.what(), "invalid_request_error", "", ""});
      } catch (const std::exception& e) {
        set_error(res, ApiError{500, std::string("Internal error: ") + e.what(), "server_error", "", ""});
      }
    };
  };
  // Handlers that parse bodies and tokenize run on worker threads, the rest on the event loop.
  const bool offload = true;
  // Every route is registered through here, so routes() lists them all (tests walk it).
  auto add_route = [this](const std::string& method, const std::string& path, http::Handler handler,
                          bool off = false) {
    routes_.push_back({method, path});
    http_->route(method, path, std::move(handler), off);
  };

  add_route("GET", "/health", wrap([this](const http::Request&, http::Response& res) {
    if (draining_) set_json(res, 503, {{"status", "draining"}});
    else set_json(res, 200, {{"status", "ok"}});
  }));
  add_route("GET", "/v1/models", wrap([h](const http::Request&, http::Response& res) {
    set_json(res, 200, {{"object", "list"}, {"data", json::array({h->model_card()})}});
  }));
  add_route("GET", "/v1/models/*", wrap([h, this](const http::Request& req, http::Response& res) {
    if (req.path_param != opts_.served_model_name)
      throw ApiError{404, "The model `" + req.path_param + "` does not exist.", "invalid_request_error", "model",
                     "model_not_found"};
    set_json(res, 200, h->model_card());
  }));
  add_route("POST", "/v1/chat/completions", wrap([h](const http::Request& q, http::Response& r) { h->chat(q, r); }), offload);
  add_route("POST", "/v1/completions", wrap([h](const http::Request& q, http::Response& r) { h->completions(q, r); }), offload);
  add_route("POST", "/v1/responses", wrap([h](const http::Request& q, http::Response& r) { h->responses(q, r); }), offload);
  // Stored responses: SQLite reads and deletes, off the event loop.
  add_route("GET", "/v1/responses/*", wrap([h](const http::Request& q, http::Response& r) { h->get_response(q, r); }), offload);
  add_route("DELETE", "/v1/responses/*", wrap([h](const http::Request& q, http::Response& r) { h->delete_response(q, r); }), offload);
  add_route("POST", "/tokenize", wrap([h](const http::Request& q, http::Response& r) { h->tokenize(q, r); }), offload);
  add_route("POST", "/detokenize", wrap([h](const http::Request& q, http::Response& r) { h->detokenize(q, r); }), offload);
  add_route("GET", "/metrics", [this](const http::Request&, http::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });

  // A throughput line every log_stats_interval_s while there is something to report (vLLM's).
  if (opts_.log_stats_interval_s > 0) {
    struct Last {
      int64_t prompt = 0, gen = 0;
      std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
    };
    auto last = std::make_shared<Last>();
    http_->every(std::chrono::seconds(opts_.log_stats_interval_s), [this, last] {
      EngineMetrics& m = engine_.metrics();
      EngineStats st = engine_.stats();
      int64_t prompt = m.prompt_tokens, gen = m.generation_tokens;
      auto now = std::chrono::steady_clock::now();
      double dt = std::chrono::duration<double>(now - last->t).count();
      bool idle = prompt == last->prompt && gen == last->gen && st.running == 0 && st.waiting == 0;
      if (!idle && dt > 0)
        std::fprintf(stderr,
                     "%s Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d "
                     "reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Open streams: %lld\n",
                     utc_timestamp().c_str(), double(prompt - last->prompt) / dt, double(gen - last->gen) / dt,
                     st.running, st.waiting, 100.0 * st.kv_usage, (long long)streams_open_.load());
      last->prompt = prompt;
      last->gen = gen;
      last->t = now;
    });
  }
}

std::string Server::metrics_text() const {
  EngineStats st = engine_.stats();
  EngineMetrics& m = engine_.metrics();
  std::string out;
  // Label values escape \\, " and newlines (Prometheus text format).
  std::string model_label = "model_name=\"";
  for (char c : opts_.served_model_name)
    model_label += c == '\\' ? std::string("\\\\") : c == '"' ? std::string("\\\"") : c == '\n' ? std::string("\\n") : std::string(1, c);
  model_label += "\"";
  const std::string lbl = "{" + model_label + "}";
  auto gauge = [&](const std::string& name, const std::string& help, double v, const char* type = "gauge") {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + lbl + " " + buf + "\n";
  };
  gauge("gptoss:num_requests_running", "Requests in the running batch.", st.running);
  gauge("gptoss:num_requests_waiting", "Requests waiting for a slot or KV memory.", st.waiting);
  gauge("gptoss:kv_cache_usage_perc", "Fraction of KV-cache pages in use (the fuller pool).", st.kv_usage);
  gauge("gptoss:kv_cache_pages_used_full", "KV pages in use, full-attention pool.", st.kv_pages_used[0]);
  gauge("gptoss:kv_cache_pages_total_full", "KV pages, full-attention pool.", st.kv_pages_total[0]);
  gauge("gptoss:kv_cache_pages_used_sliding", "KV pages in use, sliding-window pool.", st.kv_pages_used[1]);
  gauge("gptoss:kv_cache_pages_total_sliding", "KV pages, sliding-window pool.", st.kv_pages_total[1]);
  gauge("gptoss:prompt_tokens_total", "Prompt tokens of requests (each counted once; recomputes after preemption not again).", double(m.prompt_tokens), "counter");
  gauge("gptoss:generation_tokens_total", "Tokens generated.", double(m.generation_tokens), "counter");
  gauge("gptoss:request_finished_total", "Requests finished (any reason).", double(m.requests_finished), "counter");
  gauge("gptoss:request_aborted_total", "Requests cancelled (client gone or shutdown).", double(m.requests_aborted), "counter");
  gauge("gptoss:num_preemptions_total", "Sequences preempted for KV memory.", double(m.preemptions), "counter");
  gauge("gptoss:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache at admission.",
        double(m.prefix_cache_queries), "counter");
  gauge("gptoss:prefix_cache_hits_total", "Prompt tokens found in the prefix cache (their prefill skipped).",
        double(m.prefix_cache_hits), "counter");
  gauge("gptoss:engine_steps_total", "Forward passes run.", double(m.steps), "counter");
  gauge("gptoss:spec_decode_num_draft_tokens_total", "Speculative draft tokens verified.", double(m.spec_draft_tokens),
        "counter");
  gauge("gptoss:spec_decode_num_accepted_tokens_total", "Speculative draft tokens accepted.",
        double(m.spec_accepted_tokens), "counter");
  gauge("gptoss:spec_decode_num_gated_tokens_total",
        "Speculative draft tokens proposed but not verified: their rows would cost the pass more than they return.",
        double(m.spec_gated_tokens), "counter");
  gauge("gptoss:spec_decode_draft_seconds_total", "Time the drafter took (proposals and Eagle3 head commits).",
        double(m.spec_draft_us) * 1e-6, "counter");
  gauge("gptoss:http_requests_total", "HTTP API requests.", double(http_requests_), "counter");
  gauge("gptoss:http_errors_total", "HTTP API requests answered with an error.", double(http_errors_), "counter");
  gauge("gptoss:client_disconnects_total", "Streams whose client went away.", double(client_disconnects_), "counter");
  gauge("gptoss:streams_open", "Open SSE streams.", double(streams_open_));
  m.ttft_s.render("gptoss:time_to_first_token_seconds", "Time to first token.", out, model_label);
  m.itl_s.render("gptoss:time_per_output_token_seconds", "Time between output tokens.", out, model_label);
  m.e2e_s.render("gptoss:e2e_request_latency_seconds", "Request latency in the engine.", out, model_label);
  m.step_forward_s.render("gptoss:step_forward_seconds", "Time in the backend's forward pass, per engine step.", out,
                          model_label);
  m.step_host_s.render("gptoss:step_host_seconds",
                       "Host time between consecutive forward passes (scheduling, sampling, streaming).", out,
                       model_label);
  return out;
}

void Server::bind() { port_ = http_->bind(); }

void Server::run() {
  run_called_ = true;
  if (!shutdown_started_) http_->run();
}

void Server::shutdown() {
  if (shutdown_started_.exchange(true)) return;
  draining_ = true;
  http_->set_closing();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opts_.drain_timeout_s);
  while (std::chrono::steady_clock::now() < deadline && (engine_.num_active() > 0 || streams_open_ > 0))
    std::this_thread::sleep_for(20ms);
  http_->stop();
}

int Server::open_connections() const { return http_->open_connections(); }

}  // namespace gptoss::server
