// Harmony's streaming parser: sampled tokens back into messages (headers, channels, recipients,
// content types), one token at a time; behaviour follows openai/harmony (v0.0.8) src/encoding.rs.
#include <cstring>

#include "common/error.h"
#include "tokenizer/harmony.h"
#include "tokenizer/harmony_internal.h"
#include "tokenizer/tokenizer_impl.h"

namespace gptoss::harmony {

using namespace internal;

namespace {

// Unicode White_Space (Rust's char::is_whitespace).
bool is_ws(uint32_t c) {
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Decodes the code point at s[i] (valid UTF-8), returning its length.
size_t cp_at(const std::string& s, size_t i, uint32_t& cp) {
  unsigned char c = s[i];
  if (c < 0x80) return cp = c, 1;
  if ((c >> 5) == 6 && i + 1 < s.size()) return cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F), 2;
  if ((c >> 4) == 14 && i + 2 < s.size())
    return cp = ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F), 3;
  if (i + 3 < s.size())
    return cp = ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) |
                (s[i + 3] & 0x3F),
           4;
  return cp = c, 1;
}

// Rust's str::trim (Unicode White_Space).
std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e) {
    uint32_t cp;
    size_t n = cp_at(s, b, cp);
    if (!is_ws(cp)) break;
    b += n;
  }
  while (e > b) {
    size_t k = e - 1;
    while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    uint32_t cp;
    cp_at(s, k, cp);
    if (!is_ws(cp)) break;
    e = k;
  }
  return s.substr(b, e - b);
}

// Rust's split_ascii_whitespace.
std::vector<std::string> split_ascii_ws(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'; };
  while (i < s.size()) {
    while (i < s.size() && ws(s[i])) ++i;
    size_t b = i;
    while (i < s.size() && !ws(s[i])) ++i;
    if (i > b) out.push_back(s.substr(b, i - b));
  }
  return out;
}

bool valid_utf8(const std::string& s) {
  std::string out;
  return utf8_decode_lossy(s, out, true) == 0 && out == s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// StreamParser.

StreamParser::StreamParser(const Tokenizer& t, std::optional<Role> role, ParseOptions opts)
    : tok_(t), opts_(opts) {
  Renderer check(t);  // every formatting token present
  start_ = t.require_token_id(kStart);
  message_ = t.require_token_id(kMessage);
  channel_ = t.require_token_id(kChannel);
  constrain_ = t.require_token_id(kConstrain);
  stops_ = check.stop_tokens();
  if (role) {
    state_ = State::Header;
    next_role_ = role;
  }
}

std::optional<Role> StreamParser::current_role() const {
  if (state_ == State::Content) return header_.role;
  return next_role_;
}
std::optional<std::string> StreamParser::current_channel() const {
  return state_ == State::Content ? header_.channel : std::nullopt;
}
std::optional<std::string> StreamParser::current_recipient() const {
  return state_ == State::Content ? header_.recipient : std::nullopt;
}
std::optional<std::string> StreamParser::current_content_type() const {
  return state_ == State::Content ? header_.content_type : std::nullopt;
}

ParsedHeader StreamParser::parse_header(const std::string& header_in, std::optional<Role> role,
                                        bool parse_meta, std::string* remaining) const {
  std::string header = header_in;
  ParsedHeader h;
  size_t idx = header.find(kChannel);
  if (idx != std::string::npos) {
    size_t after = idx + std::strlen(kChannel);
    size_t end = after;
    while (end < header.size()) {
      uint32_t cp;
      size_t n = cp_at(header, end, cp);
      if (is_ws(cp) || cp == '<') break;
      end += n;
    }
    if (end == after) throw Error("harmony: channel marker present but no channel value in header");
    h.channel = header.substr(after, end - after);
    header = header.substr(0, idx) + header.substr(end);
  }
  header = trim(header);
  if (header.find(kConstrain) != std::string::npos) {
    std::string r;
    size_t pos = 0, k;
    while ((k = header.find(kConstrain, pos)) != std::string::npos) {
      r += header.substr(pos, k - pos) + " " + kConstrain;
      pos = k + std::strlen(kConstrain);
    }
    r += header.substr(pos);
    header = trim(r);
  }
  std::vector<std::string> parts = split_ascii_ws(header);
  std::optional<std::string> role_str;
  Role r;
  if (role) {
    r = *role;
  } else {
    if (parts.empty()) throw Error("harmony: message header has no role");
    role_str = parts[0];
    if (auto pr = parse_role(parts[0])) {
      r = *pr;
    } else if (parts.size() > 1 || parts[0].rfind("to=", 0) == 0) {
      parts.erase(parts.begin());  // an unknown role with a recipient: a tool's message
      r = Role::Tool;
    } else {
      throw Error("harmony: unknown role '" + parts[0] + "' in message header");
    }
  }
  if (!parts.empty() && parts[0] == role_name(r)) parts.erase(parts.begin());
  if (parse_meta && !parts.empty()) {
    size_t num = parts.size();
    std::string last = parts.back();
    parts.pop_back();
    if (last.rfind("to=", 0) == 0) {
      h.recipient = last.substr(3);
    } else if (num == 1) {
      h.recipient = last;
    } else {
      h.content_type = last;
      if (!parts.empty()) {
        std::string rr = parts.back();
        parts.pop_back();
        h.recipient = rr.rfind("to=", 0) == 0 ? rr.substr(3) : rr;
      }
    }
  }
  if (remaining) *remaining = join(parts, " ");
  else if (!parts.empty())
    throw Error("harmony: unexpected text in message header: '" + join(parts, " ") + "'");
  h.role = r;
  if (r == Role::Tool) h.name = role_str;
  return h;
}

void StreamParser::end_message(std::optional<TokenId> end, std::vector<ParserEvent>& ev) {
  // Held-back bytes of an incomplete character become U+FFFD.
  if (!pending_bytes_.empty()) {
    std::string tail;
    utf8_decode_lossy(pending_bytes_, tail, true);
    pending_bytes_.clear();
    content_ += tail;
    ev.push_back({ParserEvent::Kind::ContentDelta, header_, tail, std::nullopt});
  }
  Message m = Message::text(header_.role, content_);
  m.name = header_.name;
  m.recipient = header_.recipient;
  m.channel = header_.channel;
  m.content_type = header_.content_type;
  messages_.push_back(std::move(m));
  ev.push_back({ParserEvent::Kind::MessageEnd, header_, content_, end});
  state_ = State::ExpectStart;
  content_.clear();
  last_delta_.reset();
}

std::vector<ParserEvent> StreamParser::push(TokenId token) {
  try {
    return push_impl(token);
  } catch (const Error&) {
    // A malformed stream: drop the partial message and wait for the next <|start|>.
    state_ = State::ExpectStart;
    next_role_.reset();
    header_tokens_.clear();
    content_.clear();
    pending_bytes_.clear();
    last_delta_.reset();
    throw;
  }
}

std::vector<ParserEvent> StreamParser::push_impl(TokenId token) {
  std::vector<ParserEvent> ev;
  tokens_.push_back(token);
  last_delta_.reset();
  bool is_stop = std::find(stops_.begin(), stops_.end(), token) != stops_.end();
  switch (state_) {
    case State::ExpectStart:
      if (token != start_)
        throw Error("harmony: unexpected token " + std::to_string(token) +
                    " while expecting <|start|>");
      state_ = State::Header;
      header_tokens_.clear();
      break;
    case State::Header:
      if (token == message_) {
        std::string text;
        try {
          text = tok_.decode_bytes(header_tokens_);
        } catch (const Error&) {
          throw Error("harmony: unknown token in message header");
        }
        if (!valid_utf8(text)) throw Error("harmony: message header is not valid UTF-8");
        header_ = parse_header(text, next_role_, true, nullptr);
        next_role_.reset();
        header_tokens_.clear();
        state_ = State::Content;
        content_.clear();
        pending_bytes_.clear();
        ev.push_back({ParserEvent::Kind::MessageStart, header_, "", std::nullopt});
      } else if (!opts_.strict && is_stop) {
        // Malformed: a stop token before <|message|>. With a known role, the header text seen so
        // far becomes the message (its channel parsed, the rest content).
        if (next_role_ && !header_tokens_.empty()) {
          std::string text;
          utf8_decode_lossy(tok_.decode_bytes(header_tokens_), text, true);
          std::string rest;
          header_ = parse_header(text, next_role_, false, &rest);
          state_ = State::Content;
          content_.clear();
          pending_bytes_.clear();
          ev.push_back({ParserEvent::Kind::MessageStart, header_, "", std::nullopt});
          if (!rest.empty()) {
            content_ = rest;
            ev.push_back({ParserEvent::Kind::ContentDelta, header_, rest, std::nullopt});
          }
          end_message(token, ev);
        }
        state_ = State::ExpectStart;
        next_role_.reset();
        header_tokens_.clear();
      } else {
        header_tokens_.push_back(token);
      }
      break;
    case State::Content:
      if (is_stop) {
        end_message(token, ev);
        break;
      }
      {
        std::string delta;
        if (!tok_.has_token(token)) {
          // Not a token of the vocabulary: held bytes and the token each become U+FFFD.
          utf8_decode_lossy(pending_bytes_, delta, true);
          pending_bytes_.clear();
          delta += "\xEF\xBF\xBD";
        } else {
          pending_bytes_.append(tok_.token_bytes(token));
          size_t keep = utf8_decode_lossy(pending_bytes_, delta, false);
          pending_bytes_.erase(0, pending_bytes_.size() - keep);
        }
        if (!delta.empty()) {
          content_ += delta;
          last_delta_ = delta;
          ev.push_back({ParserEvent::Kind::ContentDelta, header_, delta, std::nullopt});
        }
      }
      break;
  }
  return ev;
}

std::vector<ParserEvent> StreamParser::finish() {
  std::vector<ParserEvent> ev;
  last_delta_.reset();
  switch (state_) {
    case State::ExpectStart: break;
    case State::Header:
      state_ = State::ExpectStart;
      next_role_.reset();
      header_tokens_.clear();
      throw Error("harmony: the stream ended inside a message header");
    case State::Content: end_message(std::nullopt, ev); break;
  }
  return ev;
}

// ---------------------------------------------------------------------------------------------

std::vector<Message> parse_completion(const Tokenizer& tok, std::span<const TokenId> tokens,
                                      std::optional<Role> role, ParseOptions opts) {
  StreamParser p(tok, role, opts);
  for (TokenId t : tokens) p.push(t);
  p.finish();
  return p.messages();
}

}  // namespace gptoss::harmony
