// The engine's two scheduling steps (engine/scheduler.h) on a bare KvManager: admission under
// slots and pages, the micro-batch plan (decodes first, FCFS prefill packing under the budget,
// preemption victims), and a randomized run of plan -> apply whose every plan must apply.
#include <gtest/gtest.h>

#include <random>

#include "engine/scheduler.h"

using namespace gptoss;

namespace {

// Page size 4, sliding window 8 (2 pages + 1), `full` full pages and as many sliding ones.
KvManager make_kv(int full, int sliding = -1) {
  KvManagerConfig c;
  c.page_size = 4;
  c.num_pages[kKvFull] = full;
  c.num_pages[kKvSliding] = sliding < 0 ? full : sliding;
  c.sliding_window = 8;
  return KvManager(c);
}

// A sequence with `computed` positions cached (pages prepared) and `tokens` in all.
SchedSeq seq(KvManager& kv, int64_t id, int32_t computed, int32_t tokens) {
  if (computed > 0) { EXPECT_TRUE(kv.prepare(id, 0, computed)); }
  return {id, computed, tokens};
}

// Applies a plan the way the engine does: victims' pages freed, then every row prepared.
void apply(KvManager& kv, std::vector<SchedSeq>& running, const StepPlan& p) {
  for (int v : p.preempt) kv.free(running[v].id);
  for (const auto& r : p.rows) {
    ASSERT_TRUE(kv.prepare(running[r.seq].id, running[r.seq].num_computed, r.n_tokens)) << "row of seq " << r.seq;
    running[r.seq].num_computed += r.n_tokens;
  }
}

}  // namespace

TEST(Admission, SlotsAndFcfs) {
  KvManager kv = make_kv(1000);
  std::vector<SchedSeq> running;
  EXPECT_EQ(plan_admission(running, {10, 10, 10, 10, 10}, kv, 3), 3);
  running.push_back(seq(kv, 1, 0, 10));
  EXPECT_EQ(plan_admission(running, {10, 10, 10}, kv, 3), 2);
  running.push_back(seq(kv, 2, 0, 10));
  running.push_back(seq(kv, 3, 0, 10));
  EXPECT_EQ(plan_admission(running, {10}, kv, 3), 0);
  EXPECT_EQ(plan_admission({}, {}, kv, 3), 0);
}

// Pages a running sequence still needs for its prompt are promised: admission does not hand
// them to a newcomer (which would end in preemption as soon as both prefill).
TEST(Admission, CountsPagesPromisedToRunningPrefills) {
  KvManager kv = make_kv(20);
  // a running prompt of 40 tokens, nothing cached yet: 11 pages (41 positions) + 1 of growth
  std::vector<SchedSeq> running = {seq(kv, 1, 0, 40)};
  // 20 - 12 = 8 left: a 24-token prompt needs 7 + 1
  EXPECT_EQ(plan_admission(running, {24}, kv, 8), 1);
  EXPECT_EQ(plan_admission(running, {28}, kv, 8), 0);  // 8 + 1 > 8
  // FCFS: a request that does not fit blocks those behind it (no overtaking)
  EXPECT_EQ(plan_admission(running, {28, 1}, kv, 8), 0);
  // the same running sequence with its prompt cached promises only its growth
  KvManager kv2 = make_kv(20);
  std::vector<SchedSeq> cached = {seq(kv2, 1, 40, 41)};
  EXPECT_EQ(plan_admission(cached, {28}, kv2, 8), 0);  // 20 - 11 held - 1 = 8 free < 9
  EXPECT_EQ(plan_admission(cached, {24}, kv2, 8), 1);
}

TEST(Admission, EmptyEngineTakesAnOversizedRequestAlone) {
  KvManager kv = make_kv(4);
  EXPECT_EQ(plan_admission({}, {100, 1}, kv, 8), 1);
  std::vector<SchedSeq> running = {{1, 0, 100}};
  EXPECT_EQ(plan_admission(running, {1}, kv, 8), 0);
}

TEST(PlanStep, DecodesFirstThenFcfsPrefillPacking) {
  KvManager kv = make_kv(1000);
  std::vector<SchedSeq> running = {
      seq(kv, 1, 0, 30),   // prompt of 30, nothing cached
      seq(kv, 2, 20, 21),  // decoding
      seq(kv, 3, 0, 30),   // prompt of 30
      seq(kv, 4, 10, 11),  // decoding
      seq(kv, 5, 0, 30),   // prompt of 30
  };
  StepPlan p = plan_step(running, kv, 48);
  ASSERT_EQ(p.rows.size(), 4u);
  EXPECT_TRUE(p.preempt.empty());
  // every decode, oldest first
  EXPECT_EQ(p.rows[0].seq, 1);
  EXPECT_EQ(p.rows[0].n_tokens, 1);
  EXPECT_EQ(p.rows[1].seq, 3);
  EXPECT_EQ(p.rows[1].n_tokens, 1);
  // then the oldest prompt whole, the next one takes what is left of the budget
  EXPECT_EQ(p.rows[2].seq, 0);
  EXPECT_EQ(p.rows[2].n_tokens, 30);
  EXPECT_EQ(p.rows[3].seq, 2);
  EXPECT_EQ(p.rows[3].n_tokens, 16);
  EXPECT_EQ(p.num_tokens(), 48);
  apply(kv, running, p);
  // seq 0's whole prompt is cached (this step's logits give its first token); seq 2 is halfway
  EXPECT_EQ(running[0].num_computed, 30);
  EXPECT_EQ(running[2].num_computed, 16);
}

// Decodes are never dropped for a prompt, whatever its length (stall-free).
TEST(PlanStep, LongPromptNeverDisplacesDecodes) {
  KvManager kv = make_kv(1000);
  std::vector<SchedSeq> running = {seq(kv, 1, 0, 500)};
  for (int i = 0; i < 6; ++i) running.push_back(seq(kv, 10 + i, 12 + i, 13 + i));
  StepPlan p = plan_step(running, kv, 64);
  ASSERT_EQ(p.rows.size(), 7u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(p.rows[i].n_tokens, 1);
  EXPECT_EQ(p.rows[6].seq, 0);
  EXPECT_EQ(p.rows[6].n_tokens, 58);
}

TEST(PlanStep, PrefillChunkShrinksToFreePages) {
  KvManager kv = make_kv(6, 6);  // 24 positions
  std::vector<SchedSeq> running = {seq(kv, 1, 0, 40)};
  StepPlan p = plan_step(running, kv, 64);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].n_tokens, 24);  // the most that 6 pages hold
  apply(kv, running, p);
  EXPECT_EQ(kv.num_free(kKvFull), 0);
}

// A decode whose page cannot be had preempts the newest running sequence not in the step.
TEST(PlanStep, PreemptsNewestForADecode) {
  KvManager kv = make_kv(8, 100);
  // 1 and 2 decode at a page boundary (each needs a new page); 3 holds the rest.
  std::vector<SchedSeq> running = {seq(kv, 1, 8, 9), seq(kv, 2, 8, 9), seq(kv, 3, 16, 17)};
  ASSERT_EQ(kv.num_free(kKvFull), 0);
  StepPlan p = plan_step(running, kv, 64);
  ASSERT_EQ(p.preempt, std::vector<int>{2});
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_EQ(p.rows[0].seq, 0);
  EXPECT_EQ(p.rows[1].seq, 1);
  apply(kv, running, p);
  EXPECT_FALSE(kv.has(3));
}

// When the only candidate victim is the decoding sequence itself, it is the one preempted.
TEST(PlanStep, PreemptsItselfWhenNewest) {
  KvManager kv = make_kv(4, 100);
  std::vector<SchedSeq> running = {seq(kv, 1, 7, 8), seq(kv, 2, 8, 9)};
  ASSERT_EQ(kv.num_free(kKvFull), 0);
  StepPlan p = plan_step(running, kv, 64);
  // seq 1 fits in its page; seq 2 needs a third page: nobody newer, so itself
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].seq, 0);
  EXPECT_EQ(p.preempt, std::vector<int>{1});
}

TEST(PlanStep, NothingFitsPreemptsNewestOrFailsALoneSequence) {
  KvManager kv = make_kv(4, 100);
  // two half-prefilled prompts hold every page; prefill never preempts
  std::vector<SchedSeq> running = {seq(kv, 1, 8, 30), seq(kv, 2, 8, 30)};
  StepPlan p = plan_step(running, kv, 64);
  EXPECT_TRUE(p.rows.empty());
  EXPECT_EQ(p.preempt, std::vector<int>{1});
  EXPECT_EQ(p.fail, -1);
  KvManager kv1 = make_kv(4, 100);
  std::vector<SchedSeq> alone = {seq(kv1, 1, 16, 30)};
  StepPlan q = plan_step(alone, kv1, 64);
  EXPECT_TRUE(q.rows.empty());
  EXPECT_TRUE(q.preempt.empty());
  EXPECT_EQ(q.fail, 0);
}

// The sliding pool: a decode that releases its oldest sliding page can take a new one even
// when that pool is empty.
TEST(PlanStep, CountsSlidingPagesReleasedByTheStep) {
  KvManager kv = make_kv(100, 3);
  // positions 0..11 hold 3 sliding pages; the query at 12 needs 5..12: page 0 goes, page 3 comes
  std::vector<SchedSeq> running = {seq(kv, 1, 12, 13)};
  ASSERT_EQ(kv.num_free(kKvSliding), 0);
  StepPlan p = plan_step(running, kv, 8);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_TRUE(p.preempt.empty());
  apply(kv, running, p);
}

// Random workloads through admission -> plan -> apply -> "sample" until all finish: every plan
// applies (the simulated page counts are exact), the budget and max_num_seqs hold, every
// decoding sequence not preempted is in every step, and everyone completes.
TEST(PlanStep, RandomWorkloadsAlwaysApplyAndComplete) {
  std::mt19937 rng(7);
  int preemptions = 0, chunked = 0;
  for (int trial = 0; trial < 100; ++trial) {
    int full = 12 + int(rng() % 24), sliding = 6 + int(rng() % 12);
    KvManager kv = make_kv(full, sliding);
    const int budget = 8 + int(rng() % 40), max_seqs = 1 + int(rng() % 6);
    struct Req {
      int64_t id;
      int32_t prompt, max_out;
      int32_t tokens, computed = 0;
    };
    std::vector<Req> waiting, running;
    int pool_positions = full * 4;
    for (int i = 0; i < 12; ++i) {
      int32_t prompt = 1 + int32_t(rng() % 30), out = 1 + int32_t(rng() % 30);
      if (prompt + out > pool_positions) out = std::max(1, pool_positions - prompt - 1);
      if (prompt + out > pool_positions) continue;
      waiting.push_back({i + 1, prompt, out, prompt});
    }
    size_t total = waiting.size(), finished = 0;
    for (int step = 0; step < 5000 && finished < total; ++step) {
      std::vector<SchedSeq> view;
      for (auto& r : running) view.push_back({r.id, r.computed, r.tokens});
      std::vector<int32_t> lengths;
      for (auto& r : waiting) lengths.push_back(r.tokens);
      int admit = plan_admission(view, lengths, kv, max_seqs);
      for (int i = 0; i < admit; ++i) {
        running.push_back(waiting.front());
        waiting.erase(waiting.begin());
      }
      ASSERT_LE(int(running.size()), max_seqs);
      view.clear();
      for (auto& r : running) view.push_back({r.id, r.computed, r.tokens});
      StepPlan p = plan_step(view, kv, budget);
      ASSERT_EQ(p.fail, -1) << "trial " << trial;
      ASSERT_LE(p.num_tokens(), budget);
      std::vector<uint8_t> in_step(running.size(), 0), gone(running.size(), 0);
      for (const auto& r : p.rows) in_step[r.seq] = 1;
      for (int v : p.preempt) gone[v] = 1;
      preemptions += int(p.preempt.size());
      for (const auto& r : p.rows) chunked += r.n_tokens > 1 && view[r.seq].num_computed + r.n_tokens < view[r.seq].num_tokens;
      for (size_t i = 0; i < running.size(); ++i)
        if (view[i].decoding() && !gone[i]) { ASSERT_TRUE(in_step[i]) << i; }
      apply(kv, view, p);
      std::vector<Req> still, requeue;
      for (size_t i = 0; i < running.size(); ++i) {
        Req r = running[i];
        if (gone[i]) {
          r.computed = 0;
          requeue.push_back(r);
          continue;
        }
        r.computed = view[i].num_computed;
        if (in_step[i] && r.computed == r.tokens) {  // a logit row: one more token
          ++r.tokens;
          if (r.tokens - r.prompt >= r.max_out) {
            kv.free(r.id);
            ++finished;
            continue;
          }
        }
        still.push_back(r);
      }
      running = still;
      waiting.insert(waiting.begin(), requeue.begin(), requeue.end());
    }
    EXPECT_EQ(finished, total) << "trial " << trial;
    EXPECT_EQ(kv.num_free(kKvFull), full);
    EXPECT_EQ(kv.num_free(kKvSliding), sliding);
  }
  EXPECT_GT(preemptions, 20);  // the workloads do exercise preemption and chunking
  EXPECT_GT(chunked, 20);
  std::printf("preemptions %d, partial prefill chunks %d\n", preemptions, chunked);
}

// A sequence's own chunk cap (prompt logprobs: a host logits row per position) bounds its chunk;
// the budget it leaves goes to the next prompt.
TEST(PlanStep, PerSequenceChunkCap) {
  KvManager kv = make_kv(1000);
  std::vector<SchedSeq> running = {seq(kv, 1, 0, 300), seq(kv, 2, 0, 300)};
  running[0].max_chunk = 128;
  StepPlan p = plan_step(running, kv, 256);
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_EQ(p.rows[0].n_tokens, 128);
  EXPECT_EQ(p.rows[1].n_tokens, 128);
}
