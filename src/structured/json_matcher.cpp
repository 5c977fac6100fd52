#include "structured/json_matcher.h"

#include <cstring>

namespace gptoss::structured {

namespace {

bool is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

// String modes.
enum : uint8_t { kStrOpen, kStrBody, kStrEscape, kStrUnicode };
// Number modes.
enum : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };
// Object modes.
enum : uint8_t { kObjOpen, kObjFirst, kObjKey, kObjFreeKey, kObjColon, kObjValue, kObjAfter, kObjNeedKey };
// Array modes.
enum : uint8_t { kArrOpen, kArrFirst, kArrAfter, kArrNeedItem };

constexpr uint16_t kAdditionalProp = 0xFFFF;

// Formats as a sequence of byte classes: 'd' digit, 'x' hex digit, others literal; month, day,
// hour, minute and second digits are range-checked with the previous byte.
constexpr const char* kDatePattern = "dddd-Mm-Dd";    // M/m month, D/d day
constexpr const char* kTimePattern = "Hh:Nn:Ss";      // H/h hour, N/n minute, S/s second
constexpr const char* kUuidPattern = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";

bool class_ok(char cls, uint8_t prev, uint8_t b) {
  switch (cls) {
    case 'd': return is_digit(b);
    case 'x': return is_hex(b);
    case 'M': return b == '0' || b == '1';
    case 'm': return prev == '0' ? (b >= '1' && b <= '9') : (b >= '0' && b <= '2');
    case 'D': return b >= '0' && b <= '3';
    case 'H': return b >= '0' && b <= '2';
    case 'h': return prev == '2' ? (b >= '0' && b <= '3') : is_digit(b);
    case 'N':
    case 'S': return b >= '0' && b <= '5';
    case 'n':
    case 's': return is_digit(b);
    default: return uint8_t(cls) == b;
  }
}

// Day digit after the tens digit: 01-31.
bool day_ok(uint8_t prev, uint8_t b) {
  if (prev == '0') return b >= '1' && b <= '9';
  if (prev == '3') return b == '0' || b == '1';
  return is_digit(b);
}

// The format automaton. Positions: 0..len-1 inside the fixed part; for time and date-time,
// after the seconds come an optional fraction and a zone (Z or +hh:mm / -hh:mm).
// Encoding of pos beyond the fixed part: 1000 + k (k: state of the tail).
enum : uint32_t { kTailAfterSec = 1000, kTailFracFirst, kTailFrac, kTailZoneH1 = 1100, kTailDone = 1200 };

struct FormatStep {
  bool ok;
  uint32_t pos;
};

FormatStep format_step(StringFormat fmt, uint32_t pos, uint8_t prev, uint8_t b) {
  std::string pat;
  switch (fmt) {
    case StringFormat::kDate: pat = kDatePattern; break;
    case StringFormat::kTime: pat = kTimePattern; break;
    case StringFormat::kDateTime: pat = std::string(kDatePattern) + "T" + kTimePattern; break;
    case StringFormat::kUuid: pat = kUuidPattern; break;
    default: return {false, pos};
  }
  if (pos < pat.size()) {
    char cls = pat[pos];
    bool ok = cls == 'd' && pos > 0 && pat[pos - 1] == 'D' ? day_ok(prev, b) : class_ok(cls, prev, b);
    if (!ok) return {false, pos};
    ++pos;
    if (pos == pat.size() && (fmt == StringFormat::kTime || fmt == StringFormat::kDateTime)) pos = kTailAfterSec;
    return {true, pos};
  }
  // The zone: "Z" or "+hh:mm"; the fraction: "." then 1-9 digits.
  if (pos == kTailAfterSec || pos == kTailFrac || (pos > kTailFrac && pos < kTailFrac + 9)) {
    if (b == 'Z') return {true, kTailDone};
    if (b == '+' || b == '-') return {true, kTailZoneH1};
    if (pos == kTailAfterSec && b == '.') return {true, kTailFracFirst};
    if (pos >= kTailFrac && pos < kTailFrac + 8 && is_digit(b)) return {true, pos + 1};
    return {false, pos};
  }
  if (pos == kTailFracFirst) return is_digit(b) ? FormatStep{true, kTailFrac} : FormatStep{false, pos};
  if (pos >= kTailZoneH1 && pos < kTailZoneH1 + 5) {  // hh:mm
    static const char* zone = "Hh:Nn";
    if (!class_ok(zone[pos - kTailZoneH1], prev, b)) return {false, pos};
    return {true, pos + 1 == kTailZoneH1 + 5 ? kTailDone : pos + 1};
  }
  return {false, pos};
}

bool format_complete(StringFormat fmt, uint32_t pos) {
  switch (fmt) {
    case StringFormat::kDate: return pos == std::strlen(kDatePattern);
    case StringFormat::kUuid: return pos == std::strlen(kUuidPattern);
    default: return pos == kTailDone;
  }
}

}  // namespace

uint32_t utf8_next(uint32_t st, uint8_t b, bool* ok) {
  *ok = true;
  if (st == 0) {
    if (b < 0x80) return 0;
    // (due << 16) | (lo << 8) | hi: the next byte's range and the continuation bytes due
    if (b >= 0xC2 && b <= 0xDF) return (1u << 16) | (0x80 << 8) | 0xBF;
    if (b == 0xE0) return (2u << 16) | (0xA0 << 8) | 0xBF;
    if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return (2u << 16) | (0x80 << 8) | 0xBF;
    if (b == 0xED) return (2u << 16) | (0x80 << 8) | 0x9F;
    if (b == 0xF0) return (3u << 16) | (0x90 << 8) | 0xBF;
    if (b >= 0xF1 && b <= 0xF3) return (3u << 16) | (0x80 << 8) | 0xBF;
    if (b == 0xF4) return (3u << 16) | (0x80 << 8) | 0x8F;
    *ok = false;
    return st;
  }
  uint32_t due = st >> 16, lo = (st >> 8) & 0xFF, hi = st & 0xFF;
  if (b < lo || b > hi) {
    *ok = false;
    return st;
  }
  return due == 1 ? 0 : ((due - 1) << 16) | (0x80 << 8) | 0xBF;
}

std::string MatchState::key() const {
  std::string k;
  k.reserve(size_t(depth) * 20 + 1);
  k.push_back(char(depth));
  for (int i = 0; i < depth; ++i) {
    const Frame& x = f[i];
    char buf[20];
    std::memcpy(buf, &x.node, 4);
    std::memcpy(buf + 4, &x.pos, 4);
    std::memcpy(buf + 8, &x.seen, 8);
    std::memcpy(buf + 16, &x.count, 2);
    buf[18] = char(x.mode);
    buf[19] = char(x.aux);
    k.append(buf, 20);
  }
  return k;
}

MatchState JsonMatcher::start() const {
  MatchState s;
  push(s, g_.root);
  return s;
}

bool JsonMatcher::push(MatchState& s, int32_t node) const {
  // Only where its shortest value fits under the depth limit (GrammarNode::min_frames).
  if (s.depth + g_.nodes[size_t(node)].min_frames > kMaxDepth) return false;
  s.f[s.depth] = Frame{};
  s.f[s.depth].node = node;
  ++s.depth;
  return true;
}

void JsonMatcher::pop(MatchState& s) const {
  --s.depth;
  if (s.depth == 0) return;
  Frame& p = s.f[s.depth - 1];
  p.aux = 0;
  if (g_.nodes[size_t(p.node)].kind == NodeKind::kObject) {
    p.mode = p.mode == kObjFreeKey ? kObjColon : kObjAfter;  // a free key, or a value, closed
  } else {  // array
    if (p.count < 0xFFFF) ++p.count;
    p.mode = kArrAfter;
  }
}

bool JsonMatcher::advance(MatchState& s, uint8_t b) const {
  for (int guard = 0; guard < 4 * kMaxDepth + 8; ++guard) {
    if (s.depth == 0) return false;
    switch (step(s, b)) {
      case kReject: return false;
      case kConsumed: return true;
      case kConsumedPop: pop(s); return true;
      case kPopRetry: pop(s); break;
      case kRetry: break;
    }
  }
  return false;
}

JsonMatcher::Step JsonMatcher::step(MatchState& s, uint8_t b) const {
  Frame& f = s.f[s.depth - 1];
  const GrammarNode& n = g_.nodes[size_t(f.node)];
  switch (n.kind) {
    case NodeKind::kAny: {
      int32_t to = b == '{' ? g_.any_object : b == '[' ? g_.any_array : b == '"' ? g_.free_string
                 : (b == '-' || is_digit(b)) ? g_.number : (b == 't' || b == 'f' || b == 'n') ? g_.literal_tfn : -1;
      if (to < 0) return kReject;
      // A container at the depth limit could never close what it opens: refuse it.
      if ((b == '{' || b == '[') && s.depth >= kMaxDepth) return kReject;
      f = Frame{};
      f.node = to;
      return kRetry;
    }
    case NodeKind::kUnion: {
      int32_t to = n.alt_by_byte.empty() ? -1 : n.alt_by_byte[b];
      if (to < 0) return kReject;
      if (s.depth - 1 + g_.nodes[size_t(to)].min_frames > kMaxDepth) return kReject;  // in place of this frame
      f = Frame{};
      f.node = to;
      return kRetry;
    }
    case NodeKind::kLiteral: {
      int32_t c = n.literals.child(int32_t(f.pos), b);
      if (c >= 0) {
        f.pos = uint32_t(c);
        return n.literals.nodes[size_t(c)].next.empty() ? kConsumedPop : kConsumed;
      }
      if (f.pos != 0 && n.literals.nodes[f.pos].value >= 0) return kPopRetry;
      return kReject;
    }
    case NodeKind::kString: return step_string(f, n, b);
    case NodeKind::kNumber: return step_number(f, false, b);
    case NodeKind::kInteger: return step_number(f, true, b);
    case NodeKind::kObject: return step_object(s, f, n, b);
    case NodeKind::kArray: return step_array(s, f, n, b);
  }
  return kReject;
}

namespace {
// One more character in a string with length limits (Frame::count); without a maxLength it
// counts only up to minLength.
void count_char(Frame& f, const GrammarNode& n) {
  if (n.max_len != UINT32_MAX ? f.count < n.max_len : f.count < n.min_len) ++f.count;
}
}  // namespace

JsonMatcher::Step JsonMatcher::step_string(Frame& f, const GrammarNode& n, uint8_t b) const {
  switch (f.mode) {
    case kStrOpen:
      if (b != '"') return kReject;
      f.mode = kStrBody;
      return kConsumed;
    case kStrBody:
      if (n.format != StringFormat::kNone) {
        if (b == '"') return format_complete(n.format, f.pos) ? kConsumedPop : kReject;
        FormatStep st = format_step(n.format, f.pos, f.aux, b);
        if (!st.ok) return kReject;
        f.pos = st.pos;
        f.aux = b;
        return kConsumed;
      }
      if (f.pos == 0) {
        // A character boundary: the string may close at minLength, and take a character below
        // maxLength (f.count: characters so far; past minLength without a maxLength it stays
        // at minLength, so states do not multiply).
        if (b == '"') return f.count >= n.min_len ? kConsumedPop : kReject;
        if (f.count >= n.max_len) return kReject;
        if (b == '\\') {
          if (n.key) return kReject;
          f.mode = kStrEscape;
          return kConsumed;
        }
        if (b < 0x20) return kReject;
      }
      {
        bool ok;
        f.pos = utf8_next(f.pos, b, &ok);
        if (ok && f.pos == 0) count_char(f, n);
        return ok ? kConsumed : kReject;
      }
    case kStrEscape:
      if (b == 'u') {
        f.mode = kStrUnicode;
        f.aux = 0;
        return kConsumed;
      }
      if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
        f.mode = kStrBody;
        count_char(f, n);
        return kConsumed;
      }
      return kReject;
    case kStrUnicode:
      // \uD800-\uDFFF (surrogates; pairs are rare in model output) are refused: every accepted
      // escape is a whole character.
      if (!is_hex(b) || (f.aux == 0 && (b == 'd' || b == 'D'))) return kReject;
      if (++f.aux == 4) {
        f.mode = kStrBody;
        f.aux = 0;
        count_char(f, n);
      }
      return kConsumed;
  }
  return kReject;
}

JsonMatcher::Step JsonMatcher::step_number(Frame& f, bool integer, uint8_t b) const {
  auto digit_in = [&](uint8_t mode) {
    if (!is_digit(b) || f.pos >= uint32_t(mode == kNumExp ? 2 : kMaxDigits)) return kReject;
    f.mode = mode;
    ++f.pos;
    return kConsumed;
  };
  switch (f.mode) {
    case kNumStart:
    case kNumMinus:
      if (b == '-' && f.mode == kNumStart) {
        f.mode = kNumMinus;
        return kConsumed;
      }
      if (b == '0') {
        f.mode = kNumZero;
        return kConsumed;
      }
      if (is_digit(b)) {
        f.mode = kNumInt;
        f.pos = 1;
        return kConsumed;
      }
      return kReject;
    case kNumZero:
    case kNumInt:
      if (f.mode == kNumInt && is_digit(b)) return digit_in(kNumInt);
      if (!integer && b == '.') {
        f.mode = kNumDot;
        f.pos = 0;
        return kConsumed;
      }
      if (!integer && (b == 'e' || b == 'E')) {
        f.mode = kNumE;
        f.pos = 0;
        return kConsumed;
      }
      return is_digit(b) ? kReject : kPopRetry;
    case kNumDot: return digit_in(kNumFrac);
    case kNumFrac:
      if (is_digit(b)) return digit_in(kNumFrac);
      if (b == 'e' || b == 'E') {
        f.mode = kNumE;
        f.pos = 0;
        return kConsumed;
      }
      return kPopRetry;
    case kNumE:
      if (b == '+' || b == '-') {
        f.mode = kNumESign;
        return kConsumed;
      }
      return digit_in(kNumExp);
    case kNumESign: return digit_in(kNumExp);
    case kNumExp: return is_digit(b) ? digit_in(kNumExp) : kPopRetry;
  }
  return kReject;
}

JsonMatcher::Step JsonMatcher::step_object(MatchState& s, Frame& f, const GrammarNode& n, uint8_t b) const {
  const uint64_t all = n.prop_names.size() >= 64 ? ~uint64_t(0) : (uint64_t(1) << n.prop_names.size()) - 1;
  // The properties whose values fit under the depth limit from here (a key is only begun toward
  // one of them, so no value is left that cannot be written; the required ones always fit: the
  // object was opened only where they do).
  const auto fits = [&](int32_t node) { return s.depth + g_.nodes[size_t(node)].min_frames <= kMaxDepth; };
  uint64_t fit = all;
  if (s.depth + n.max_part_frames > kMaxDepth) {  // near the limit: property by property
    fit = 0;
    for (size_t p = 0; p < n.prop_nodes.size() && p < 64; ++p)
      if (fits(n.prop_nodes[p])) fit |= uint64_t(1) << p;
  }
  const bool free_keys = n.additional >= 0 && fits(n.additional) && fits(g_.free_key);
  const bool more_keys = free_keys || (all & ~f.seen & fit) != 0;
  const bool can_close = (n.required & ~f.seen) == 0;
  auto ws = [&]() {
    if (!is_ws(b) || f.aux >= kMaxWhitespace) return kReject;
    ++f.aux;
    return kConsumed;
  };
  auto begin_key = [&]() -> Step {
    int32_t c = n.keys.child(0, '"');
    if (c >= 0 && (free_keys || (n.keys.nodes[size_t(c)].subtree & ~f.seen & fit))) {
      f.mode = kObjKey;
      f.pos = uint32_t(c);
      f.aux = 0;
      return kConsumed;
    }
    if (!free_keys) return kReject;
    f.mode = kObjFreeKey;
    f.count = kAdditionalProp;
    f.aux = 0;
    if (!push(s, g_.free_key)) return kReject;
    s.f[s.depth - 1].mode = kStrBody;
    return kConsumed;
  };
  switch (f.mode) {
    case kObjOpen:
      if (b != '{') return kReject;
      f.mode = kObjFirst;
      return kConsumed;
    case kObjFirst:
      if (b == '}' && can_close) return kConsumedPop;
      if (b == '"' && more_keys) return begin_key();
      return ws();
    case kObjNeedKey:
      if (b == '"') return begin_key();
      return ws();
    case kObjKey: {
      // Within the listed keys' trie. With additional properties allowed the trie is followed
      // whatever was seen (a seen key is refused at its closing quote, and leaving the trie
      // makes a free key, which cannot spell a listed one); without, only toward unseen keys.
      int32_t c = n.keys.child(int32_t(f.pos), b);
      if (c >= 0 && (free_keys || (n.keys.nodes[size_t(c)].subtree & ~f.seen & fit))) {
        int32_t v = n.keys.nodes[size_t(c)].value;
        if (v >= 0 && b == '"') {  // a listed key, complete
          if ((f.seen & (uint64_t(1) << v)) || !(fit & (uint64_t(1) << v))) return kReject;
          f.count = uint16_t(v);
          f.seen |= uint64_t(1) << v;
          f.mode = kObjColon;
          f.aux = 0;
        }
        f.pos = uint32_t(c);
        return kConsumed;
      }
      if (!free_keys) return kReject;
      // Leaves the listed keys: the rest is a free key (the bytes so far are plain ASCII).
      f.mode = kObjFreeKey;
      f.count = kAdditionalProp;
      if (!push(s, g_.free_key)) return kReject;
      s.f[s.depth - 1].mode = kStrBody;
      return kRetry;
    }
    case kObjAfter:
      if (b == ',' && more_keys) {
        f.mode = kObjNeedKey;
        f.aux = 0;
        return kConsumed;
      }
      if (b == '}' && can_close) return kConsumedPop;
      return ws();
    case kObjColon:
      if (b == ':') {
        f.mode = kObjValue;
        f.aux = 0;
        return kConsumed;
      }
      return ws();
    case kObjValue: {
      if (is_ws(b)) return ws();
      int32_t child = f.count == kAdditionalProp ? n.additional : n.prop_nodes[f.count];
      f.mode = kObjAfter;  // where pop() leaves it too
      f.aux = 0;
      if (!push(s, child)) return kReject;
      return kRetry;
    }
  }
  return kReject;
}

JsonMatcher::Step JsonMatcher::step_array(MatchState& s, Frame& f, const GrammarNode& n, uint8_t b) const {
  auto ws = [&]() {
    if (!is_ws(b) || f.aux >= kMaxWhitespace) return kReject;
    ++f.aux;
    return kConsumed;
  };
  auto item = [&]() -> Step {
    if (is_ws(b)) return ws();
    if (f.count >= n.max_items) return kReject;
    f.aux = 0;
    if (!push(s, n.items)) return kReject;
    return kRetry;
  };
  switch (f.mode) {
    case kArrOpen:
      if (b != '[') return kReject;
      f.mode = kArrFirst;
      return kConsumed;
    case kArrFirst:  // after '[': whitespace, ']' when empty may do, or the first item
      if (b == ']') return n.min_items == 0 ? kConsumedPop : kReject;
      if (is_ws(b)) return ws();
      f.mode = kArrNeedItem;
      return item();
    case kArrNeedItem: return item();
    case kArrAfter:
      if (b == ',' && f.count < n.max_items && s.depth + g_.nodes[size_t(n.items)].min_frames <= kMaxDepth) {
        f.mode = kArrNeedItem;
        f.aux = 0;
        return kConsumed;
      }
      if (b == ']' && f.count >= n.min_items) return kConsumedPop;
      return ws();
  }
  return kReject;
}

bool JsonMatcher::can_end(const MatchState& s) const {
  if (s.depth == 0) return true;
  if (s.depth != 1) return false;
  const Frame& f = s.f[0];
  const GrammarNode& n = g_.nodes[size_t(f.node)];
  if (n.kind == NodeKind::kNumber || n.kind == NodeKind::kInteger)
    return f.mode == kNumZero || f.mode == kNumInt || f.mode == kNumFrac || f.mode == kNumExp;
  if (n.kind == NodeKind::kLiteral) return f.pos != 0 && n.literals.nodes[f.pos].value >= 0;
  return false;
}

bool JsonMatcher::in_free_string(const MatchState& s) const {
  if (s.depth == 0) return false;
  const Frame& f = s.f[s.depth - 1];
  const GrammarNode& n = g_.nodes[size_t(f.node)];
  return n.kind == NodeKind::kString && f.mode == kStrBody && n.format == StringFormat::kNone;
}

uint32_t JsonMatcher::string_room(const MatchState& s) const {
  if (s.depth == 0) return 0;
  const Frame& f = s.f[s.depth - 1];
  const GrammarNode& n = g_.nodes[size_t(f.node)];
  return n.max_len == UINT32_MAX ? UINT32_MAX : n.max_len - f.count;
}

}  // namespace gptoss::structured
