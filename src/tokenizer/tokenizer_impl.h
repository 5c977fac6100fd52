#pragma once
// Internals of the tokenizer (not part of the public API; shared with the tests and tools).
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace gptoss {

extern const char* const kO200kPattern;

// Open-addressing map from byte strings to (rank, id), keys stored in one arena.
class ByteMap {
 public:
  static constexpr uint32_t kMissing = 0xFFFFFFFFu;
  struct Entry {
    std::string bytes;
    uint32_t rank;
    uint32_t id;
  };
  void build(const std::vector<Entry>& entries);
  // Rank of `s`, or kMissing.
  uint32_t rank(std::string_view s) const {
    const Slot* sl = lookup(s);
    return sl ? sl->rank : kMissing;
  }
  uint32_t id(std::string_view s) const {
    const Slot* sl = lookup(s);
    return sl ? sl->id : kMissing;
  }
  static uint64_t hash(std::string_view s);
  bool empty() const { return slots_.empty(); }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  struct Slot {
    uint32_t off = 0, len = kEmpty, rank = kMissing, id = kMissing;
  };
  const Slot* lookup(std::string_view s) const {
    if (slots_.empty()) return nullptr;
    size_t i = hash(s) & mask_;
    for (;;) {
      const Slot& sl = slots_[i];
      if (sl.len == kEmpty) return nullptr;
      if (sl.len == s.size() && std::char_traits<char>::compare(arena_.data() + sl.off, s.data(),
                                                                s.size()) == 0)
        return &sl;
      i = (i + 1) & mask_;
    }
  }
  std::string arena_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

class Regex {
 public:
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Leftmost match at or after `start`: [mb, me). False when none.
  bool find(std::string_view s, size_t start, size_t& mb, size_t& me) const;

 private:
  void* code_ = nullptr;
  bool jit_ = false;
};

// Decodes UTF-8 with the WHATWG decoder's replacement rules, appending to `out`. Returns how
// many trailing bytes form an incomplete (valid so far) sequence and were not consumed; with
// `final` they are replaced by one U+FFFD instead (and 0 is returned).
size_t utf8_decode_lossy(std::string_view in, std::string& out, bool final);

// A token's bytes in GPT-2's byte-level alphabet (as tokenizer.json spells its vocabulary and
// token_piece shows tokens), and back (false: a character outside the alphabet).
std::string bytes_to_bl(std::string_view bytes);
bool bl_to_bytes(std::string_view s, std::string& out);

struct Tokenizer::Impl {
  ByteMap ranks;                                      // bytes -> merge rank and id
  ByteMap whole;  // tokenizer.json with ignore_merges: whole-piece tokens no merge produces
  std::unordered_map<std::string, TokenId> id_of_bytes;  // every ordinary token
  std::vector<std::string> bytes_of;                  // id -> bytes (special: its name)
  std::vector<uint8_t> present, special;
  std::unordered_map<std::string, TokenId> specials_by_name;
  std::vector<std::pair<std::string, TokenId>> specials;
  std::vector<size_t> special_lengths;  // distinct name lengths, ascending
  std::string special_prefix;           // common prefix of all names ("<|")
  std::shared_ptr<Regex> regex;

  // Fills the tables. `entries`: tokens BPE may produce (bytes, merge rank, id); `all`: every
  // ordinary token (bytes, id).
  void finish(const std::vector<ByteMap::Entry>& entries,
              std::vector<std::pair<std::string, TokenId>> all,
              std::vector<std::pair<std::string, TokenId>> specials);
  // Pieces longer than this take the O(n log n) path.
  static constexpr size_t kLongPiece = 256;
  void bpe(std::string_view piece, std::vector<TokenId>& out) const;
  void bpe_long(std::string_view piece, std::vector<TokenId>& out) const;
  void encode_ordinary(std::string_view text, std::vector<TokenId>& out) const;
  size_t find_special(std::string_view text, size_t from, TokenId& id, size_t& len) const;
};

}  // namespace gptoss
