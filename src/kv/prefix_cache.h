#pragma once
// Automatic prefix caching: completed KV pages kept after their sequence lets go of them, keyed
// by the token prefix they were computed from, so a later request with the same prefix (a
// multi-turn chat's history, a shared system prompt) skips its forward pass.
//
// A block is page_size tokens at a page-aligned offset. Its key is a hash chain over the prompt
// (key_j = H(key_{j-1}, tokens of block j), as vLLM does), so equal keys mean equal prefixes up
// to the end of the block. Each entry also stores its parent key and its tokens and a lookup
// compares them: entry j matching proves block j and, by induction over the chain, the whole
// prefix, so a hash collision is a miss, never a wrong page.
//
// Only complete, already computed pages are cached; their contents never change (a sequence
// writes only positions past its cached prefix, whose pages are its own), so sharing needs no
// copy-on-write. Each group (full, sliding) has its own map: the sliding page of block j holds
// the sliding layers' K/V of the same positions. A page is referenced by the sequences whose
// tables hold it; at zero references it stays cached and becomes evictable, least recently
// released first, when its pool runs out of free pages.
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace gptoss {

// The key of block j from the key of block j-1 (kNoParent for block 0).
constexpr uint64_t kNoParent = 0x9e3779b97f4a7c15ull;
uint64_t block_key(uint64_t parent, const int32_t* tokens, int n);

class PrefixCache {
 public:
  explicit PrefixCache(int num_pages = 0) : pages_(num_pages) {}
  // The cached page of this block (verified), or -1.
  int32_t find(uint64_t key, uint64_t parent, const int32_t* tokens, int n) const;
  // Makes page (held by one sequence, so one reference) the cached page of this block. Returns
  // false, changing nothing, when the block already has a page or the page is already cached.
  bool insert(int32_t page, uint64_t key, uint64_t parent, const int32_t* tokens, int n);
  bool cached(int32_t page) const { return page >= 0 && page < int32_t(pages_.size()) && pages_[page].cached; }
  // One more sequence holds this cached page (taking it off the evictable list if it was there).
  void ref(int32_t page);
  // A sequence lets go of this cached page; at zero references it becomes evictable.
  void unref(int32_t page);
  // Forgets the least recently released unreferenced page and returns it (now an ordinary used
  // page of its pool), or -1 when none.
  int32_t evict();
  int num_evictable() const { return int(lru_.size()); }
  int num_cached() const { return int(by_key_.size()); }
  int refs(int32_t page) const { return cached(page) ? pages_[page].refs : 0; }

 private:
  struct Entry {
    bool cached = false;
    int refs = 0;
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator lru;  // valid when cached and refs == 0
  };
  std::vector<Entry> pages_;
  std::unordered_map<uint64_t, int32_t> by_key_;
  std::list<int32_t> lru_;  // front: released longest ago
};

}  // namespace gptoss
