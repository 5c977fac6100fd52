#pragma once
// The engine's scheduling decisions as two pure functions over a read-only view of the running
// sequences and the KV pools, so each can be tested alone (tests/engine/test_scheduler.cpp) and
// the engine applies their result afterwards (no container is edited while it is walked):
//
//  1. plan_admission (the capacity step): how many waiting requests join the running set this
//     step, FCFS, under max_num_seqs and the KV pages not yet promised to running sequences.
//  2. plan_step (the micro-batch step): which sequences get how many tokens in this forward
//     pass under the token budget, and which sequences to preempt so that they fit.
//
// Stall-free batching (Sarathi-Serve, vLLM's chunked prefill): every decoding sequence gets its
// one token first, so a long prompt never stalls running streams; prefill chunks fill what is
// left of the token budget, which bounds the step time. Prefills are packed in admission order
// (FCFS): the oldest prompt takes as much of the budget as it can and the next one starts in the
// same step. When many prompts arrive at once this finishes them one after another: with 32
// prompts of 512 tokens and a 2048-token budget, 4 prompts get their first token after step 1,
// 8 after step 2, ..., so the median TTFT is about half of the total prefill time, whereas
// sharing the budget round-robin among all of them would give every request the TTFT of the
// last one. FCFS also never starves a long prompt.
#include <cstdint>
#include <vector>

#include "kv/kv_manager.h"

namespace gptoss {

// A running sequence as the scheduler sees it.
struct SchedSeq {
  int64_t id = 0;            // its KvManager key
  int32_t num_computed = 0;  // positions whose K/V are cached
  int32_t num_tokens = 0;    // prompt + output so far
  int32_t max_chunk = 0;     // > 0: at most this many tokens in one step (prompt logprobs)
  // Speculative decoding: draft tokens a decoding sequence would like verified in this step
  // (its row then has 1 + num_draft tokens). Drafts are optional: they get only the budget and
  // pages left after every decoding sequence has its token, and never cause a preemption.
  int32_t num_draft = 0;
  // One token left to compute: the last sampled one (a decode step).
  bool decoding() const { return num_computed == num_tokens - 1; }
};

// The capacity step. `waiting_lengths`: num_tokens of the waiting requests, first in line first.
// Returns how many of them (from the front) to admit: while there is a free slot and the pages
// of the request's whole context plus one, beyond what running sequences still need to finish
// their prefill and a page of growth per running sequence, are free. An empty engine always
// admits its first waiting request (it gets what there is; plan_step fails it if that is not
// enough even for one token).
int plan_admission(const std::vector<SchedSeq>& running, const std::vector<int32_t>& waiting_lengths,
                   const KvManager& kv, int max_num_seqs);

struct StepRow {
  int seq = 0;           // index into running
  int32_t n_tokens = 0;  // tokens to compute from seq.num_computed on
};

struct StepPlan {
  // Decodes first (admission order), then prefill chunks (admission order).
  std::vector<StepRow> rows;
  // Indices into running to preempt before the rows' pages are prepared, in the order chosen
  // (newest first): their pages are freed and they recompute from scratch later.
  std::vector<int> preempt;
  // Index of a sequence the KV cache cannot hold even alone (-1: none); it is the only one
  // running and should be failed.
  int fail = -1;
  int num_tokens() const;
};

// The micro-batch step. Every decoding sequence, oldest first, gets one token while the budget
// lasts; when its page cannot be had, the newest running sequence not already in this step is
// preempted (possibly itself). Then decoding sequences with drafts (SchedSeq::num_draft), oldest
// first, extend their row by as many drafts as the rest of the budget and the free pages allow
// (latency first: before prefill chunks). Then prefilling sequences, oldest first, get the largest chunk of
// their remaining tokens that fits the rest of the budget and the free pages (no preemption for
// prefill). When nothing fits at all, the newest sequence is preempted (or, alone, failed).
// Page accounting is simulated on counts; applying the plan (free the victims, then prepare each
// row's pages in order) cannot run out of pages.
StepPlan plan_step(const std::vector<SchedSeq>& running, const KvManager& kv, int token_budget);

}  // namespace gptoss
