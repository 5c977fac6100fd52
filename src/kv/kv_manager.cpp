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
    if (sl[k] >= 0) ++released;
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

bool KvManager::can_prepare(int64_t seq, int32_t start_pos, int32_t n_tokens) const {
  int need[2];
  pages_needed(seq, start_pos, n_tokens, need);
  return need[kKvFull] <= pools_[kKvFull].num_free() &&
         need[kKvSliding] <= pools_[kKvSliding].num_free() + pages_released(seq, start_pos);
}

bool KvManager::prepare(int64_t seq, int32_t start_pos, int32_t n_tokens) {
  if (start_pos < 0 || n_tokens < 0) throw Error("KvManager::prepare: negative position or count");
  if (!can_prepare(seq, start_pos, n_tokens)) return false;
  auto& tb = tables_[seq];
  const int P = cfg_.page_size;
  const int32_t n_total = (start_pos + n_tokens + P - 1) / P;
  auto& full = tb.t[kKvFull];
  while (int32_t(full.size()) < n_total) full.push_back(pools_[kKvFull].allocate());
  if (cfg_.has_sliding) {
    auto& sl = tb.t[kKvSliding];
    int32_t first = first_needed_sliding_page(start_pos);
    for (int32_t k = 0; k < std::min<int32_t>(first, int32_t(sl.size())); ++k)
      if (sl[k] >= 0) {
        pools_[kKvSliding].release(sl[k]);
        sl[k] = -1;
      }
    if (int32_t(sl.size()) < n_total) sl.resize(n_total, -1);
    for (int32_t k = first; k < n_total; ++k)
      if (sl[k] < 0) sl[k] = pools_[kKvSliding].allocate();
  }
  return true;
}

void KvManager::free(int64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (int g = 0; g < 2; ++g)
    for (int32_t p : it->second.t[g])
      if (p >= 0) pools_[g].release(p);
  tables_.erase(it);
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
    if (pools_[g].num_pages() > 0) u = std::max(u, double(pools_[g].num_used()) / pools_[g].num_pages());
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
