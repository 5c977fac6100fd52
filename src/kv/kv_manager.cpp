#include "kv/kv_manager.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace gptoss {

KvBlockPool::KvBlockPool(int num_pages) : num_pages_(num_pages), in_use_(num_pages, 0) {
  free_.reserve(num_pages);
  // Hand out low ids first (pop from the back).
  for (int i = num_pages - 1; i >= 0; --i) free_.push_back(i);
}

int32_t KvBlockPool::allocate() {
  if (free_.empty()) return -1;
  int32_t p = free_.back();
  free_.pop_back();
  in_use_[p] = 1;
  return p;
}

void KvBlockPool::release(int32_t page) {
  if (page < 0 || page >= num_pages_ || !in_use_[page])
    throw Error("KvBlockPool: release of page " + std::to_string(page) + " that is not in use");
  in_use_[page] = 0;
  free_.push_back(page);
}

KvManager::KvManager(const KvManagerConfig& cfg) : cfg_(cfg) {
  if (cfg_.page_size <= 0) throw Error("KvManager: page_size must be positive");
  if (!cfg_.has_sliding || cfg_.sliding_window <= 0) {
    cfg_.has_sliding = false;
    cfg_.num_pages[kKvSliding] = 0;
  }
  pools_[kKvFull] = KvBlockPool(cfg_.num_pages[kKvFull]);
  pools_[kKvSliding] = KvBlockPool(cfg_.num_pages[kKvSliding]);
  for (int g = 0; g < 2; ++g) caches_[g] = PrefixCache(cfg_.num_pages[g]);
}

bool KvManager::frees_on_drop(KvGroup g, int32_t page) const {
  return page >= 0 && (!caches_[g].cached(page) || caches_[g].refs(page) == 1);
}

int32_t KvManager::take_page(KvGroup g) {
  int32_t p = pools_[g].allocate();
  return p >= 0 ? p : caches_[g].evict();
}

void KvManager::drop_page(KvGroup g, int32_t page) {
  if (caches_[g].cached(page))
    caches_[g].unref(page);
  else
    pools_[g].release(page);
}

int32_t KvManager::first_needed_sliding_page(int32_t start_pos) const {
  int32_t first_pos = std::max<int32_t>(0, start_pos - cfg_.sliding_window + 1);
  return first_pos / cfg_.page_size;
}

void KvManager::pages_needed(int64_t seq, int32_t start_pos, int32_t n_tokens, int out[2]) const {
  const int P = cfg_.page_size;
  const int32_t n_total = (start_pos + n_tokens + P - 1) / P;  // pages covering [0, end)
  static const std::vector<int32_t> kEmpty;
  auto it = tables_.find(seq);
  const auto& full = it == tables_.end() ? kEmpty : it->second.t[kKvFull];
  const auto& sl = it == tables_.end() ? kEmpty : it->second.t[kKvSliding];
  out[kKvFull] = std::max<int>(0, n_total - int(full.size()));
  out[kKvSliding] = 0;
  if (cfg_.has_sliding) {
    int32_t first = first_needed_sliding_page(start_pos);
    int need = 0;
    for (int32_t k = first; k < n_total; ++k)
      if (k >= int32_t(sl.size()) || sl[k] < 0) ++need;
    out[kKvSliding] = need;
  }
}

int KvManager::pages_released(int64_t seq, int32_t start_pos) const {
  if (!cfg_.has_sliding) return 0;
  auto it = tables_.find(seq);
  if (it == tables_.end()) return 0;
  const auto& sl = it->second.t[kKvSliding];
  int32_t first = first_needed_sliding_page(start_pos);
  int released = 0;
  for (int32_t k = 0; k < std::min<int32_t>(first, int32_t(sl.size())); ++k)
    if (frees_on_drop(kKvSliding, sl[k])) ++released;
  return released;
}

int KvManager::pages_held(int64_t seq, KvGroup g) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return 0;
  int n = 0;
  for (int32_t p : it->second.t[g])
    if (p >= 0) ++n;
  return n;
}

int KvManager::pages_freed(int64_t seq, KvGroup g) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return 0;
  int n = 0;
  for (int32_t p : it->second.t[g])
    if (frees_on_drop(g, p)) ++n;
  return n;
}

bool KvManager::can_prepare(int64_t seq, int32_t start_pos, int32_t n_tokens) const {
  int need[2];
  pages_needed(seq, start_pos, n_tokens, need);
  return need[kKvFull] <= num_free(kKvFull) &&
         need[kKvSliding] <= num_free(kKvSliding) + pages_released(seq, start_pos);
}

bool KvManager::prepare(int64_t seq, int32_t start_pos, int32_t n_tokens) {
  if (start_pos < 0 || n_tokens < 0) throw Error("KvManager::prepare: negative position or count");
  if (!can_prepare(seq, start_pos, n_tokens)) return false;
  auto& tb = tables_[seq];
  const int P = cfg_.page_size;
  const int32_t n_total = (start_pos + n_tokens + P - 1) / P;
  auto& full = tb.t[kKvFull];
  while (int32_t(full.size()) < n_total) full.push_back(take_page(kKvFull));
  if (cfg_.has_sliding) {
    auto& sl = tb.t[kKvSliding];
    int32_t first = first_needed_sliding_page(start_pos);
    for (int32_t k = 0; k < std::min<int32_t>(first, int32_t(sl.size())); ++k)
      if (sl[k] >= 0) {
        drop_page(kKvSliding, sl[k]);
        sl[k] = -1;
      }
    if (int32_t(sl.size()) < n_total) sl.resize(n_total, -1);
    for (int32_t k = first; k < n_total; ++k)
      if (sl[k] < 0) sl[k] = take_page(kKvSliding);
  }
  return true;
}

void KvManager::free(int64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  // Last block first: its cached page becomes evictable before the ones it extends, so eviction
  // eats prefixes from their tails and keeps the shared heads longest (vLLM does the same).
  for (int g = 0; g < 2; ++g)
    for (auto p = it->second.t[g].rbegin(); p != it->second.t[g].rend(); ++p)
      if (*p >= 0) drop_page(KvGroup(g), *p);
  tables_.erase(it);
}

int32_t KvManager::match_prefix(int64_t seq, const int32_t* tokens, int32_t n) {
  if (!cfg_.enable_prefix_caching || has(seq) || n < 2) return 0;
  const int P = cfg_.page_size;
  const int32_t max_blocks = (n - 1) / P;
  // Full pages: the chain of blocks from the start while each is cached.
  std::vector<uint64_t> keys;
  std::vector<int32_t> full;
  uint64_t parent = kNoParent;
  for (int32_t j = 0; j < max_blocks; ++j) {
    uint64_t key = block_key(parent, tokens + size_t(j) * P, P);
    int32_t page = caches_[kKvFull].find(key, parent, tokens + size_t(j) * P, P);
    if (page < 0) break;
    keys.push_back(key);
    full.push_back(page);
    parent = key;
  }
  // Sliding pages: the longest of those prefixes whose last window is cached too.
  int32_t k = int32_t(full.size());
  std::vector<int32_t> sliding;
  for (; k > 0 && cfg_.has_sliding; --k) {
    const int32_t first = first_needed_sliding_page(k * P);
    sliding.assign(k, -1);
    bool all = true;
    for (int32_t j = first; j < k && all; ++j) {
      sliding[j] = caches_[kKvSliding].find(keys[j], j ? keys[j - 1] : kNoParent, tokens + size_t(j) * P, P);
      all = sliding[j] >= 0;
    }
    if (all) break;
  }
  if (k == 0) return 0;
  Tables& tb = tables_[seq];
  tb.keys.assign(keys.begin(), keys.begin() + k);
  tb.t[kKvFull].assign(full.begin(), full.begin() + k);
  for (int32_t p : tb.t[kKvFull]) caches_[kKvFull].ref(p);
  if (cfg_.has_sliding) {
    tb.t[kKvSliding] = sliding;
    for (int32_t p : sliding)
      if (p >= 0) caches_[kKvSliding].ref(p);
  }
  return k * P;
}

void KvManager::commit(int64_t seq, const int32_t* tokens, int32_t n_computed) {
  if (!cfg_.enable_prefix_caching) return;
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  Tables& tb = it->second;
  const int P = cfg_.page_size;
  const int32_t n_blocks = std::min<int32_t>(n_computed / P, int32_t(tb.t[kKvFull].size()));
  for (int32_t j = int32_t(tb.keys.size()); j < n_blocks; ++j) {
    const int32_t* blk = tokens + size_t(j) * P;
    const uint64_t parent = j ? tb.keys[j - 1] : kNoParent;
    const uint64_t key = block_key(parent, blk, P);
    tb.keys.push_back(key);
    int32_t fp = tb.t[kKvFull][j];
    if (!caches_[kKvFull].cached(fp)) caches_[kKvFull].insert(fp, key, parent, blk, P);
    const auto& sl = tb.t[kKvSliding];
    if (j < int32_t(sl.size()) && sl[j] >= 0 && !caches_[kKvSliding].cached(sl[j]))
      caches_[kKvSliding].insert(sl[j], key, parent, blk, P);
  }
}

// Speculative decoding's rollback.
void KvManager::truncate(int64_t seq, int32_t n_positions) {
  if (n_positions < 0) throw Error("KvManager::truncate: negative position count");
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  const int32_t keep = (n_positions + cfg_.page_size - 1) / cfg_.page_size;
  if (int32_t(it->second.keys.size()) > keep) it->second.keys.resize(keep);
  for (int g = 0; g < 2; ++g) {
    auto& t = it->second.t[g];
    while (int32_t(t.size()) > keep) {
      if (t.back() >= 0) drop_page(KvGroup(g), t.back());  // never a cached block: see commit()
      t.pop_back();
    }
  }
}

const std::vector<int32_t>& KvManager::table(int64_t seq, KvGroup g) const {
  static const std::vector<int32_t> kEmpty;
  auto it = tables_.find(seq);
  return it == tables_.end() ? kEmpty : it->second.t[g];
}

void KvManager::fill(int64_t seq, SeqBatchInfo& info) const {
  for (int g = 0; g < 2; ++g) {
    const auto& t = table(seq, KvGroup(g));
    info.pages[g] = t.empty() ? nullptr : t.data();
    info.n_pages[g] = int32_t(t.size());
  }
}

double KvManager::usage() const {
  double u = 0;
  for (int g = 0; g < 2; ++g)
    if (pools_[g].num_pages() > 0) u = std::max(u, double(num_used(KvGroup(g))) / pools_[g].num_pages());
  return u;
}

void KvManager::pages_for_length(int32_t len, int out[2]) const {
  const int P = cfg_.page_size;
  out[kKvFull] = (len + P - 1) / P;
  out[kKvSliding] = 0;
  if (cfg_.has_sliding) out[kKvSliding] = std::min(out[kKvFull], (cfg_.sliding_window - 1 + P - 1) / P + 1);
}

KvManagerConfig plan_kv_pages(const GptOssConfig& c, DType dtype, int page_size, int64_t tokens,
                              size_t bytes, int max_num_seqs, int max_batched_tokens) {
  KvManagerConfig k;
  k.page_size = page_size;
  k.sliding_window = c.sliding_window;
  k.has_sliding = c.num_sliding_layers() > 0 && c.sliding_window > 0;
  const int P = page_size;
  // Sliding pages: each running sequence holds its window (plus a partial page at each end);
  // one step's prefill chunk may add up to max_batched_tokens more positions.
  int64_t sliding = 0;
  if (k.has_sliding)
    sliding = int64_t(max_num_seqs) * ((c.sliding_window - 1 + P - 1) / P + 2) +
              (max_batched_tokens + P - 1) / P + max_num_seqs;
  size_t bf = kv_page_bytes(c, kKvFull, P, dtype), bs = kv_page_bytes(c, kKvSliding, P, dtype);
  int64_t full = 0;
  if (tokens > 0) {
    full = (tokens + P - 1) / P;
  } else {
    if (bytes == 0) throw Error("plan_kv_pages: neither a token count nor a memory budget");
    size_t sl_bytes = size_t(sliding) * bs;
    if (bf == 0) {
      full = 0;
    } else {
      if (sl_bytes > bytes / 2) {  // tiny budget: split evenly
        sliding = int64_t(bytes / 2 / std::max<size_t>(bs, 1));
        sl_bytes = size_t(sliding) * bs;
      }
      full = int64_t((bytes - sl_bytes) / bf);
    }
  }
  if (k.has_sliding) sliding = std::min(sliding, full);
  if (full < 1) throw Error("KV cache budget too small for a single page");
  if (full > INT32_MAX / 2) full = INT32_MAX / 2;
  k.num_pages[kKvFull] = int(full);
  k.num_pages[kKvSliding] = int(sliding);
  return k;
}

}  // namespace gptoss
