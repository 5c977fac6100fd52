#include "server/server.h"

#include <httplib.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

#include "common/error.h"
#include "server/chat_format.h"
#include "server/openai_api.h"

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

void set_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dumps(j), "application/json");
}

void set_error(httplib::Response& res, const ApiError& e) { set_json(res, e.status, error_body(e)); }

int64_t now_s() { return int64_t(std::time(nullptr)); }

// The socket of a request's connection: cpp-httplib 0.11 tells a handler nothing about it, so
// it is found among the process's descriptors by the connection's two ports and peer address
// (the worker thread owns that socket until the handler returns, so it cannot be reused
// meanwhile). -1 when not found.
int client_socket(const httplib::Request& req) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return -1;
  auto port_and_addr = [](const sockaddr_storage& a, std::string* addr) {
    char buf[INET6_ADDRSTRLEN] = "";
    int port = -1;
    if (a.ss_family == AF_INET) {
      auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
      ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
      port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
      auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
      ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
      port = ntohs(v6->sin6_port);
    }
    if (addr) *addr = buf;
    return port;
  };
  int found = -1;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof peer, ll = sizeof local;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0)
      continue;
    std::string peer_addr;
    if (port_and_addr(peer, &peer_addr) == req.remote_port && port_and_addr(local, nullptr) == req.local_port &&
        peer_addr == req.remote_addr) {
      found = fd;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

// True when the peer closed the connection (EOF pending) or it failed.
bool client_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  char c;
  return ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

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

json usage_json(int prompt, int completion) {
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
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
  void finalize(CommonRequest& r, size_t prompt_len, const char* param) {
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
                       "invalid_request_error", "max_tokens", "context_length_exceeded"};
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

  // Answers a non-streamed request once `step` returns the body: 200, or the error's status when
  // the body is an error object (a generation that failed midway gets its 500). The handler
  // waits for it, watching its connection, so a client that went away cancels the request.
  void respond_when_done(const httplib::Request& req, httplib::Response& res, std::shared_ptr<RequestStream> rs,
                         std::function<std::optional<json>(EngineEvent&)> step) {
    const int fd = client_socket(req);
    ++s.streams_open_;
    struct Open {
      std::atomic<int64_t>& n;
      ~Open() { --n; }
    } open{s.streams_open_};
    for (;;) {
      if (client_gone(fd)) {
        rs->cancel();
        ++s.client_disconnects_;
        return;
      }
      auto ev = rs->next(200ms);
      while (ev) {
        if (auto out = step(*ev)) {
          int status = 200;
          if (out->contains("error")) {
            status = 500;
            ++s.http_errors_;
          }
          set_json(res, status, *out);
          return;
        }
        ev = rs->next(0ms);
      }
    }
  }

  // The SSE plumbing shared by chat and text streams. `fill(out)` appends this round's chunks
  // and, once the request has finished, its finishing chunk, returning the finishing event;
  // this adds the usage chunk and [DONE], writes, and cancels the request if the client is gone.
  template <class Stream, class Fill>
  void stream_sse(httplib::Response& res, std::shared_ptr<Stream> st, const char* object, Fill fill) {
    ++s.streams_open_;
    Server* srv = &s;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [st, object, fill](size_t, httplib::DataSink& sink) -> bool {
          if (st->done) {
            sink.done();
            return true;
          }
          if (sink.is_writable && !sink.is_writable()) {  // the client is gone
            st->rs->cancel();
            return false;
          }
          std::string out;
          if (std::optional<EngineEvent> last = fill(out)) {
            if (st->include_usage) {
              json u = {{"id", st->id},       {"object", object}, {"created", st->created},
                        {"model", st->model}, {"choices", json::array()},
                        {"usage", usage_json(last->prompt_tokens, last->completion_tokens)}};
              out += sse(u);
            }
            out += "data: [DONE]\n\n";
            st->done = true;
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) {
            st->rs->cancel();
            return false;
          }
          if (st->done) sink.done();
          return true;
        },
        [st, srv](bool success) {
          if (!success || !st->done) {
            st->rs->cancel();
            ++srv->client_disconnects_;
          }
          --srv->streams_open_;
        });
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

  void chat(const httplib::Request& req, httplib::Response& res) {
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
    // Chat stop strings apply to the visible content, not to harmony headers or reasoning: the
    // server matches them and cancels the request.
    std::vector<std::string> stop_strings = std::move(r.sampling.stop);
    r.sampling.stop.clear();
    auto rs = submit(prompt, r.sampling);
    auto st = std::make_shared<ChatStream>();
    st->stops = std::make_unique<StopMatcher>(std::move(stop_strings));
    st->rs = rs;
    st->mapper = std::make_unique<ChatOutputMapper>(s.tok_);
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
      respond_when_done(req, res, rs, [this, st, acc, want_lp](EngineEvent& ev) -> std::optional<json> {
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
                    {"usage", usage_json(st->prompt_tokens, ev.completion_tokens)}};
      });
      return;
    }

    stream_sse(res, st, "chat.completion.chunk", [this, st](std::string& out) -> std::optional<EngineEvent> {
      if (!st->started) {
        st->started = true;
        out += sse(chat_chunk(*st, json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
      }
      auto ev = st->rs->next(out.empty() ? 200ms : 0ms);
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
          if (st->continuous_usage) ch["usage"] = usage_json(ev->prompt_tokens, ev->completion_tokens);
          out += sse(ch);
        }
        if (ev->finished) {
          if (ev->finish_reason == FinishReason::kError) {
            out += sse(error_body(ApiError{500, "Generation failed: " + ev->error, "server_error", "", ""}));
          } else {
            json ch = chat_chunk(*st, json::object(), take_lps(),
                                 chat_finish_reason(ev->finish_reason, st->mapper->has_tool_calls()));
            if (st->continuous_usage) ch["usage"] = usage_json(ev->prompt_tokens, ev->completion_tokens);
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

  void completions(const httplib::Request& req, httplib::Response& res) {
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
      respond_when_done(req, res, rs, [this, st, acc, want_lp](EngineEvent& ev) -> std::optional<json> {
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
                    {"usage", usage_json(ev.prompt_tokens, ev.completion_tokens)}};
      });
      return;
    }

    stream_sse(res, st, "text_completion", [this, st](std::string& out) -> std::optional<EngineEvent> {
      if (st->echo_pending && st->first_prompt_token < 0) {
        out += sse(text_chunk(*st, st->echo, nullptr, nullptr));
        st->text_offset = count_chars(st->echo);
        st->echo_pending = false;
      }
      auto ev = st->rs->next(out.empty() ? 200ms : 0ms);
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
          if (st->continuous_usage) ch["usage"] = usage_json(ev->prompt_tokens, ev->completion_tokens);
          out += sse(ch);
        }
        if (ev->finished) {
          if (ev->finish_reason == FinishReason::kError)
            out += sse(error_body(ApiError{500, "Generation failed: " + ev->error, "server_error", "", ""}));
          else {
            json ch = text_chunk(*st, "", take_lps(), text_finish(ev->finish_reason));
            if (st->continuous_usage) ch["usage"] = usage_json(ev->prompt_tokens, ev->completion_tokens);
            out += sse(ch);
          }
          return ev;
        }
        ev = st->rs->next(0ms);
      }
      return std::nullopt;
    });
  }

  // ---------------------------------------------------------------- small endpoints
  json model_card() {
    return {{"id", s.opts_.served_model_name}, {"object", "model"},     {"created", s.created_},
            {"owned_by", "gptoss"},            {"root", s.opts_.served_model_name},
            {"max_model_len", s.engine_.max_model_len()}};
  }

  // vLLM's /tokenize: {"prompt"} or {"messages", ...} -> {"count", "max_model_len", "tokens",
  // "token_strs"}; token_strs (with return_token_strs) spells tokens as convert_ids_to_tokens does.
  void tokenize(const httplib::Request& req, httplib::Response& res) {
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
  void detokenize(const httplib::Request& req, httplib::Response& res) {
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
    : engine_(engine), tok_(tok), renderer_(tok), opts_(std::move(opts)), svr_(std::make_unique<httplib::Server>()) {
  created_ = now_s();
  setup_routes();
}

Server::~Server() = default;

void Server::setup_routes() {
  auto h = std::make_shared<Handlers>(Handlers{*this});
  int threads = opts_.http_threads > 0 ? opts_.http_threads : 4 * engine_.config().max_num_seqs + 64;
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_->set_payload_max_length(opts_.max_body_bytes);
  svr_->set_read_timeout(opts_.read_timeout_s, 0);
  svr_->set_write_timeout(opts_.write_timeout_s, 0);
  svr_->set_keep_alive_max_count(1000);
  svr_->set_keep_alive_timeout(5);

  // Wraps a handler: OpenAI error objects for ApiError and anything else.
  auto wrap = [this](std::function<void(const httplib::Request&, httplib::Response&)> f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      ++http_requests_;
      try {
        f(req, res);
      } catch (const ApiError& e) {
        ++http_errors_;
        set_error(res, e);
      } catch (const Error& e) {
        ++http_errors_;
        set_error(res, ApiError{400, e.what(), "invalid_request_error", "", ""});
      } catch (const std::exception& e) {
        ++http_errors_;
        set_error(res, ApiError{500, std::string("Internal error: ") + e.what(), "server_error", "", ""});
      }
      if (opts_.log_requests)
        std::fprintf(stderr, "%s %s -> %d\n", req.method.c_str(), req.path.c_str(), res.status);
    };
  };

  svr_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty() || req.path.rfind("/v1", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + opts_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    ++http_requests_;
    ++http_errors_;
    set_error(res, ApiError{401, "Incorrect API key provided.", "invalid_request_error", "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  svr_->set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = res.status;
    switch (res.status) {
      case 404: e.message = "Not found: " + req.method + " " + req.path; e.code = "not_found"; break;
      case 405: e.message = "Method not allowed."; break;
      case 413: e.message = "The request body is too large."; e.code = "request_too_large"; break;
      case 414: e.message = "The request URI is too long."; break;
      default: e.message = "Bad request."; break;
    }
    if (res.status >= 500) e.type = "server_error";
    set_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "Internal error.";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = std::string("Internal error: ") + e.what();
    } catch (...) {
    }
    set_error(res, ApiError{500, msg, "server_error", "", ""});
  });

  // Every route goes through these, so routes() lists exactly what is served.
  auto get = [this](const char* path, httplib::Server::Handler f) {
    routes_.push_back({"GET", path});
    svr_->Get(path, std::move(f));
  };
  auto post = [this](const char* path, httplib::Server::Handler f) {
    routes_.push_back({"POST", path});
    svr_->Post(path, std::move(f));
  };
  get("/health", wrap([this](const httplib::Request&, httplib::Response& res) {
    if (draining_) set_json(res, 503, {{"status", "draining"}});
    else set_json(res, 200, {{"status", "ok"}});
  }));
  get("/v1/models", wrap([h](const httplib::Request&, httplib::Response& res) {
    set_json(res, 200, {{"object", "list"}, {"data", json::array({h->model_card()})}});
  }));
  get(R"(/v1/models/(.+))", wrap([h, this](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != opts_.served_model_name)
      throw ApiError{404, "The model `" + std::string(req.matches[1]) + "` does not exist.", "invalid_request_error",
                     "model", "model_not_found"};
    set_json(res, 200, h->model_card());
  }));
  post("/v1/chat/completions", wrap([h](const httplib::Request& q, httplib::Response& r) { h->chat(q, r); }));
  post("/v1/completions", wrap([h](const httplib::Request& q, httplib::Response& r) { h->completions(q, r); }));
  post("/tokenize", wrap([h](const httplib::Request& q, httplib::Response& r) { h->tokenize(q, r); }));
  post("/detokenize", wrap([h](const httplib::Request& q, httplib::Response& r) { h->detokenize(q, r); }));
  get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
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
  gauge("gptoss:engine_steps_total", "Forward passes run.", double(m.steps), "counter");
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

void Server::bind() {
  int fd_seen = -1;
  svr_->set_socket_options([&fd_seen](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    fd_seen = sock;
  });
  if (opts_.port == 0) {
    port_ = svr_->bind_to_any_port(opts_.host);
    if (port_ <= 0) throw Error("cannot bind " + opts_.host);
  } else {
    if (!svr_->bind_to_port(opts_.host, opts_.port))
      throw Error("cannot bind " + opts_.host + ":" + std::to_string(opts_.port));
    port_ = opts_.port;
  }
  // cpp-httplib listens with a backlog of 5; many clients connecting at once need more.
  if (fd_seen >= 0) ::listen(fd_seen, 1024);
}

void Server::run() {
  run_called_ = true;
  if (!shutdown_started_) svr_->listen_after_bind();
}

void Server::shutdown() {
  if (shutdown_started_.exchange(true)) return;
  draining_ = true;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opts_.drain_timeout_s);
  while (std::chrono::steady_clock::now() < deadline && (engine_.num_active() > 0 || streams_open_ > 0))
    std::this_thread::sleep_for(20ms);
  // A signal right at start-up: let listen() begin so that stop() ends it.
  for (int i = 0; i < 250 && run_called_ && !svr_->is_running(); ++i) std::this_thread::sleep_for(20ms);
  svr_->stop();
}

}  // namespace gptoss::server
