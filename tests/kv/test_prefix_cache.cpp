// Prefix caching in the KV manager: hits are block-aligned and verified, hits need the sliding
// pages of the prefix's last window, shared pages are never handed out for writing, references
// and pool counts balance, and LRU eviction under memory pressure.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "kv/kv_manager.h"

using namespace gptoss;

namespace {

KvManagerConfig cfg(int full, int sliding, int window = 8, int ps = 4) {
  KvManagerConfig c;
  c.page_size = ps;
  c.num_pages[kKvFull] = full;
  c.num_pages[kKvSliding] = sliding;
  c.sliding_window = window;
  c.enable_prefix_caching = true;
  return c;
}

std::vector<int32_t> seq_tokens(int n, int salt = 0) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 7 + salt * 13 + 1) % 97);
  return t;
}

// Runs a sequence's prefill of tokens in one chunk, then commits it.
void prefill(KvManager& m, int64_t seq, const std::vector<int32_t>& t, int32_t from = 0) {
  ASSERT_TRUE(m.prepare(seq, from, int32_t(t.size()) - from));
  m.commit(seq, t.data(), int32_t(t.size()));
}

void expect_all_free(const KvManager& m) {
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(m.num_free(KvGroup(g)), m.pool(KvGroup(g)).num_pages()) << g;
    EXPECT_EQ(m.num_used(KvGroup(g)), 0) << g;
  }
}

}  // namespace

TEST(PrefixCache, DisabledNeverHits) {
  KvManagerConfig c = cfg(20, 20);
  c.enable_prefix_caching = false;
  KvManager m(c);
  auto t = seq_tokens(21);
  prefill(m, 1, t);
  m.free(1);
  EXPECT_EQ(m.match_prefix(2, t.data(), 21), 0);
  EXPECT_EQ(m.cache(kKvFull).num_cached(), 0);
  expect_all_free(m);
}

TEST(PrefixCache, HitIsBlockAlignedAndLeavesTheLastTokenToCompute) {
  KvManager m(cfg(20, 20));
  auto t = seq_tokens(21);
  prefill(m, 1, t);  // 5 complete blocks committed, block 5 (position 20) partial
  std::vector<int32_t> t1_full = m.table(1, kKvFull);
  m.free(1);
  expect_all_free(m);  // cached pages count as free (evictable)
  EXPECT_EQ(m.cache(kKvFull).num_cached(), 5);
  // Same 21 tokens: 20 are cached, but the last must be computed -> 20.
  EXPECT_EQ(m.match_prefix(2, t.data(), 21), 20);
  for (int j = 0; j < 5; ++j) EXPECT_EQ(m.table(2, kKvFull)[j], t1_full[j]);
  // Exactly 20 tokens: the last one is computed, so only 16 are taken.
  EXPECT_EQ(m.match_prefix(3, t.data(), 20), 16);
  // A prompt diverging at token 10: blocks 0 and 1 only.
  auto d = t;
  d[10] = 96;
  EXPECT_EQ(m.match_prefix(4, d.data(), 21), 8);
  // Different from the first token: nothing.
  auto e = seq_tokens(21, 5);
  EXPECT_EQ(m.match_prefix(5, e.data(), 21), 0);
  EXPECT_FALSE(m.has(5));
  // A sequence that already has pages is never matched again.
  EXPECT_EQ(m.match_prefix(2, t.data(), 21), 0);
  for (int64_t s : {2, 3, 4}) m.free(s);
  expect_all_free(m);
}

TEST(PrefixCache, SharedPagesAreNeverWrittenAndRefsBalance) {
  KvManager m(cfg(30, 30));
  auto t = seq_tokens(40);
  prefill(m, 1, t);  // 10 blocks
  // Two later sequences share the first 32 tokens while seq 1 still runs.
  auto a = t, b = t;
  a.resize(34);
  b.resize(36);
  b[33] = 5;
  ASSERT_EQ(m.match_prefix(2, a.data(), 34), 32);
  ASSERT_EQ(m.match_prefix(3, b.data(), 36), 32);
  const auto& full1 = m.table(1, kKvFull);
  EXPECT_EQ(m.cache(kKvFull).refs(full1[0]), 3);
  ASSERT_TRUE(m.prepare(2, 32, 2));
  ASSERT_TRUE(m.prepare(3, 32, 4));
  // The pages they write (block 8 on) are their own.
  std::set<int32_t> shared(full1.begin(), full1.end());
  EXPECT_EQ(shared.count(m.table(2, kKvFull)[8]), 0u);
  EXPECT_EQ(shared.count(m.table(3, kKvFull)[8]), 0u);
  EXPECT_NE(m.table(2, kKvFull)[8], m.table(3, kKvFull)[8]);
  EXPECT_EQ(shared.count(m.table(2, kKvSliding)[8]), 0u);
  EXPECT_NE(m.table(2, kKvSliding)[8], m.table(3, kKvSliding)[8]);
  // Freeing seq 1 keeps the shared pages held; pages_freed says so beforehand.
  EXPECT_EQ(m.pages_freed(1, kKvFull), 2);  // blocks 8, 9: only seq 1 holds them
  int free_before = m.num_free(kKvFull);
  m.free(1);
  EXPECT_EQ(m.num_free(kKvFull), free_before + 2);
  EXPECT_EQ(m.cache(kKvFull).refs(m.table(2, kKvFull)[0]), 2);
  m.free(2);
  m.free(3);
  expect_all_free(m);
}

TEST(PrefixCache, HitNeedsTheSlidingPagesOfTheLastWindow) {
  // window 8, page 4: the query at position L sees L-7..L, so a prefix of L = 4k tokens needs
  // the sliding pages of blocks k-2 and k-1.
  KvManager m(cfg(30, 30, 8, 4));
  auto t = seq_tokens(25);
  ASSERT_TRUE(m.prepare(1, 0, 24));
  ASSERT_TRUE(m.prepare(1, 24, 1));  // releases sliding blocks 0..3 before they are committed
  m.commit(1, t.data(), 25);
  EXPECT_EQ(m.cache(kKvFull).num_cached(), 6);
  EXPECT_EQ(m.cache(kKvSliding).num_cached(), 2);  // blocks 4, 5
  m.free(1);
  // The whole 24-token prefix: its window (blocks 4, 5) is cached.
  auto u = t;
  u.push_back(3);
  u.push_back(4);
  EXPECT_EQ(m.match_prefix(2, u.data(), int32_t(u.size())), 24);
  EXPECT_EQ(m.table(2, kKvSliding)[3], -1);
  EXPECT_GE(m.table(2, kKvSliding)[4], 0);
  // Diverging at token 17: full blocks 0..3 are cached, but no shorter prefix's window is.
  auto v = t;
  v[17] = 90;
  EXPECT_EQ(m.match_prefix(3, v.data(), 25), 0);
  EXPECT_FALSE(m.has(3));
  m.free(2);
  expect_all_free(m);
}

TEST(PrefixCache, SlidingPagesReleasedDuringDecodeStayCached) {
  KvManager m(cfg(30, 30, 8, 4));
  auto t = seq_tokens(40);
  prefill(m, 1, std::vector<int32_t>(t.begin(), t.begin() + 12));
  for (int32_t p = 12; p < 40; ++p) {  // decode, committing after each step
    ASSERT_TRUE(m.prepare(1, p, 1));
    m.commit(1, t.data(), p + 1);
  }
  m.free(1);
  // A second turn that shares only the first 12 tokens hits there: the window of position 12
  // (blocks 1, 2) was released long ago but stayed cached.
  auto u = t;
  u.resize(20);
  u[12] = 91;
  EXPECT_EQ(m.match_prefix(2, u.data(), 20), 12);
  m.free(2);
  expect_all_free(m);
}

TEST(PrefixCache, EvictsLeastRecentlyReleasedUnderPressure) {
  KvManager m(cfg(6, 6, 8, 4));
  auto a = seq_tokens(9, 1), b = seq_tokens(9, 2);
  prefill(m, 1, a);  // 3 pages, blocks 0, 1 cached
  m.free(1);
  prefill(m, 2, b);
  m.free(2);
  EXPECT_EQ(m.cache(kKvFull).num_cached(), 4);
  EXPECT_EQ(m.num_free(kKvFull), 6);
  // 5 pages for a new sequence: 2 free ones, then the cached ones least recently released, each
  // sequence's tail block first: a's blocks 1 and 0, then b's block 1.
  auto c = seq_tokens(20, 3);
  ASSERT_TRUE(m.prepare(3, 0, 20));
  EXPECT_EQ(m.num_free(kKvFull), 1);
  EXPECT_EQ(m.match_prefix(4, a.data(), 9), 0);
  EXPECT_EQ(m.match_prefix(5, b.data(), 9), 4);  // b's block 0 stays
  m.free(3);
  m.free(5);
  expect_all_free(m);
  // Not enough pages even after evicting everything unreferenced: prepare takes nothing.
  ASSERT_EQ(m.match_prefix(6, b.data(), 9), 4);
  EXPECT_FALSE(m.prepare(7, 0, 25));
  m.free(6);
  expect_all_free(m);
}

// Random sequences drawn from a few shared prefixes, prepared in random chunks, committed,
// matched, freed: the pool counts always agree with the tables, no page is held by two
// sequences unless it is a cached page, and everything balances at the end.
TEST(PrefixCache, RandomizedBalance) {
  std::mt19937 rng(7);
  KvManager m(cfg(60, 40, 8, 4));
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 4; ++i) bases.push_back(seq_tokens(64, i));
  struct Live {
    std::vector<int32_t> tokens;
    int32_t computed;
  };
  std::map<int64_t, Live> live;
  int64_t next = 1;
  int64_t hits = 0;
  for (int it = 0; it < 3000; ++it) {
    int op = int(rng() % 4);
    if (op == 0 && live.size() < 8) {
      auto t = bases[rng() % bases.size()];
      t.resize(8 + rng() % 50);
      if (rng() % 2) t[rng() % t.size()] = int32_t(rng() % 97);
      int64_t id = next++;
      int32_t hit = m.match_prefix(id, t.data(), int32_t(t.size()));
      ASSERT_EQ(hit % 4, 0);
      ASSERT_LT(hit, int32_t(t.size()));
      hits += hit > 0;
      live[id] = {t, hit};
    } else if (op == 1 && !live.empty()) {
      auto itr = std::next(live.begin(), rng() % live.size());
      Live& l = itr->second;
      int32_t left = int32_t(l.tokens.size()) - l.computed;
      if (left == 0) continue;
      int32_t n = 1 + int32_t(rng() % left);
      if (!m.prepare(itr->first, l.computed, n)) continue;
      l.computed += n;
      m.commit(itr->first, l.tokens.data(), l.computed);
    } else if (op == 2 && !live.empty()) {
      auto itr = std::next(live.begin(), rng() % live.size());
      m.free(itr->first);
      live.erase(itr);
    }
    // Invariants: a page in two live tables is a cached page; counts agree with the tables.
    for (int g = 0; g < 2; ++g) {
      std::map<int32_t, int> holders;
      for (auto& [id, l] : live)
        for (int32_t p : m.table(id, KvGroup(g)))
          if (p >= 0) ++holders[p];
      int distinct = int(holders.size());
      for (auto& [p, n] : holders) {
        if (n > 1) { ASSERT_TRUE(m.cache(KvGroup(g)).cached(p)) << "page " << p << " shared but not cached"; }
        if (m.cache(KvGroup(g)).cached(p)) { ASSERT_EQ(m.cache(KvGroup(g)).refs(p), n); }
      }
      ASSERT_EQ(m.num_used(KvGroup(g)), distinct) << "group " << g << " iteration " << it;
    }
  }
  for (auto& [id, l] : live) m.free(id);
  expect_all_free(m);
  EXPECT_GT(hits, 50);
}
