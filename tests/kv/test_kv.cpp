#include <gtest/gtest.h>

#include <random>
#include <set>

#include "kv/kv_manager.h"

using namespace gptoss;

TEST(KvBlockPool, AllocateReleaseExhaust) {
  KvBlockPool p(3);
  EXPECT_EQ(p.num_free(), 3);
  std::set<int32_t> got;
  for (int i = 0; i < 3; ++i) got.insert(p.allocate());
  EXPECT_EQ(got, (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(p.allocate(), -1);
  EXPECT_EQ(p.num_used(), 3);
  p.release(1);
  EXPECT_EQ(p.allocate(), 1);
  EXPECT_THROW(p.release(7), std::exception);
  p.release(0);
  EXPECT_THROW(p.release(0), std::exception);  // double free
}

static KvManagerConfig cfg(int full, int sliding, int window = 8, int ps = 4) {
  KvManagerConfig c;
  c.page_size = ps;
  c.num_pages[kKvFull] = full;
  c.num_pages[kKvSliding] = sliding;
  c.sliding_window = window;
  return c;
}

TEST(KvManager, FullGroupCoversPositions) {
  KvManager m(cfg(10, 10));
  ASSERT_TRUE(m.prepare(1, 0, 5));  // positions 0..4 -> 2 pages
  EXPECT_EQ(m.table(1, kKvFull).size(), 2u);
  ASSERT_TRUE(m.prepare(1, 5, 3));  // 0..7 -> still 2 pages
  EXPECT_EQ(m.table(1, kKvFull).size(), 2u);
  ASSERT_TRUE(m.prepare(1, 8, 1));  // 0..8 -> 3
  EXPECT_EQ(m.table(1, kKvFull).size(), 3u);
  SeqBatchInfo info;
  m.fill(1, info);
  EXPECT_EQ(info.n_pages[kKvFull], 3);
  std::set<int32_t> distinct(m.table(1, kKvFull).begin(), m.table(1, kKvFull).end());
  EXPECT_EQ(distinct.size(), 3u);
  m.free(1);
  EXPECT_EQ(m.num_free(kKvFull), 10);
  EXPECT_EQ(m.num_free(kKvSliding), 10);
  EXPECT_FALSE(m.has(1));
}

TEST(KvManager, SlidingWindowReleasesOldPages) {
  // window 8, page 4: the query at position p needs keys p-7..p.
  KvManager m(cfg(100, 100, 8, 4));
  ASSERT_TRUE(m.prepare(1, 0, 12));  // prefill 0..11: first query at 0 needs all -> 3 pages
  EXPECT_EQ(m.table(1, kKvSliding), (std::vector<int32_t>{m.table(1, kKvSliding)[0], m.table(1, kKvSliding)[1],
                                                           m.table(1, kKvSliding)[2]}));
  for (int32_t p : m.table(1, kKvSliding)) EXPECT_GE(p, 0);
  // decode at 12: needs keys 5..12 -> pages 1..3; page 0 (0..3) released.
  ASSERT_TRUE(m.prepare(1, 12, 1));
  auto t = m.table(1, kKvSliding);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0], -1);
  EXPECT_GE(t[1], 0);
  EXPECT_GE(t[3], 0);
  EXPECT_EQ(m.pool(kKvSliding).num_used(), 3);
  // decode at 15: needs 8..15 -> pages 2,3; page 1 (4..7) released.
  ASSERT_TRUE(m.prepare(1, 13, 1));
  ASSERT_TRUE(m.prepare(1, 14, 1));
  EXPECT_GE(m.table(1, kKvSliding)[1], 0);  // 14-7=7 still in page 1
  ASSERT_TRUE(m.prepare(1, 15, 1));
  EXPECT_EQ(m.table(1, kKvSliding)[1], -1);
  EXPECT_EQ(m.pool(kKvSliding).num_used(), 2);
  // Long decode: the sliding group never holds more than 3 pages; full keeps growing.
  for (int32_t pos = 16; pos < 200; ++pos) {
    ASSERT_TRUE(m.prepare(1, pos, 1));
    EXPECT_LE(m.pool(kKvSliding).num_used(), 3);
    // every position the query at pos sees is mapped
    const auto& sl = m.table(1, kKvSliding);
    for (int32_t q = std::max(0, pos - 7); q <= pos; ++q) EXPECT_GE(sl[q / 4], 0) << pos << " " << q;
  }
  EXPECT_EQ(m.pool(kKvFull).num_used(), 50);
  m.free(1);
  EXPECT_EQ(m.pool(kKvSliding).num_used(), 0);
  EXPECT_EQ(m.pool(kKvFull).num_used(), 0);
}

TEST(KvManager, SlidingChunkedPrefill) {
  KvManager m(cfg(100, 100, 8, 4));
  // chunk 1: 0..9; chunk 2: 10..29 (first query at 10 needs 3..) -> pages 0..7 minus none below page 0
  ASSERT_TRUE(m.prepare(1, 0, 10));
  ASSERT_TRUE(m.prepare(1, 10, 20));
  auto t = m.table(1, kKvSliding);
  ASSERT_EQ(t.size(), 8u);
  for (int k = 0; k < 8; ++k) EXPECT_GE(t[k], 0);
  ASSERT_TRUE(m.prepare(1, 30, 1));  // needs 23.. -> page 5 onwards
  t = m.table(1, kKvSliding);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(t[k], -1);
  for (int k = 5; k < 8; ++k) EXPECT_GE(t[k], 0);
}

TEST(KvManager, ExhaustionTakesNothing) {
  KvManager m(cfg(3, 3, 8, 4));
  ASSERT_TRUE(m.prepare(1, 0, 8));  // 2 full, 2 sliding
  EXPECT_FALSE(m.can_prepare(2, 0, 8));
  EXPECT_FALSE(m.prepare(2, 0, 8));  // needs 2, 1 free
  EXPECT_EQ(m.num_free(kKvFull), 1);
  EXPECT_EQ(m.num_free(kKvSliding), 1);
  EXPECT_FALSE(m.has(2));
  ASSERT_TRUE(m.prepare(2, 0, 4));
  EXPECT_FALSE(m.prepare(1, 8, 1));  // full exhausted
  m.free(2);
  ASSERT_TRUE(m.prepare(1, 8, 1));
}

TEST(KvManager, SlidingPoolExhaustionSeparately) {
  // Full pool ample, sliding pool of 2: a long prefill's first chunk needs 3 sliding pages.
  KvManager m(cfg(100, 2, 8, 4));
  EXPECT_FALSE(m.prepare(1, 0, 12));
  ASSERT_TRUE(m.prepare(1, 0, 8));
  // Next step at 8..11: needs pages 0..2 (query 8 sees 1..8) -> 3 pages: fails.
  EXPECT_FALSE(m.prepare(1, 8, 4));
  // Decoding one at a time: position 8 sees 1..8 (pages 0..2): 3 pages, fails too.
  EXPECT_FALSE(m.can_prepare(1, 8, 1));
  int need[2];
  m.pages_needed(1, 12, 1, need);  // query 12 sees 5..12: pages 1..3, page 1 held -> 2 new
  EXPECT_EQ(need[kKvSliding], 2);
  EXPECT_FALSE(m.can_prepare(1, 12, 1));  // page 0 released counts as free: 1 < 2
  m.free(1);
  ASSERT_TRUE(m.prepare(1, 0, 4));
  ASSERT_TRUE(m.prepare(1, 4, 4));
  EXPECT_EQ(m.num_free(kKvSliding), 0);
}

TEST(KvManager, NoSlidingLayers) {
  KvManagerConfig c = cfg(10, 10, 8, 4);
  c.has_sliding = false;
  KvManager m(c);
  ASSERT_TRUE(m.prepare(1, 0, 20));
  EXPECT_TRUE(m.table(1, kKvSliding).empty());
  SeqBatchInfo info;
  m.fill(1, info);
  EXPECT_EQ(info.pages[kKvSliding], nullptr);
  EXPECT_EQ(info.n_pages[kKvFull], 5);
}

TEST(KvManager, ManySequencesRandomized) {
  KvManager m(cfg(64, 40, 8, 4));
  std::vector<int32_t> len(16, 0);
  uint64_t s = 12345;
  auto rnd = [&]() { s = s * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(s >> 33); };
  for (int it = 0; it < 3000; ++it) {
    int q = rnd() % 16;
    if (rnd() % 10 == 0) {
      m.free(q);
      len[q] = 0;
      continue;
    }
    int n = 1 + rnd() % 6;
    if (m.prepare(q, len[q], n)) len[q] += n;
    // invariants: no page shared across sequences/groups
    std::set<int32_t> used[2];
    int count[2] = {0, 0};
    for (int k = 0; k < 16; ++k)
      for (int g = 0; g < 2; ++g)
        for (int32_t p : m.table(k, KvGroup(g)))
          if (p >= 0) {
            used[g].insert(p);
            ++count[g];
          }
    for (int g = 0; g < 2; ++g) {
      EXPECT_EQ(int(used[g].size()), count[g]);
      EXPECT_EQ(count[g], m.pool(KvGroup(g)).num_used());
    }
  }
}

TEST(KvPlan, SizesPools) {
  GptOssConfig c = GptOssConfig::preset("tiny");
  auto k = plan_kv_pages(c, DType::BF16, 16, 4096, 0, 8, 512);
  EXPECT_EQ(k.num_pages[kKvFull], 256);
  EXPECT_GT(k.num_pages[kKvSliding], 0);
  EXPECT_LE(k.num_pages[kKvSliding], 256);
  auto k2 = plan_kv_pages(c, DType::BF16, 16, 0, size_t(64) << 20, 8, 512);
  size_t total = k2.num_pages[0] * kv_page_bytes(c, kKvFull, 16, DType::BF16) +
                 k2.num_pages[1] * kv_page_bytes(c, kKvSliding, 16, DType::BF16);
  EXPECT_LE(total, size_t(64) << 20);
  EXPECT_GT(k2.num_pages[0], 0);
}

// The scheduler plans a step on counts alone (engine/scheduler.h): what prepare() releases and
// what free() returns must match what the pools then show.
TEST(KvManager, ReleasedAndHeldCountsMatchThePools) {
  KvManager m(cfg(100, 100, 8, 4));
  EXPECT_EQ(m.pages_held(1, kKvFull), 0);
  EXPECT_EQ(m.pages_released(1, 50), 0);  // unknown sequence
  ASSERT_TRUE(m.prepare(1, 0, 20));       // 5 full pages, 5 sliding
  EXPECT_EQ(m.pages_held(1, kKvFull), 5);
  EXPECT_EQ(m.pages_held(1, kKvSliding), 5);
  // the query at 20 needs keys 13..20: pages 3.. -> pages 0, 1, 2 go
  EXPECT_EQ(m.pages_released(1, 20), 3);
  int need[2];
  m.pages_needed(1, 20, 1, need);
  int free_sl = m.num_free(kKvSliding);
  ASSERT_TRUE(m.prepare(1, 20, 1));
  EXPECT_EQ(m.num_free(kKvSliding), free_sl + 3 - need[kKvSliding]);
  EXPECT_EQ(m.pages_held(1, kKvSliding), 5 - 3 + need[kKvSliding]);
  EXPECT_EQ(m.pages_released(1, 20), 0);  // already gone
  int held_full = m.pages_held(1, kKvFull), free_full = m.num_free(kKvFull);
  m.free(1);
  EXPECT_EQ(m.num_free(kKvFull), free_full + held_full);
}

// Speculative decoding's rollback: a verify step prepares K+1 positions, the rejected ones are
// truncated away, and the pools balance whatever the accept pattern (no page leaks).
TEST(KvManager, TruncateRollsBackRejectedPositionsInBothGroups) {
  KvManager m(cfg(100, 100, 8, 4));
  ASSERT_TRUE(m.prepare(1, 0, 12));  // prefill 0..11: 3 pages in each group
  ASSERT_TRUE(m.prepare(1, 12, 5));  // verify 12..16 -> 5 pages
  EXPECT_EQ(m.table(1, kKvFull).size(), 5u);
  EXPECT_EQ(m.pages_held(1, kKvSliding), 4);  // page 0 (0..3) fell out of the window of 12
  m.truncate(1, 13);                          // accepted up to position 12: pages 0..3 kept
  EXPECT_EQ(m.table(1, kKvFull).size(), 4u);
  EXPECT_EQ(m.table(1, kKvSliding).size(), 4u);
  EXPECT_EQ(m.table(1, kKvSliding)[0], -1);
  EXPECT_EQ(m.num_free(kKvFull), 96);
  EXPECT_EQ(m.num_free(kKvSliding), 97);
  m.truncate(1, 13);  // idempotent
  EXPECT_EQ(m.num_free(kKvFull), 96);
  m.truncate(99, 3);  // unknown: no-op
  // Random verify/rollback cycles on several sequences: pool counts always match the tables.
  std::mt19937 rng(7);
  int32_t len[4] = {13, 0, 0, 0};
  for (int it = 0; it < 2000; ++it) {
    int64_t s = 1 + int64_t(rng() % 4);
    int32_t k = int32_t(rng() % 5), n = 1 + k;
    if (!m.prepare(s, len[s - 1], n)) continue;
    int32_t acc = int32_t(rng() % (k + 1));
    len[s - 1] += 1 + acc;
    m.truncate(s, len[s - 1]);
    int held[2] = {0, 0};
    for (int64_t q = 1; q <= 4; ++q)
      for (int g = 0; g < 2; ++g) held[g] += m.pages_held(q, KvGroup(g));
    ASSERT_EQ(held[kKvFull] + m.num_free(kKvFull), 100);
    ASSERT_EQ(held[kKvSliding] + m.num_free(kKvSliding), 100);
    ASSERT_EQ(int32_t(m.table(s, kKvFull).size()), (len[s - 1] + 3) / 4);
    if (len[s - 1] > 40) {
      m.free(s);
      len[s - 1] = 0;
    }
  }
  for (int64_t q = 1; q <= 4; ++q) m.free(q);
  EXPECT_EQ(m.num_free(kKvFull), 100);
  EXPECT_EQ(m.num_free(kKvSliding), 100);
}

// Rollback with prefix caching on: a sequence sharing a cached prefix rolls back its verify
// pages; the shared (cached) pages stay with both holders and every page returns at the end.
TEST(KvManager, TruncateKeepsSharedPrefixPages) {
  KvManagerConfig c = cfg(100, 100, 8, 4);
  c.enable_prefix_caching = true;
  KvManager m(c);
  std::vector<int32_t> toks;
  for (int i = 0; i < 40; ++i) toks.push_back(i % 7);
  ASSERT_TRUE(m.prepare(1, 0, 13));
  m.commit(1, toks.data(), 13);  // blocks 0..2 cached
  EXPECT_EQ(m.match_prefix(2, toks.data(), 13), 12);
  ASSERT_TRUE(m.prepare(2, 12, 5));  // verify 12..16 on top of the shared prefix
  m.truncate(2, 13);
  EXPECT_EQ(m.table(2, kKvFull).size(), 4u);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(m.table(2, kKvFull)[j], m.table(1, kKvFull)[j]);
  m.truncate(2, 12);  // down to the shared blocks: nothing shared is released
  EXPECT_EQ(m.table(2, kKvFull).size(), 3u);
  m.free(2);
  m.free(1);
  EXPECT_EQ(m.num_free(kKvFull), 100);
  EXPECT_EQ(m.num_free(kKvSliding), 100);
}
