// o200k_harmony byte-level BPE: encode, decode (the files it loads from: tokenizer_files.cpp).
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <limits>
#include <queue>
#include <unordered_map>

#include "common/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace gptoss {

const char* const kO200kPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// ---------------------------------------------------------------------------------------------
// ByteMap: bytes -> value, open addressing over string_views into an arena.

namespace {
inline uint64_t load_tail(const char* p, size_t n) {
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  return v;
}
inline uint64_t mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}
}  // namespace

uint64_t ByteMap::hash(std::string_view s) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (s.size() * 0x100000001b3ull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = mix(h ^ v);
    p += 8;
    n -= 8;
  }
  if (n) h = mix(h ^ load_tail(p, n));
  return h;
}

void ByteMap::build(const std::vector<Entry>& entries) {
  size_t total = 0;
  for (auto& e : entries) total += e.bytes.size();
  arena_.clear();
  arena_.reserve(total);
  size_t cap = 16;
  while (cap < entries.size() * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (auto& e : entries) {
    size_t i = hash(e.bytes) & mask_;
    for (;;) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s.off = static_cast<uint32_t>(arena_.size());
        s.len = static_cast<uint32_t>(e.bytes.size());
        s.rank = e.rank;
        s.id = e.id;
        arena_.append(e.bytes);
        break;
      }
      if (s.len == e.bytes.size() &&
          std::memcmp(arena_.data() + s.off, e.bytes.data(), s.len) == 0) {
        if (e.rank < s.rank) s.rank = e.rank, s.id = e.id;  // duplicate bytes: lowest rank wins
        break;
      }
      i = (i + 1) & mask_;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// UTF-8 (WHATWG decoder semantics: each maximal invalid subpart becomes one U+FFFD).

size_t utf8_decode_lossy(std::string_view in, std::string& out, bool final) {
  static const char kRepl[] = "\xEF\xBF\xBD";
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  size_t n = in.size(), i = 0;
  out.reserve(out.size() + n);
  while (i < n) {
    unsigned b = p[i];
    if (b < 0x80) {
      size_t j = i + 1;
      while (j < n && p[j] < 0x80) ++j;
      out.append(in.data() + i, j - i);
      i = j;
      continue;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      out.append(kRepl, 3);
      ++i;
      continue;
    }
    size_t k = 1;
    bool bad = false;
    for (; k <= need; ++k) {
      if (i + k >= n) break;  // incomplete
      unsigned c = p[i + k];
      unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (c < l || c > h) {
        bad = true;
        break;
      }
    }
    if (bad) {
      out.append(kRepl, 3);
      i += k;  // the offending byte starts over
      continue;
    }
    if (k <= need) {  // ran out of input inside a valid prefix
      if (!final) return n - i;
      out.append(kRepl, 3);
      return 0;
    }
    out.append(in.data() + i, need + 1);
    i += need + 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Regex (PCRE2, JIT).

Regex::Regex(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    throw Error("tokenizer: bad pre-tokenizer regex at offset " + std::to_string(off) + ": " +
                reinterpret_cast<char*>(buf));
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

namespace {
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  MatchState() { pcre2_jit_stack_assign(ctx, nullptr, stack); }
  ~MatchState() {
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(md);
  }
};
}  // namespace

bool Regex::find(std::string_view s, size_t start, size_t& mb, size_t& me) const {
  thread_local MatchState st;
  auto* code = static_cast<pcre2_code*>(code_);
  int rc = jit_ ? pcre2_jit_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0,
                                  st.md, st.ctx)
                : pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0,
                              st.md, st.ctx);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(rc, buf, sizeof buf);
    throw Error(std::string("tokenizer: regex match failed: ") + reinterpret_cast<char*>(buf));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
  mb = ov[0];
  me = ov[1];
  return true;
}

// ---------------------------------------------------------------------------------------------
// BPE.

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  if (uint32_t id = ranks.id(piece); id != ByteMap::kMissing) {
    out.push_back(TokenId(id));
    return;
  }
  if (!whole.empty())
    if (uint32_t id = whole.id(piece); id != ByteMap::kMissing) {
      out.push_back(TokenId(id));
      return;
    }
  if (piece.size() > kLongPiece) {
    bpe_long(piece, out);
    return;
  }
  // tiktoken's merge loop: parts[i].rank = rank of bytes [start_i, start_{i+2}); repeatedly
  // merge the lowest-ranked adjacent pair (the leftmost among equals). Quadratic in the piece
  // length, fastest for the short pieces of ordinary text.
  struct Part {
    uint32_t start, rank;
  };
  constexpr uint32_t kMax = ByteMap::kMissing;
  thread_local std::vector<Part> parts;
  const size_t n = piece.size();
  parts.resize(n + 1);
  for (size_t i = 0; i <= n; ++i) parts[i] = {static_cast<uint32_t>(i), kMax};
  uint32_t min_rank = kMax;
  size_t min_i = 0;
  for (size_t i = 0; i + 1 < n; ++i) {
    uint32_t r = ranks.rank(piece.substr(i, 2));
    parts[i].rank = r;
    if (r < min_rank) min_rank = r, min_i = i;
  }
  auto span_rank = [&](size_t a, size_t b) {  // rank of bytes [start_a, start_b)
    return ranks.rank(piece.substr(parts[a].start, parts[b].start - parts[a].start));
  };
  while (min_rank != kMax) {
    size_t i = min_i;
    // Parts i and i+1 merge (i+1 is removed): neighbours' ranks change.
    if (i > 0) parts[i - 1].rank = span_rank(i - 1, i + 2);
    parts[i].rank = i + 3 < parts.size() ? span_rank(i, i + 3) : kMax;
    parts.erase(parts.begin() + i + 1);
    min_rank = kMax;
    for (size_t j = 0; j + 1 < parts.size(); ++j)
      if (parts[j].rank < min_rank) min_rank = parts[j].rank, min_i = j;
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    uint32_t id = ranks.id(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start));
    if (id == ByteMap::kMissing)
      throw Error("tokenizer: no token for a byte sequence (the vocabulary lacks a single byte)");
    out.push_back(TokenId(id));
  }
}

// The same merges for long pieces (a run of letters with no space, a long run of punctuation)
// in O(n log n): a linked list of parts and a heap of (rank, start), so the lowest rank merges
// first and, among equal ranks, the leftmost, exactly as in the loop above.
void Tokenizer::Impl::bpe_long(std::string_view piece, std::vector<TokenId>& out) const {
  const uint32_t n = static_cast<uint32_t>(piece.size());
  constexpr uint32_t kMax = ByteMap::kMissing;
  std::vector<uint32_t> next(n), prev(n), rank(n, kMax);
  for (uint32_t i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1;  // prev[0] unused
  auto pair_rank = [&](uint32_t i) -> uint32_t {  // rank of part i joined with the next part
    uint32_t j = next[i];
    if (j >= n) return kMax;
    uint32_t end = next[j];  // n when j is the last part
    return ranks.rank(piece.substr(i, end - i));
  };
  using E = std::pair<uint32_t, uint32_t>;  // (rank, start)
  std::priority_queue<E, std::vector<E>, std::greater<E>> heap;
  for (uint32_t i = 0; i + 1 < n; ++i) {
    rank[i] = pair_rank(i);
    if (rank[i] != kMax) heap.push({rank[i], i});
  }
  std::vector<uint8_t> alive(n, 1);
  while (!heap.empty()) {
    auto [r, i] = heap.top();
    heap.pop();
    if (!alive[i] || rank[i] != r) continue;  // stale
    uint32_t j = next[i];
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = i;
    rank[i] = pair_rank(i);
    if (rank[i] != kMax) heap.push({rank[i], i});
    if (i > 0) {
      uint32_t p = prev[i];
      uint32_t pr = pair_rank(p);
      if (pr != rank[p]) {
        rank[p] = pr;
        if (pr != kMax) heap.push({pr, p});
      }
    }
  }
  for (uint32_t i = 0; i < n; i = next[i]) {
    uint32_t id = ranks.id(piece.substr(i, next[i] - i));
    if (id == ByteMap::kMissing)
      throw Error("tokenizer: no token for a byte sequence (the vocabulary lacks a single byte)");
    out.push_back(TokenId(id));
  }
}

void Tokenizer::Impl::encode_ordinary(std::string_view text, std::vector<TokenId>& out) const {
  size_t pos = 0, mb = 0, me = 0;
  while (pos < text.size()) {
    if (!regex->find(text, pos, mb, me)) {
      bpe(text.substr(pos), out);  // bytes no pattern matches (invalid UTF-8)
      break;
    }
    if (mb > pos) bpe(text.substr(pos, mb - pos), out);
    if (me == mb) {  // empty match: cannot happen with o200k, guard anyway
      size_t step = 1;
      bpe(text.substr(mb, step), out);
      pos = mb + step;
      continue;
    }
    bpe(text.substr(mb, me - mb), out);
    pos = me;
  }
}

// Finds the leftmost special token in text[from..): returns its position or npos.
size_t Tokenizer::Impl::find_special(std::string_view text, size_t from, TokenId& id,
                                     size_t& len) const {
  if (specials_by_name.empty()) return std::string_view::npos;
  for (;;) {
    size_t p = text.find(special_prefix, from);
    if (p == std::string_view::npos) return p;
    // Candidates start at p; specials have distinct lengths bounded by max_special_len.
    for (size_t l : special_lengths) {
      if (p + l > text.size()) break;
      auto it = specials_by_name.find(std::string(text.substr(p, l)));
      if (it != specials_by_name.end()) {
        id = it->second;
        len = l;
        return p;
      }
    }
    from = p + 1;
  }
}

// ---------------------------------------------------------------------------------------------
// GPT-2 byte-level spelling (tokenizer.json keys, token_piece).

namespace {

// GPT-2 byte-level alphabet: byte -> code point.
std::array<uint32_t, 256> byte_to_unicode() {
  std::array<uint32_t, 256> m{};
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    m[b] = printable ? b : 256 + n++;
  }
  return m;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 63));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 63)), s += char(0x80 | (cp & 63));
  } else {
    s += char(0xF0 | (cp >> 18)), s += char(0x80 | ((cp >> 12) & 63));
    s += char(0x80 | ((cp >> 6) & 63)), s += char(0x80 | (cp & 63));
  }
}

}  // namespace

std::string bytes_to_bl(std::string_view bytes) {
  static const auto m = byte_to_unicode();
  std::string s;
  for (unsigned char c : bytes) append_utf8(s, m[c]);
  return s;
}

// Byte-level string -> bytes; false when a character is outside the alphabet.
bool bl_to_bytes(std::string_view s, std::string& out) {
  static const auto inv = [] {
    std::unordered_map<uint32_t, uint8_t> inv;
    auto m = byte_to_unicode();
    for (int b = 0; b < 256; ++b) inv[m[b]] = uint8_t(b);
    return inv;
  }();
  out.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    uint32_t cp;
    unsigned c = p[i];
    if (c < 0x80) {
      cp = c, i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < n) {
      cp = ((c & 0x1F) << 6) | (p[i + 1] & 0x3F), i += 2;
    } else {
      return false;  // the alphabet stops at U+0143
    }
    auto it = inv.find(cp);
    if (it == inv.end()) return false;
    out += char(it->second);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Public API.

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (!allow_special) {
    impl_->encode_ordinary(text, out);
    return out;
  }
  size_t pos = 0;
  for (;;) {
    TokenId id = 0;
    size_t len = 0;
    size_t p = impl_->find_special(text, pos, id, len);
    if (p == std::string_view::npos) {
      impl_->encode_ordinary(text.substr(pos), out);
      return out;
    }
    impl_->encode_ordinary(text.substr(pos, p - pos), out);
    out.push_back(id);
    pos = p + len;
  }
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || size_t(id) >= impl_->present.size() || !impl_->present[id])
    throw Error("tokenizer: unknown token id " + std::to_string(id));
  return impl_->bytes_of[id];
}

std::string Tokenizer::token_piece(TokenId id) const {
  std::string_view b = token_bytes(id);
  return is_special(id) ? std::string(b) : bytes_to_bl(b);
}

std::string Tokenizer::decode_bytes(std::span<const TokenId> ids) const {
  std::string s;
  for (TokenId id : ids) s.append(token_bytes(id));
  return s;
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  utf8_decode_lossy(decode_bytes(ids), out, true);
  return out;
}

std::optional<TokenId> Tokenizer::token_id(std::string_view name) const {
  auto it = impl_->specials_by_name.find(std::string(name));
  if (it != impl_->specials_by_name.end()) return it->second;
  if (uint32_t id = impl_->ranks.id(name); id != ByteMap::kMissing) return TokenId(id);
  auto jt = impl_->id_of_bytes.find(std::string(name));
  if (jt != impl_->id_of_bytes.end()) return jt->second;
  return std::nullopt;
}

TokenId Tokenizer::require_token_id(std::string_view name) const {
  auto id = token_id(name);
  if (!id) throw Error("tokenizer: the vocabulary has no token " + std::string(name));
  return *id;
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && size_t(id) < impl_->special.size() && impl_->special[id];
}

bool Tokenizer::has_token(TokenId id) const {
  return id >= 0 && size_t(id) < impl_->present.size() && impl_->present[id];
}

size_t Tokenizer::vocab_size() const { return impl_->present.size(); }

const std::vector<std::pair<std::string, TokenId>>& Tokenizer::special_tokens() const {
  return impl_->specials;
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tok) : tok_(tok) {}

std::string StreamingDecoder::push(TokenId id) {
  pending_.append(tok_.token_bytes(id));
  std::string out;
  size_t keep = utf8_decode_lossy(pending_, out, false);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out;
  utf8_decode_lossy(pending_, out, true);
  pending_.clear();
  return out;
}

}  // namespace gptoss
