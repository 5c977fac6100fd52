#pragma once
// Allowed-token masks over a whole vocabulary (o200k: 201,088 tokens) from a JSON matcher state.
//
// TokenVocabulary is built once per tokenizer: every ordinary token's bytes in a byte trie laid
// out in preorder (a failed prefix skips its whole subtree), plus the tokens a free string can
// take without leaving it. JsonTokenMasker walks that trie against a matcher state and caches
// the mask per state (states recur: every token inside one free string has the same state).
// Free strings, where almost every token is allowed, do not walk the trie: tokens without '"',
// '\\' or control bytes are taken from a precomputed bitset of the UTF-8 state, and only the
// few thousand holding a '"' or '\\' are run through the matcher.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/token_mask.h"
#include "structured/json_matcher.h"

namespace gptoss::structured {

// One bit per token id.
struct TokenBitset {
  std::vector<uint64_t> words;
  explicit TokenBitset(size_t n = 0) : words((n + 63) / 64, 0) {}
  void set(size_t i) { words[i >> 6] |= uint64_t(1) << (i & 63); }
  bool test(size_t i) const { return i < words.size() * 64 && (words[i >> 6] >> (i & 63)) & 1; }
  size_t count() const;
};

using gptoss::apply_mask;  // common/token_mask.h
inline void apply_mask(const TokenBitset& allowed, float* logits, int vocab) {
  apply_mask(allowed.words.data(), allowed.words.size(), logits, vocab);
}

class TokenVocabulary {
 public:
  // token_bytes[id]: the bytes of ordinary token id; special tokens (and unused ids) have
  // `special[id]` true and never match JSON text.
  TokenVocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& special);
  size_t size() const { return bytes_.size(); }
  std::string_view bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool special(int32_t id) const { return special_[size_t(id)]; }

  struct TrieNode {
    uint32_t subtree_end;  // index just past this node's subtree
    int32_t token;         // token whose bytes end here, -1: none
    uint8_t byte;
    uint8_t depth;         // 1 for the root's children
  };
  const std::vector<TrieNode>& trie() const { return trie_; }
  // Tokens that hold a '"' or '\\' with no control byte before it (checked one by one in a string).
  const std::vector<int32_t>& string_breakers() const { return breakers_; }
  // Tokens made only of string bytes (no '"', '\\', control) valid from UTF-8 state `utf8`.
  std::shared_ptr<const TokenBitset> plain_string_tokens(uint32_t utf8) const;
  int max_token_len() const { return max_len_; }
  // Appends every ordinary token whose bytes are a nonempty prefix of `text` (a walk down the trie).
  void tokens_prefixing(std::string_view text, std::vector<int32_t>& out) const;
  // The special (and unused) ids, ascending.
  const std::vector<int32_t>& special_ids() const { return special_ids_; }
  // (token in the trie, another token with the same bytes)
  const std::vector<std::pair<int32_t, int32_t>>& aliases() const { return aliases_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  std::vector<int32_t> special_ids_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> breakers_;
  std::vector<int32_t> plain_;  // tokens of string bytes only
  std::vector<std::pair<int32_t, int32_t>> aliases_;
  int max_len_ = 0;
  mutable std::mutex mu_;
  mutable std::unordered_map<uint32_t, std::shared_ptr<const TokenBitset>> plain_by_utf8_;
};

class JsonTokenMasker {
 public:
  JsonTokenMasker(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab,
                  size_t max_cached = 256);
  const JsonMatcher& matcher() const { return matcher_; }
  const TokenVocabulary& vocab() const { return *vocab_; }
  // Ordinary tokens allowed after `state` (special tokens are the caller's business). Thread-safe.
  std::shared_ptr<const TokenBitset> allowed(const MatchState& state) const;
  // The same, always computed (no cache): for tests and the benchmark.
  TokenBitset compute(const MatchState& state) const;
  size_t cache_hits() const { return hits_; }
  size_t cache_misses() const { return misses_; }

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  JsonMatcher matcher_;
  size_t max_cached_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const TokenBitset>> cache_;
  mutable size_t hits_ = 0, misses_ = 0;
};

}  // namespace gptoss::structured
