#include "structured/token_masker.h"

#include <algorithm>
#include <bit>
#include <numeric>

namespace gptoss::structured {

size_t TokenBitset::count() const {
  size_t n = 0;
  for (uint64_t w : words) n += size_t(std::popcount(w));
  return n;
}

namespace {
bool string_byte(uint8_t b) { return b >= 0x20 && b != '"' && b != '\\'; }
}  // namespace

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, const std::vector<bool>& special)
    : bytes_(std::move(token_bytes)), special_(bytes_.size(), false) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    special_[i] = i < special.size() && special[i];
    if (special_[i]) special_ids_.push_back(int32_t(i));
    if (special_[i] || bytes_[i].empty()) continue;
    order.push_back(int32_t(i));
    max_len_ = std::max(max_len_, int(bytes_[i].size()));
    const std::string& b = bytes_[i];
    size_t first = b.find_first_of("\"\\");
    bool plain = std::all_of(b.begin(), b.end(), [](char c) { return string_byte(uint8_t(c)); });
    if (plain) {
      plain_.push_back(int32_t(i));
    } else if (first != std::string::npos &&
               std::all_of(b.begin(), b.begin() + long(first), [](char c) { return uint8_t(c) >= 0x20; })) {
      breakers_.push_back(int32_t(i));
    }
  }
  max_len_ = std::min(max_len_, 255);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });
  // The trie in preorder: a node's subtree is the range [node, subtree_end).
  std::vector<uint32_t> path;
  std::string_view prev;
  for (int32_t id : order) {
    std::string_view t = bytes_[size_t(id)];
    if (t.size() > size_t(max_len_)) continue;
    size_t l = 0;
    while (l < prev.size() && l < t.size() && prev[l] == t[l]) ++l;
    while (path.size() > l) {
      trie_[path.back()].subtree_end = uint32_t(trie_.size());
      path.pop_back();
    }
    for (size_t d = l; d < t.size(); ++d) {
      path.push_back(uint32_t(trie_.size()));
      trie_.push_back(TrieNode{0, -1, uint8_t(t[d]), uint8_t(d + 1)});
    }
    if (trie_[path.back()].token < 0) trie_[path.back()].token = id;
    else aliases_.push_back({trie_[path.back()].token, id});  // same bytes (o200k has none)
    prev = t;
  }
  while (!path.empty()) {
    trie_[path.back()].subtree_end = uint32_t(trie_.size());
    path.pop_back();
  }
  plain_string_tokens(0);  // the state of nearly every string token: ready before the first request
}

void TokenVocabulary::tokens_prefixing(std::string_view text, std::vector<int32_t>& out) const {
  // Down the trie one byte of `text` at a time: a node's children follow it in preorder, each
  // sibling after the previous one's subtree.
  size_t i = 0, end = trie_.size();
  for (unsigned char c : text) {
    while (i < end && trie_[i].byte != c) i = trie_[i].subtree_end;
    if (i >= end) return;
    if (const int32_t t = trie_[i].token; t >= 0) {
      out.push_back(t);
      for (const auto& [in_trie, other] : aliases_)
        if (in_trie == t) out.push_back(other);
    }
    end = trie_[i].subtree_end;
    ++i;
  }
}

std::shared_ptr<const TokenBitset> TokenVocabulary::plain_string_tokens(uint32_t utf8) const {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = plain_by_utf8_.find(utf8);
    if (it != plain_by_utf8_.end()) return it->second;
  }
  auto bits = std::make_shared<TokenBitset>(size());
  for (int32_t id : plain_) {
    uint32_t st = utf8;
    bool ok = true;
    for (unsigned char c : bytes_[size_t(id)]) {
      st = utf8_next(st, c, &ok);
      if (!ok) break;
    }
    if (ok) bits->set(size_t(id));
  }
  std::lock_guard<std::mutex> l(mu_);
  return plain_by_utf8_.emplace(utf8, std::move(bits)).first->second;
}

JsonTokenMasker::JsonTokenMasker(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocabulary> vocab,
                                 size_t max_cached)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), matcher_(*grammar_), max_cached_(max_cached) {}

TokenBitset JsonTokenMasker::compute(const MatchState& state) const {
  const TokenVocabulary& v = *vocab_;
  if (matcher_.in_free_string(state) && matcher_.string_room(state) >= uint32_t(v.max_token_len())) {
    TokenBitset out = *v.plain_string_tokens(state.f[state.depth - 1].pos);
    MatchState s;
    for (int32_t id : v.string_breakers()) {
      s = state;
      if (matcher_.advance(s, v.bytes(id))) out.set(size_t(id));
    }
    return out;
  }
  TokenBitset out(v.size());
  thread_local std::vector<MatchState> st;
  st.resize(size_t(v.max_token_len()) + 1);
  st[0] = state;
  const auto& trie = v.trie();
  const size_t n = trie.size();
  for (size_t k = 0; k < n;) {
    const auto& node = trie[k];
    MatchState& s = st[node.depth];
    s = st[node.depth - 1u];
    if (!matcher_.advance(s, node.byte)) {
      k = node.subtree_end;
      continue;
    }
    if (node.token >= 0) out.set(size_t(node.token));
    ++k;
  }
  for (const auto& [kept, dup] : v.aliases())
    if (out.test(size_t(kept))) out.set(size_t(dup));
  return out;
}

std::shared_ptr<const TokenBitset> JsonTokenMasker::allowed(const MatchState& state) const {
  std::string key = state.key();
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      ++hits_;
      return it->second;
    }
    ++misses_;
  }
  auto bits = std::make_shared<const TokenBitset>(compute(state));
  std::lock_guard<std::mutex> l(mu_);
  if (cache_.size() >= max_cached_) cache_.clear();  // simple bound; states recur quickly
  cache_.emplace(std::move(key), bits);
  return bits;
}

}  // namespace gptoss::structured
