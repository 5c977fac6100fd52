#pragma once
// Paged KV-cache bookkeeping on the host: which page of which pool holds which positions of
// which sequence. The backend owns the memory; this layer hands it page tables.
//
// Two pools (backend/backend.h KvGroup): full-attention layers keep every position; sliding-
// window layers only need the last `window` positions, so their pages below the window are
// released back to the pool (their table entries become -1).
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "kv/prefix_cache.h"

namespace gptoss {

// A free list of page ids [0, num_pages) for one pool.
class KvBlockPool {
 public:
  explicit KvBlockPool(int num_pages = 0);
  int num_pages() const { return num_pages_; }
  int num_free() const { return int(free_.size()); }
  int num_used() const { return num_pages_ - num_free(); }
  // Returns a page id, or -1 when the pool is empty.
  int32_t allocate();
  void release(int32_t page);

 private:
  int num_pages_ = 0;
  std::vector<int32_t> free_;
  std::vector<uint8_t> in_use_;
};

struct KvManagerConfig {
  int page_size = 16;
  int num_pages[2] = {0, 0};  // full, sliding
  int sliding_window = 128;   // 0 = the model has no sliding layers
  bool has_sliding = true;    // false when the model has no sliding-window layers
  // Keep completed pages for later requests with the same token prefix (kv/prefix_cache.h).
  bool enable_prefix_caching = false;
};

// Per-sequence page tables over the two pools.
//
// With prefix caching, a sequence's completed pages are committed to a PrefixCache per group and
// may then be held by several sequences (read-only); a page goes back to its pool's free list
// only when evicted. "Free" below counts evictable cached pages too: allocation takes a free
// page first, then evicts the least recently released cached one.
//
// Sliding-window layers: a prefix of L tokens is usable only when the sliding pages of its last
// window (those the query at position L sees) are cached as well, so match_prefix() stops at the
// longest block boundary for which both the full pages of the whole prefix and the sliding pages
// of its last window are cached.
class KvManager {
 public:
  explicit KvManager(const KvManagerConfig& cfg);
  const KvManagerConfig& config() const { return cfg_; }

  // Pages (per group) that prepare(seq, start_pos, n_tokens) would newly take. Counts the
  // sliding pages that prepare() releases first as free.
  void pages_needed(int64_t seq, int32_t start_pos, int32_t n_tokens, int out[2]) const;
  bool can_prepare(int64_t seq, int32_t start_pos, int32_t n_tokens) const;
  // Sliding pages that prepare(seq, start_pos, ...) releases before it allocates (those entirely
  // below the window of the query at start_pos).
  int pages_released(int64_t seq, int32_t start_pos) const;
  // Pages seq holds in group g.
  int pages_held(int64_t seq, KvGroup g) const;
  // Pages of group g that free(seq) makes available (shared cached pages stay held by others).
  int pages_freed(int64_t seq, KvGroup g) const;
  // Makes seq's tables cover positions [0, start_pos + n_tokens) (sliding: only from the first
  // position the query at start_pos can see). Releases sliding pages entirely below
  // start_pos - window + 1. Returns false, taking nothing, when a pool lacks pages.
  bool prepare(int64_t seq, int32_t start_pos, int32_t n_tokens);
  // Returns every page of seq to its pool and forgets it.
  void free(int64_t seq);
  // Speculative decoding's rollback: seq keeps only the pages covering positions [0, n_positions)
  // in both groups; pages wholly at or past n_positions go back to their pools. The K/V still in
  // the kept last page past n_positions is stale but never read: the next step writes positions
  // from n_positions on before any query attends to them. No-op for an unknown sequence.
  void truncate(int64_t seq, int32_t n_positions);
  bool has(int64_t seq) const { return tables_.count(seq) != 0; }

  // Prefix caching (no-ops returning 0 when disabled). For a sequence without pages: finds the
  // longest cached prefix of tokens[0, n) that is a whole number of pages, shorter than n (the
  // last token is always computed, for its logits), with its last window's sliding pages cached;
  // gives seq references to those pages and returns the prefix length (seq then starts there).
  int32_t match_prefix(int64_t seq, const int32_t* tokens, int32_t n);
  // Commits seq's pages of the complete blocks among positions [0, n_computed) (computed and
  // written: call after the forward pass) to the cache, keyed by tokens. A block already cached
  // under another page keeps seq's page private.
  void commit(int64_t seq, const int32_t* tokens, int32_t n_computed);
  const PrefixCache& cache(KvGroup g) const { return caches_[g]; }

  // seq's table for group g (sliding entries below the window are -1). Valid until the next
  // prepare/free of that sequence.
  const std::vector<int32_t>& table(int64_t seq, KvGroup g) const;
  // Fills the page-table part of a SeqBatchInfo.
  void fill(int64_t seq, SeqBatchInfo& info) const;

  const KvBlockPool& pool(KvGroup g) const { return pools_[g]; }
  // Free pages, evictable cached ones included.
  int num_free(KvGroup g) const { return pools_[g].num_free() + caches_[g].num_evictable(); }
  int num_used(KvGroup g) const { return pools_[g].num_pages() - num_free(g); }
  // Used fraction of the pools' pages (the larger of the two groups).
  double usage() const;
  // Pages a sequence of `len` positions needs at most in each group.
  void pages_for_length(int32_t len, int out[2]) const;

 private:
  struct Tables {
    std::vector<int32_t> t[2];
    std::vector<uint64_t> keys;  // block keys of the blocks commit() has seen, in order
  };
  int32_t first_needed_sliding_page(int32_t start_pos) const;
  // Would dropping seq's reference to page make it available?
  bool frees_on_drop(KvGroup g, int32_t page) const;
  int32_t take_page(KvGroup g);              // a free page, else an evicted cached one
  void drop_page(KvGroup g, int32_t page);   // seq lets go of page
  KvManagerConfig cfg_;
  KvBlockPool pools_[2];
  PrefixCache caches_[2];
  std::unordered_map<int64_t, Tables> tables_;
};

// How many pages of each group a KV budget buys. `tokens` > 0: the full pool holds that many
// positions; otherwise `bytes` of memory are split between the pools. The sliding pool gets
// what max_num_seqs sequences each holding a window plus one step's chunk need, never more than
// the full pool.
KvManagerConfig plan_kv_pages(const GptOssConfig& c, DType dtype, int page_size, int64_t tokens,
                              size_t bytes, int max_num_seqs, int max_batched_tokens);

}  // namespace gptoss
