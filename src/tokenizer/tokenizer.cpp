// o200k_harmony byte-level BPE: loading (tokenizer.json, .tiktoken), encode, decode.
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <tuple>
#include <fstream>
#include <limits>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/tokenizer_impl.h"

namespace gptoss {

namespace fs = std::filesystem;

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
// Loading.

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw Error("tokenizer: cannot open " + path);
  std::streamsize n = f.tellg();
  if (n < 0) throw Error("tokenizer: cannot read " + path);
  std::string s(static_cast<size_t>(n), '\0');
  f.seekg(0);
  if (!f.read(s.data(), n)) throw Error("tokenizer: cannot read " + path);
  return s;
}

int b64val(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool b64decode(std::string_view s, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : s) {
    if (ch == '=') break;
    int v = b64val(static_cast<unsigned char>(ch));
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return true;
}

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

}  // namespace

void Tokenizer::Impl::finish(const std::vector<ByteMap::Entry>& entries,
                             std::vector<std::pair<std::string, TokenId>> all,
                             std::vector<std::pair<std::string, TokenId>> specials_in) {
  ranks.build(entries);
  size_t n = 0;
  for (auto& [b, id] : all) n = std::max<size_t>(n, size_t(id) + 1);
  for (auto& [name, id] : specials_in) n = std::max<size_t>(n, size_t(id) + 1);
  bytes_of.assign(n, std::string());
  present.assign(n, 0);
  special.assign(n, 0);
  for (auto& [b, id] : all) {
    if (id < 0) throw Error("tokenizer: negative token id");
    present[id] = 1;
    // token_id() looks in `ranks` first: only tokens BPE cannot produce need another entry.
    if (ranks.id(b) != uint32_t(id)) id_of_bytes.emplace(b, id);
    bytes_of[id] = std::move(b);
  }
  std::sort(specials_in.begin(), specials_in.end(),
            [](auto& a, auto& b) { return a.second < b.second; });
  for (auto& [name, id] : specials_in) {
    if (id < 0) throw Error("tokenizer: negative token id");
    if (name.empty()) throw Error("tokenizer: empty special token");
    bytes_of[id] = name;
    present[id] = 1;
    special[id] = 1;
    specials_by_name[name] = id;
    if (std::find(special_lengths.begin(), special_lengths.end(), name.size()) ==
        special_lengths.end())
      special_lengths.push_back(name.size());
  }
  // The references (openai/harmony, tiktoken with the o200k_harmony table) also accept
  // "<|reserved_ID|>" for the named specials from 200013 up (i.e. <|reserved_200018|> is
  // <|endofprompt|>). Accept the same aliases when no token has that name.
  for (auto& [name, id] : specials_in) {
    if (id < 200013 || id >= 201088) continue;
    std::string alias = "<|reserved_" + std::to_string(id) + "|>";
    if (specials_by_name.emplace(alias, id).second &&
        std::find(special_lengths.begin(), special_lengths.end(), alias.size()) ==
            special_lengths.end())
      special_lengths.push_back(alias.size());
  }
  std::sort(special_lengths.begin(), special_lengths.end());
  specials = std::move(specials_in);
  // Common prefix of every special name ("<|"): the scan looks for it first.
  special_prefix.clear();
  if (!specials.empty()) {
    special_prefix = specials[0].first;
    for (auto& [name, id] : specials) {
      size_t k = 0;
      while (k < special_prefix.size() && k < name.size() && special_prefix[k] == name[k]) ++k;
      special_prefix.resize(k);
    }
  }
}

std::vector<std::pair<std::string, TokenId>> o200k_harmony_specials() {
  std::vector<std::pair<std::string, TokenId>> s;
  const std::pair<const char*, TokenId> named[] = {
      {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999}, {"<|return|>", 200002},
      {"<|constrain|>", 200003},   {"<|channel|>", 200005},   {"<|start|>", 200006},
      {"<|end|>", 200007},         {"<|message|>", 200008},   {"<|call|>", 200012},
      {"<|endofprompt|>", 200018}};
  for (TokenId id = 199998; id < 201088; ++id) {
    std::string name;
    for (auto& [n, i] : named)
      if (i == id) name = n;
    if (name.empty()) name = "<|reserved_" + std::to_string(id) + "|>";
    s.emplace_back(name, id);
  }
  return s;
}

namespace {
// Parses a tiktoken ranks file into (bytes, rank).
std::vector<std::pair<std::string, uint32_t>> read_tiktoken(const std::string& path) {
  std::string data = read_file(path);
  std::vector<std::pair<std::string, uint32_t>> out;
  out.reserve(200000);
  size_t pos = 0, line_no = 0;
  std::string bytes;
  while (pos < data.size()) {
    size_t eol = data.find('\n', pos);
    if (eol == std::string::npos) eol = data.size();
    std::string_view line(data.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    auto where = [&] { return "tokenizer: " + path + ":" + std::to_string(line_no) + ": "; };
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos || !b64decode(line.substr(0, sp), bytes) || bytes.empty())
      throw Error(where() + "expected '<base64 token> <rank>'");
    std::string_view rs = line.substr(sp + 1);
    uint64_t rank = 0;
    if (rs.empty()) throw Error(where() + "no rank");
    for (char c : rs) {
      if (c < '0' || c > '9' || rank > 100000000) throw Error(where() + "bad rank");
      rank = rank * 10 + uint64_t(c - '0');
    }
    out.emplace_back(bytes, uint32_t(rank));
  }
  if (out.empty()) throw Error("tokenizer: " + path + " holds no tokens");
  return out;
}
}  // namespace

Tokenizer Tokenizer::from_tiktoken(const std::string& path) {
  auto ranks = read_tiktoken(path);
  auto impl = std::make_shared<Impl>();
  std::vector<ByteMap::Entry> entries;
  std::vector<std::pair<std::string, TokenId>> all;
  entries.reserve(ranks.size());
  all.reserve(ranks.size());
  uint32_t max_rank = 0;
  for (auto& [b, r] : ranks) {
    entries.push_back({b, r, r});
    all.emplace_back(b, TokenId(r));
    max_rank = std::max(max_rank, r);
  }
  impl->regex = std::make_shared<Regex>(kO200kPattern);
  // The o200k_harmony specials sit above the ranks (another ranks file keeps those above its own).
  std::vector<std::pair<std::string, TokenId>> keep;
  for (auto& s : o200k_harmony_specials())
    if (uint32_t(s.second) > max_rank) keep.push_back(s);
  impl->finish(entries, std::move(all), std::move(keep));
  return Tokenizer(std::move(impl));
}

namespace {

// What the loader needs from a tokenizer.json, read with nlohmann's SAX interface (no DOM: the
// o200k file has 200k vocab entries and 450k merges).
struct TokenizerJsonSax : nlohmann::json_sax<nlohmann::json> {
  struct Frame {
    bool obj;
    std::string key;
    size_t items = 0;
  };
  std::vector<Frame> st;
  bool have_model = false, have_vocab = false, ignore_merges = false;
  std::string model_type = "BPE";
  std::vector<std::pair<std::string, int64_t>> vocab;  // byte-level strings
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::pair<std::string, int64_t>> added;
  std::optional<std::string> regex;
  std::string problem;  // first structural problem
  std::vector<std::string> pair;  // a merge given as ["a", "b"]
  std::string added_content;
  int64_t added_id = -1;
  bool added_has_content = false;
  std::string error;

  bool at(size_t depth, const char* k0, const char* k1 = nullptr) const {
    if (st.size() != depth) return false;
    if (st[0].key != k0) return false;
    return !k1 || (st.size() > 1 && st[1].key == k1);
  }
  bool value_number(int64_t v) {
    if (at(3, "model", "vocab") && st[2].obj) vocab.emplace_back(st[2].key, v);
    else if (at(3, "added_tokens") && st[2].obj && st[2].key == "id") added_id = v;
    return true;
  }
  bool value_string(std::string& v) {
    if (at(2, "model", "type")) {
      model_type = v;
    } else if (at(3, "model", "merges") && !st[2].obj) {
      size_t sp = v.find(' ');
      if (sp == std::string::npos) {
        if (problem.empty()) problem = "bad merge '" + v + "'";
      } else {
        merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      }
    } else if (at(4, "model", "merges") && !st[3].obj) {
      pair.push_back(std::move(v));
    } else if (at(3, "added_tokens") && st[2].obj && st[2].key == "content") {
      added_content = v;
      added_has_content = true;
    } else if (!st.empty() && st[0].key == "pre_tokenizer" && st.back().obj &&
               st.back().key == "Regex" && !regex) {
      regex = v;
    }
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool v) override {
    if (at(2, "model", "ignore_merges")) ignore_merges = v;
    return true;
  }
  bool number_integer(number_integer_t v) override { return value_number(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return value_number(v > uint64_t(INT64_MAX) ? -1 : int64_t(v));
  }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t& v) override { return value_string(v); }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    if (at(1, "model")) have_model = true;
    if (at(2, "model", "vocab")) have_vocab = true;
    if (at(2, "added_tokens")) added_id = -1, added_has_content = false;
    st.push_back({true, ""});
    return true;
  }
  bool key(string_t& k) override {
    st.back().key = k;
    return true;
  }
  bool end_object() override {
    st.pop_back();
    if (at(2, "added_tokens")) {
      if (added_id < 0 || !added_has_content) {
        if (problem.empty()) problem = "added token without id or content";
      } else {
        added.emplace_back(added_content, added_id);
      }
    }
    return true;
  }
  bool start_array(std::size_t) override {
    if (at(3, "model", "merges")) pair.clear();
    st.push_back({false, ""});
    return true;
  }
  bool end_array() override {
    st.pop_back();
    if (at(3, "model", "merges")) {
      if (pair.size() != 2) {
        if (problem.empty()) problem = "bad merge entry";
      } else {
        merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
      }
    }
    return true;
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
    error = std::string(e.what()) + " (byte " + std::to_string(pos) + ")";
    return false;
  }
};

}  // namespace

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path) {
  auto bad = [&](const std::string& what) { return Error("tokenizer: " + path + ": " + what); };
  TokenizerJsonSax sax;
  {
    std::string text = read_file(path);
    if (!nlohmann::json::sax_parse(text, &sax) || !sax.error.empty())
      throw bad("invalid JSON: " + sax.error);
  }
  if (!sax.have_model) throw bad("no model");
  if (sax.model_type != "BPE") throw bad("model.type must be BPE");
  if (!sax.have_vocab) throw bad("model.vocab missing");
  if (!sax.problem.empty()) throw bad(sax.problem);
  auto impl = std::make_shared<Impl>();
  std::string bytes;
  std::vector<std::pair<std::string, TokenId>> all;
  all.reserve(sax.vocab.size());
  std::unordered_map<std::string, TokenId> vocab;  // bytes -> id
  vocab.reserve(sax.vocab.size() * 2);
  for (auto& [key, id] : sax.vocab) {
    if (!bl_to_bytes(key, bytes) || bytes.empty())
      throw bad("vocab entry outside the byte-level alphabet: " + key);
    if (id < 0 || id > 100000000) throw bad("bad id for vocab entry " + key);
    vocab.emplace(bytes, TokenId(id));
    all.emplace_back(bytes, TokenId(id));
  }
  sax.vocab.clear();
  // Merge priority: a byte string's rank is the index of the first merge producing it (merges
  // rank after the 256 single bytes). BPE then only produces single bytes and merge results.
  std::vector<ByteMap::Entry> entries;
  std::unordered_map<std::string, uint32_t> merged;
  merged.reserve(sax.merges.size() * 2);
  std::string a, b;
  uint32_t idx = 0;
  for (auto& [left, right] : sax.merges) {
    if (!bl_to_bytes(left, a) || !bl_to_bytes(right, b))
      throw bad("merge outside the byte-level alphabet: " + left + " " + right);
    if (!vocab.count(a) || !vocab.count(b)) throw bad("merge of unknown tokens: " + left + " " + right);
    std::string ab = a + b;
    if (!vocab.count(ab)) throw bad("merge result not in vocab: " + left + " " + right);
    merged.emplace(std::move(ab), 256 + idx++);
  }
  sax.merges.clear();
  entries.reserve(vocab.size());
  std::vector<ByteMap::Entry> whole;  // with ignore_merges: tokens no merge produces
  for (auto& [bs, id] : vocab) {
    if (auto it = merged.find(bs); it != merged.end())
      entries.push_back({bs, it->second, uint32_t(id)});
    else if (bs.size() == 1)
      entries.push_back({bs, uint32_t(uint8_t(bs[0])), uint32_t(id)});
    else if (sax.ignore_merges)
      whole.push_back({bs, ByteMap::kMissing, uint32_t(id)});
  }
  // ignore_merges: a pre-tokenized piece that is a vocab entry is that token, merges or not.
  if (!whole.empty()) impl->whole.build(whole);
  // Pre-tokenizer: the Split regex if there is one, else o200k's.
  impl->regex = std::make_shared<Regex>(sax.regex ? *sax.regex : std::string(kO200kPattern));
  std::vector<std::pair<std::string, TokenId>> specials;
  for (auto& [content, id] : sax.added) {
    if (id > 100000000) throw bad("bad id for added token " + content);
    specials.emplace_back(content, TokenId(id));
  }
  impl->finish(entries, std::move(all), std::move(specials));
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    fs::path p = fs::path(path) / "tokenizer.json";
    if (!fs::exists(p))
      throw Error("tokenizer: model directory " + path + " has no tokenizer.json");
    return from_tokenizer_json(p.string());
  }
  if (!fs::exists(path, ec)) throw Error("tokenizer: no such file: " + path);
  if (path.size() >= 9 && path.compare(path.size() - 9, 9, ".tiktoken") == 0)
    return from_tiktoken(path);
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0)
    return from_tokenizer_json(path);
  // Sniff: JSON starts with '{'.
  std::ifstream f(path, std::ios::binary);
  char c = 0;
  while (f.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  return c == '{' ? from_tokenizer_json(path) : from_tiktoken(path);
}

std::string default_tiktoken_path() {
  if (const char* e = std::getenv("GPTOSS_TIKTOKEN"); e && *e) {
    if (!fs::exists(e))
      throw Error(std::string("tokenizer: GPTOSS_TIKTOKEN=") + e + " does not exist");
    return e;
  }
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    base = x;
  else if (const char* h = std::getenv("HOME"); h && *h)
    base = std::string(h) + "/.cache";
  else
    base = ".cache";
  std::string p = base + "/gptoss/o200k_base.tiktoken";
  if (!fs::exists(p))
    throw Error("tokenizer: the o200k vocabulary " + p +
                " is missing; run scripts/setup.sh (or set GPTOSS_TIKTOKEN)");
  return p;
}

Tokenizer Tokenizer::o200k_harmony() { return from_tiktoken(default_tiktoken_path()); }

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

// ---------------------------------------------------------------------------------------------
// tokenizer.json writer.

void write_harmony_tokenizer_json(const std::string& tiktoken_path, const std::string& out_path) {
  auto ranks = read_tiktoken(tiktoken_path);
  std::vector<std::string> tokens;  // by rank
  std::unordered_map<std::string, uint32_t> rank;
  for (auto& [b, r] : ranks) {
    if (tokens.size() <= r) tokens.resize(r + 1);
    tokens[r] = b;
    rank.emplace(b, r);
  }
  // Merges, as Hugging Face's tiktoken converter makes them: every split (l, r) of a token
  // whose halves are both tokens, ordered by the token's rank, then by the halves' ranks.
  struct M {
    uint32_t r, lr, rr;
    uint32_t split;
  };
  std::vector<M> merges;
  for (uint32_t r = 0; r < tokens.size(); ++r) {
    const std::string& t = tokens[r];
    if (t.size() < 2) continue;
    size_t first = merges.size();
    for (size_t i = 1; i < t.size(); ++i) {
      auto l = rank.find(t.substr(0, i));
      if (l == rank.end()) continue;
      auto rr = rank.find(t.substr(i));
      if (rr == rank.end()) continue;
      merges.push_back({r, l->second, rr->second, uint32_t(i)});
    }
    std::sort(merges.begin() + first, merges.end(),
              [](const M& a, const M& b) { return std::tie(a.lr, a.rr) < std::tie(b.lr, b.rr); });
  }
  std::ofstream f(out_path, std::ios::binary);
  if (!f) throw Error("tokenizer: cannot write " + out_path);
  auto q = [](const std::string& s) { return nlohmann::json(s).dump(); };
  f << "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  f << "  \"added_tokens\": [";
  bool first = true;
  for (auto& [name, id] : o200k_harmony_specials()) {
    f << (first ? "\n" : ",\n") << "    {\"id\": " << id << ", \"content\": " << q(name)
      << ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false,"
         " \"special\": true}";
    first = false;
  }
  f << "\n  ],\n  \"normalizer\": null,\n";
  f << "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n"
       "    {\"type\": \"Split\", \"pattern\": {\"Regex\": "
    << q(kO200kPattern)
    << "}, \"behavior\": \"Isolated\", \"invert\": false},\n"
       "    {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true,"
       " \"use_regex\": false}]},\n";
  f << "  \"post_processor\": null,\n";
  f << "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true,"
       " \"use_regex\": true},\n";
  f << "  \"model\": {\n    \"type\": \"BPE\", \"dropout\": null, \"unk_token\": null,"
       " \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null,"
       " \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n";
  f << "    \"vocab\": {";
  for (uint32_t r = 0; r < tokens.size(); ++r)
    f << (r ? ",\n      " : "\n      ") << q(bytes_to_bl(tokens[r])) << ": " << r;
  f << "\n    },\n    \"merges\": [";
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& t = tokens[merges[i].r];
    f << (i ? ",\n      " : "\n      ") << "[" << q(bytes_to_bl(t.substr(0, merges[i].split)))
      << ", " << q(bytes_to_bl(t.substr(merges[i].split))) << "]";
  }
  f << "\n    ]\n  }\n}\n";
  if (!f) throw Error("tokenizer: failed writing " + out_path);
}

}  // namespace gptoss
