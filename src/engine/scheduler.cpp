#include "engine/scheduler.h"

#include <algorithm>

namespace gptoss {

namespace {

// Free pages of both pools as a plan would leave them: starts from the pools, then each
// planned row takes its new pages (after the sliding pages its prepare() releases) and each
// victim gives back what it holds. Each sequence is planned at most once per step, so the
// KvManager's tables (unchanged while planning) answer for it.
struct PageLedger {
  const KvManager& kv;
  int free[2];
  explicit PageLedger(const KvManager& k) : kv(k) {
    free[kKvFull] = k.num_free(kKvFull);
    free[kKvSliding] = k.num_free(kKvSliding);
  }
  bool fits(const SchedSeq& s, int32_t n) const {
    int need[2];
    kv.pages_needed(s.id, s.num_computed, n, need);
    return need[kKvFull] <= free[kKvFull] && need[kKvSliding] <= free[kKvSliding] + kv.pages_released(s.id, s.num_computed);
  }
  void take(const SchedSeq& s, int32_t n) {
    int need[2];
    kv.pages_needed(s.id, s.num_computed, n, need);
    free[kKvFull] -= need[kKvFull];
    free[kKvSliding] += kv.pages_released(s.id, s.num_computed) - need[kKvSliding];
  }
  // Grows a row planned with `from` tokens to `to` tokens, if the extra pages are free.
  bool extend(const SchedSeq& s, int32_t from, int32_t to) {
    int a[2], b[2];
    kv.pages_needed(s.id, s.num_computed, from, a);
    kv.pages_needed(s.id, s.num_computed, to, b);
    if (b[kKvFull] - a[kKvFull] > free[kKvFull] || b[kKvSliding] - a[kKvSliding] > free[kKvSliding]) return false;
    free[kKvFull] -= b[kKvFull] - a[kKvFull];
    free[kKvSliding] -= b[kKvSliding] - a[kKvSliding];
    return true;
  }
  void give_back(const SchedSeq& s) {
    free[kKvFull] += kv.pages_freed(s.id, kKvFull);
    free[kKvSliding] += kv.pages_freed(s.id, kKvSliding);
  }
};

}  // namespace

int StepPlan::num_tokens() const {
  int n = 0;
  for (const auto& r : rows) n += r.n_tokens;
  return n;
}

int plan_admission(const std::vector<SchedSeq>& running, const std::vector<int32_t>& waiting_lengths,
                   const KvManager& kv, int max_num_seqs) {
  // Pages promised to running sequences: what each still lacks for its whole context plus one
  // position, and one page of growth each.
  int avail[2] = {kv.num_free(kKvFull), kv.num_free(kKvSliding)};
  for (const auto& s : running) {
    int need[2];
    kv.pages_for_length(s.num_tokens + 1, need);
    for (int g = 0; g < 2; ++g) avail[g] -= std::max(0, need[g] - kv.pages_held(s.id, KvGroup(g))) + 1;
  }
  int admitted = 0;
  int n_running = int(running.size());
  for (int32_t len : waiting_lengths) {
    if (n_running >= max_num_seqs) break;
    int need[2];
    kv.pages_for_length(len + 1, need);
    bool fits = need[kKvFull] + 1 <= avail[kKvFull] && need[kKvSliding] + 1 <= avail[kKvSliding];
    if (!fits) {
      if (n_running == 0) ++admitted;  // alone in an empty engine: it gets what there is
      break;
    }
    for (int g = 0; g < 2; ++g) avail[g] -= need[g] + 1;
    ++admitted;
    ++n_running;
  }
  return admitted;
}

StepPlan plan_step(const std::vector<SchedSeq>& running, const KvManager& kv, int token_budget) {
  enum : uint8_t { kIdle, kInStep, kPreempted };
  const int n = int(running.size());
  std::vector<uint8_t> state(n, kIdle);
  PageLedger pages(kv);
  StepPlan plan;
  int budget = token_budget;
  auto preempt_newest_idle = [&]() -> int {
    for (int v = n - 1; v >= 0; --v)
      if (state[v] == kIdle) {
        state[v] = kPreempted;
        pages.give_back(running[v]);
        plan.preempt.push_back(v);
        return v;
      }
    return -1;
  };

  // Decodes, oldest first.
  for (int i = 0; i < n && budget > 0; ++i) {
    const SchedSeq& s = running[i];
    if (state[i] != kIdle || !s.decoding()) continue;
    while (!pages.fits(s, 1))
      if (preempt_newest_idle() < 0 || state[i] == kPreempted) break;
    if (state[i] == kPreempted || !pages.fits(s, 1)) continue;
    pages.take(s, 1);
    state[i] = kInStep;
    plan.rows.push_back({i, 1});
    --budget;
  }

  // Draft tokens of decoding rows (speculative decoding), oldest first, from what is left.
  for (auto& r : plan.rows) {
    const SchedSeq& s = running[r.seq];
    int32_t n = std::min<int32_t>(1 + s.num_draft, 1 + budget);
    while (n > 1 && !pages.extend(s, 1, n)) --n;
    budget -= n - 1;
    r.n_tokens = n;
  }

  // Prefill chunks, oldest first: the largest that fits (pages needed grow with the chunk).
  for (int i = 0; i < n && budget > 0; ++i) {
    const SchedSeq& s = running[i];
    int32_t remaining = s.num_tokens - s.num_computed;
    if (state[i] != kIdle || remaining <= 1) continue;
    int32_t lo = 0, hi = std::min<int32_t>(remaining, budget);
    if (s.max_chunk > 0) hi = std::min(hi, s.max_chunk);
    while (lo < hi) {
      int32_t mid = lo + (hi - lo + 1) / 2;
      if (pages.fits(s, mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    if (lo == 0) continue;
    pages.take(s, lo);
    state[i] = kInStep;
    plan.rows.push_back({i, lo});
    budget -= lo;
  }

  if (plan.rows.empty() && plan.preempt.empty()) {
    // Nothing fits: free the newest so that older sequences progress, or fail a lone one.
    if (n > 1)
      preempt_newest_idle();
    else if (n == 1)
      plan.fail = 0;
  }
  return plan;
}

}  // namespace gptoss
