#include "kv/prefix_cache.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace gptoss {

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t block_key(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = mix(parent);
  for (int i = 0; i < n; ++i) h = mix(h ^ uint64_t(uint32_t(tokens[i])));
  return h;
}

int32_t PrefixCache::find(uint64_t key, uint64_t parent, const int32_t* tokens, int n) const {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const Entry& e = pages_[it->second];
  if (e.parent != parent || int(e.tokens.size()) != n || !std::equal(tokens, tokens + n, e.tokens.begin())) return -1;
  return it->second;
}

bool PrefixCache::insert(int32_t page, uint64_t key, uint64_t parent, const int32_t* tokens, int n) {
  if (page < 0 || page >= int32_t(pages_.size())) throw Error("PrefixCache: page " + std::to_string(page) + " out of range");
  if (pages_[page].cached || by_key_.count(key)) return false;
  Entry& e = pages_[page];
  e.cached = true;
  e.refs = 1;
  e.key = key;
  e.parent = parent;
  e.tokens.assign(tokens, tokens + n);
  by_key_[key] = page;
  return true;
}

void PrefixCache::ref(int32_t page) {
  if (!cached(page)) throw Error("PrefixCache: ref of page " + std::to_string(page) + " that is not cached");
  Entry& e = pages_[page];
  if (e.refs++ == 0) lru_.erase(e.lru);
}

void PrefixCache::unref(int32_t page) {
  if (!cached(page) || pages_[page].refs <= 0)
    throw Error("PrefixCache: unref of page " + std::to_string(page) + " that is not referenced");
  Entry& e = pages_[page];
  if (--e.refs == 0) e.lru = lru_.insert(lru_.end(), page);
}

int32_t PrefixCache::evict() {
  if (lru_.empty()) return -1;
  int32_t page = lru_.front();
  lru_.pop_front();
  Entry& e = pages_[page];
  by_key_.erase(e.key);
  e = Entry{};
  return page;
}

}  // namespace gptoss
