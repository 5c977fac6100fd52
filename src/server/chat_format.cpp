#include "server/chat_format.h"

#include <cctype>
#include <map>

#include "common/error.h"

namespace gptoss::server {

using harmony::Message;
using harmony::Role;

harmony::Conversation build_conversation(const ChatRequest& r) {
  harmony::SystemContent sys;
  if (r.reasoning_effort) {
    if (*r.reasoning_effort == "low") sys.reasoning_effort = harmony::ReasoningEffort::Low;
    else if (*r.reasoning_effort == "high") sys.reasoning_effort = harmony::ReasoningEffort::High;
    else sys.reasoning_effort = harmony::ReasoningEffort::Medium;
  }
  harmony::DeveloperContent dev;
  std::string instructions;
  for (const auto& m : r.messages)
    if ((m.role == "system" || m.role == "developer") && m.content && !m.content->empty()) {
      if (!instructions.empty()) instructions += "\n\n";
      instructions += *m.content;
    }
  bool with_tools = !r.tools.empty() && r.tool_choice.mode != "none";
  if (with_tools && r.tool_choice.mode == "required") {
    if (!instructions.empty()) instructions += "\n\n";
    instructions += "You must call one of the functions.";
  } else if (with_tools && r.tool_choice.mode == "function") {
    if (!instructions.empty()) instructions += "\n\n";
    instructions += "You must call the function " + r.tool_choice.function + ".";
  }
  if (!instructions.empty()) dev.instructions = instructions;
  if (r.response_format.type == "json_schema") {
    // harmony's place for structured output: "# Response Formats\n\n## NAME\n\n// DESC\nSCHEMA"
    std::string rf = "## " + r.response_format.name + "\n\n";
    if (!r.response_format.description.empty()) rf += "// " + r.response_format.description + "\n";
    rf += r.response_format.schema ? r.response_format.schema->dump() : std::string("{\"type\":\"object\"}");
    dev.response_formats = rf;
  }
  if (with_tools) {
    std::vector<harmony::ToolDescription> tools;
    for (const auto& t : r.tools) {
      harmony::ToolDescription d;
      d.name = t.name;
      d.description = t.description;
      d.parameters = t.parameters;
      tools.push_back(std::move(d));
    }
    dev.with_function_tools(std::move(tools));
  }
  harmony::Conversation c;
  c.messages.push_back(Message::system(sys));
  if (dev.instructions || dev.response_formats || !dev.tools.empty()) c.messages.push_back(Message::developer(dev));

  std::map<std::string, std::string> call_names;  // tool_call_id -> function name
  for (const auto& m : r.messages) {
    if (m.role == "system" || m.role == "developer") continue;
    if (m.role == "user") {
      c.messages.push_back(Message::text(Role::User, *m.content));
    } else if (m.role == "assistant") {
      if (m.reasoning && !m.reasoning->empty())
        c.messages.push_back(Message::text(Role::Assistant, *m.reasoning).with_channel("analysis"));
      if (m.content && !m.content->empty())
        c.messages.push_back(
            Message::text(Role::Assistant, *m.content).with_channel(m.tool_calls.empty() ? "final" : "commentary"));
      for (const auto& tc : m.tool_calls) {
        if (!tc.id.empty()) call_names[tc.id] = tc.name;
        c.messages.push_back(Message::text(Role::Assistant, tc.arguments.empty() ? "{}" : tc.arguments)
                                 .with_channel("commentary")
                                 .with_recipient("functions." + tc.name)
                                 .with_content_type("<|constrain|>json"));
      }
    } else if (m.role == "tool") {
      std::string name = m.name;
      if (name.empty()) {
        auto it = call_names.find(m.tool_call_id);
        if (it != call_names.end()) name = it->second;
      }
      if (name.empty()) {
        // The last call made, when the client gave neither a known id nor a name.
        for (auto it = c.messages.rbegin(); it != c.messages.rend(); ++it)
          if (it->recipient && it->recipient->rfind("functions.", 0) == 0) {
            name = it->recipient->substr(10);
            break;
          }
      }
      if (name.empty())
        bad_request("A tool result (a tool message, or a function_call_output item) must answer an earlier tool call "
                    "(its tool_call_id or call_id).",
                    "messages");
      c.messages.push_back(Message::tool_result("functions." + name, *m.content));
    }
  }
  return c;
}

std::vector<TokenId> render_chat_prompt(const harmony::Renderer& renderer, const ChatRequest& r) {
  return renderer.render_for_completion(build_conversation(r), Role::Assistant);
}

void ChatDelta::append(const ChatDelta& d) {
  content += d.content;
  reasoning += d.reasoning;
  for (const auto& t : d.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == t.index && t.id.empty())
      tool_calls.back().arguments += t.arguments;
    else
      tool_calls.push_back(t);
  }
}

ChatOutputMapper::ChatOutputMapper(const Tokenizer& tok, bool plain_text) : tok_(tok) {
  if (plain_text) {
    raw_.emplace(tok_);
    kind_ = Kind::Content;
    return;
  }
  harmony::ParseOptions o;
  o.strict = false;
  parser_.emplace(tok_, Role::Assistant, o);
}

void ChatOutputMapper::start_message(const harmony::ParsedHeader& h, ChatDelta& d) {
  msg_streamed_.clear();
  any_message_ = true;
  if (h.recipient && *h.recipient != "all" && !h.recipient->empty() && h.role == Role::Assistant) {
    kind_ = Kind::Tool;
    std::string name = *h.recipient;
    if (name.rfind("functions.", 0) == 0) name = name.substr(10);
    ToolCall tc;
    tc.id = make_id("call_");
    tc.name = name;
    calls_.push_back(tc);
    ChatDelta::ToolCallDelta td;
    td.index = int(calls_.size()) - 1;
    td.id = tc.id;
    td.name = tc.name;
    d.tool_calls.push_back(td);
    any_output_ = true;
  } else if (h.channel && *h.channel == "analysis") {
    kind_ = Kind::Reasoning;
  } else {
    kind_ = Kind::Content;
  }
}

void ChatOutputMapper::add_text(const std::string& text, ChatDelta& d) {
  if (text.empty()) return;
  any_output_ = true;
  msg_streamed_ += text;
  switch (kind_) {
    case Kind::Reasoning:
      reasoning_ += text;
      d.reasoning += text;
      break;
    case Kind::Tool: {
      calls_.back().arguments += text;
      ChatDelta::ToolCallDelta td;
      td.index = int(calls_.size()) - 1;
      td.arguments = text;
      d.tool_calls.push_back(td);
      break;
    }
    default:
      content_ += text;
      d.content += text;
  }
}

void ChatOutputMapper::on_events(const std::vector<harmony::ParserEvent>& evs, ChatDelta& d) {
  using K = harmony::ParserEvent::Kind;
  for (const auto& e : evs) {
    if (e.kind == K::MessageStart) {
      start_message(e.header, d);
    } else if (e.kind == K::ContentDelta) {
      if (kind_ == Kind::None) start_message(e.header, d);
      add_text(e.text, d);
    } else if (e.kind == K::MessageEnd) {
      if (kind_ == Kind::None) start_message(e.header, d);
      // Text the deltas did not carry (e.g. a header-only message at the end of a stream).
      if (e.text.size() > msg_streamed_.size() && e.text.compare(0, msg_streamed_.size(), msg_streamed_) == 0)
        add_text(e.text.substr(msg_streamed_.size()), d);
      kind_ = Kind::None;
      msg_streamed_.clear();
    }
  }
}

void ChatOutputMapper::raw_text(TokenId t, ChatDelta& d) {
  if (t < 0 || size_t(t) >= tok_.vocab_size() || tok_.is_special(t)) return;
  try {
    std::string s = raw_->push(t);
    if (!s.empty()) {
      any_output_ = true;
      content_ += s;
      d.content += s;
    }
  } catch (const std::exception&) {
  }
}

namespace {

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' || c == '/' || c == ':';
}

// Skips name characters from `i`; returns the new position.
size_t skip_name(std::string_view h, size_t i) {
  while (i < h.size() && is_name_char(h[i])) ++i;
  return i;
}

}  // namespace

// Whether `h` (a header's text so far, special tokens spelled, after "<|start|>" when
// `role_known` is false) can still become a header gpt-oss writes:
//   [ROLE] [" to=" RECIPIENT] ["<|channel|>" CHANNEL [" to=" RECIPIENT] [" "] ["<|constrain|>"] [TYPE]]
// A random model's text fails this within a token or two, so it is shown as text at once
// instead of after kMaxHeaderTokens.
bool ChatOutputMapper::plausible_header(std::string_view h, bool role_known) {
  static constexpr std::string_view kChannel = "<|channel|>", kConstrain = "<|constrain|>", kTo = " to=";
  auto prefix_of = [&](std::string_view part, std::string_view whole) {
    return part.size() < whole.size() && whole.substr(0, part.size()) == part;
  };
  size_t i = 0;
  if (!role_known) {
    static constexpr std::string_view kRole = "assistant";
    if (prefix_of(h, kRole)) return true;
    if (h.substr(0, kRole.size()) != kRole) return false;
    i = kRole.size();
  }
  bool channel = false, recipient = false, type = false;
  while (i < h.size()) {
    std::string_view rest = h.substr(i);
    if (!recipient && rest.substr(0, kTo.size()) == kTo) {
      recipient = true;
      i = skip_name(h, i + kTo.size());
    } else if (!recipient && prefix_of(rest, kTo)) {
      return true;
    } else if (!channel && rest.substr(0, kChannel.size()) == kChannel) {
      channel = true;
      i = skip_name(h, i + kChannel.size());
    } else if (channel && !type && (rest[0] == ' ' || rest.substr(0, kConstrain.size()) == kConstrain)) {
      type = true;
      if (rest[0] == ' ') ++i;
      if (h.substr(i, kConstrain.size()) == kConstrain) i += kConstrain.size();
      i = skip_name(h, i);
    } else {
      return false;
    }
  }
  return true;
}

ChatDelta ChatOutputMapper::push(TokenId t) {
  ChatDelta d;
  tokens_.push_back(t);
  if (parser_) {
    try {
      auto evs = parser_->push(t);
      if (!evs.empty() || parser_->in_content()) header_tokens_.clear();
      else header_tokens_.push_back(t);
      on_events(evs, d);
      if (header_tokens_.size() > kMaxHeaderTokens || !plausible_header_tokens()) {
        // Not harmony: what looked like a header is text.
        parser_.reset();
        raw_.emplace(tok_);
        kind_ = Kind::Content;
        for (TokenId h : header_tokens_) raw_text(h, d);
        header_tokens_.clear();
      }
      return d;
    } catch (const std::exception&) {
      parser_.reset();
      raw_.emplace(tok_);
      if (kind_ != Kind::Content && kind_ != Kind::None) kind_ = Kind::Content;
      return d;  // the token that broke the format is dropped
    }
  }
  raw_text(t, d);
  return d;
}

bool ChatOutputMapper::plausible_header_tokens() const {
  if (header_tokens_.empty()) return true;
  std::string h;
  bool role_known = true;  // the prompt's "<|start|>assistant"; a later message starts with <|start|>
  size_t from = 0;
  if (auto start = tok_.token_id("<|start|>"); start && header_tokens_[0] == *start) {
    role_known = false;
    from = 1;
  }
  for (size_t i = from; i < header_tokens_.size(); ++i) {
    TokenId t = header_tokens_[i];
    if (t < 0 || size_t(t) >= tok_.vocab_size() || !tok_.has_token(t)) return false;
    h += tok_.token_bytes(t);
  }
  return plausible_header(h, role_known);
}

ChatDelta ChatOutputMapper::finish() {
  ChatDelta d;
  if (parser_) {
    try {
      on_events(parser_->finish(), d);
    } catch (const std::exception&) {
    }
  } else if (raw_) {
    std::string s = raw_->flush();
    content_ += s;
    d.content += s;
  }
  // A stream that ends inside a header gpt-oss could be writing (max_tokens cut it after
  // "<|channel|>analysis", say) or right after one (an empty message) said nothing: its header
  // words are not content.
  const bool truncated_header = parser_ && !header_tokens_.empty() && plausible_header_tokens();
  if (!any_output_ && !any_message_ && !truncated_header && !tokens_.empty()) {
    // Nothing well-formed came out: answer the decoded text of the ordinary tokens.
    std::vector<TokenId> ids;
    for (TokenId t : tokens_)
      if (t >= 0 && size_t(t) < tok_.vocab_size() && !tok_.is_special(t)) ids.push_back(t);
    try {
      std::string s = tok_.decode(ids);
      content_ += s;
      d.content += s;
    } catch (const std::exception&) {
    }
  }
  any_output_ = true;
  return d;
}

std::string StopMatcher::feed(const std::string& text) {
  if (matched_) return {};
  if (stops_.empty()) return text;
  std::string buf = held_ + text;
  held_.clear();
  size_t best = std::string::npos;
  for (const auto& st : stops_) {
    size_t p = buf.find(st);
    if (p != std::string::npos && (best == std::string::npos || p < best)) {
      best = p;
      which_ = st;
    }
  }
  if (best != std::string::npos) {
    matched_ = true;
    return buf.substr(0, best);
  }
  size_t hold = 0;
  for (const auto& st : stops_)
    for (size_t k = std::min(st.size() - 1, buf.size()); k > hold; --k)
      if (buf.compare(buf.size() - k, k, st, 0, k) == 0) {
        hold = k;
        break;
      }
  held_ = buf.substr(buf.size() - hold);
  buf.resize(buf.size() - hold);
  return buf;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!matched_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace gptoss::server
