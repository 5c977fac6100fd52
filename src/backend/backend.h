#pragma once
// The interface every compute backend implements: the whole gpt-oss forward pass over a flat
// ("varlen") batch of tokens from many sequences, with a paged KV cache the backend owns and the
// kv/ layer's page tables address.
//
// Why a whole forward pass and not per-op calls: the CUDA backend fuses across op boundaries
// and captures whole decode steps in CUDA graphs; the CPU backend composes its own ops (each
// unit-tested) into the same sequence. Both implement the math in ../shared/DESIGN.md.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/eagle3_head.h"
#include "common/dtype.h"
#include "common/token_mask.h"
#include "model/config.h"

namespace gptoss {

struct Eagle3Weights;  // model/eagle3_weights.h

// The KV cache is two page pools: one for full-attention layers, one for sliding-window layers
// (whose old pages the kv/ layer releases). A page id addresses the same slot in every layer of
// its group; a page holds K and V for `page_size` consecutive positions of one sequence.
enum KvGroup { kKvFull = 0, kKvSliding = 1 };

struct KvCacheConfig {
  int page_size = 16;
  int num_pages[2] = {0, 0};  // per group
  DType dtype = DType::BF16;  // BF16, or F8_E4M3 (`--kv-cache-dtype fp8`); the CPU backend stores F32 for BF16
};

struct SeqBatchInfo {
  int32_t first_token = 0;  // index of this sequence's first token in ForwardBatch::tokens
  int32_t n_tokens = 0;     // new tokens of this sequence in this pass
  int32_t start_pos = 0;    // absolute position of its first new token (= tokens already cached)
  // Page tables per group: position p lives in page pages[g][p / page_size]. Entries of the
  // sliding group below the window may be -1 (released). Must cover start_pos + n_tokens.
  const int32_t* pages[2] = {nullptr, nullptr};
  int32_t n_pages[2] = {0, 0};
};

struct ForwardBatch {
  std::vector<int32_t> tokens;      // all new tokens, sequence after sequence
  std::vector<SeqBatchInfo> seqs;
  std::vector<int32_t> logit_rows;  // token indices (into tokens) whose logits are wanted, in output order
  // Hidden-state taps for an Eagle3 drafter (engine/eagle3_drafter.h). When tap_layers is not
  // empty, the pass also writes the residual stream after each of these layers (the output of
  // layer l, before the next layer's norm), for every token, to tap_out: host float32
  // [tokens.size(), tap_layers.size(), hidden]. Only backends whose supports_hidden_taps() is
  // true honour it; the engine checks that before it asks.
  std::vector<int32_t> tap_layers;
  float* tap_out = nullptr;
  // Instead of tap_out: the backend keeps the taps in its own memory for the Eagle3 head it made
  // (Backend::make_eagle3_head, Eagle3Head::device_taps()), until the next forward.
  bool taps_on_device = false;
};

// A change to one logit before its row is drawn: logit_bias and the presence/frequency penalties,
// merged by the engine into one entry per token (engine/sampling.h, logit_adds), in id order.
struct LogitAdd {
  int32_t token = 0;
  float delta = 0.0f;
};

// What changes rows' logits before they are drawn (forward_sample), indexed by RowSampling:
// adds, the logit changes (adds_begin / adds_count); allowed, the allowed-token masks of
// structured output ([masks][allowed_words(vocab)]: bit i % 64 of word i / 64 set when token i
// may be drawn; allowed_row). A row is masked first (its refused logits -inf), then changed; the
// logprob a backend reports is the masked row's, before the changes.
struct LogitChanges {
  const LogitAdd* adds = nullptr;
  const uint64_t* allowed = nullptr;
};

// The most top logprobs a backend gives for a row it draws (RowSampling::top_logprobs; the
// OpenAI API's limit), and one row's list: its best tokens, best first.
constexpr int kMaxTopLogprobs = 20;
struct TopLogprobs {
  int32_t ids[kMaxTopLogprobs];
  float logprobs[kMaxTopLogprobs];
};

// How to draw one token from a row of logits (forward_sample). The rule, on any backend:
// temperature < 1e-5 -> argmax (ties to the lower id); else p_i = exp((l_i - max) / T), keep
// p_i >= min_p (p_max is 1), then the k largest (top_k > 0), then the largest ones whose mass
// reaches top_p of what is kept (ties at a boundary stay in), and return the first id, in id
// order, at which the kept mass summed so far exceeds u x the kept mass. `u` in [0, 1) comes
// from the caller's generator, so a seeded request gives the same token on every backend up to
// float rounding.
struct RowSampling {
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int top_k = 0;  // <= 0: off
  float u = 0.0f;
  // Not drawn: the row's logits go to forward_sample's kept_logits (its token there is -1).
  int32_t keep_logits = 0;
  // Before the rule (LogitChanges): logit[token] += delta for adds[adds_begin, adds_begin +
  // adds_count) (distinct tokens in [0, vocab), in id order); with allowed_row >= 0, first the
  // logits of the tokens that mask refuses are set to -inf.
  int32_t adds_begin = 0;
  int32_t adds_count = 0;
  int32_t allowed_row = -1;
  // With logprobs_out and top_out: the row's best top_logprobs (<= kMaxTopLogprobs) tokens and
  // their logprobs (row_top_logprobs) to top_out.
  int32_t top_logprobs = 0;
};

// The host implementation of that rule (the reference the CUDA sampler is tested against).
// `scratch` avoids reallocations.
int32_t sample_row(const float* logits, int vocab, const RowSampling& s, std::vector<float>& scratch);
// sample_row after adding `adds` (s.adds_count entries, the row's own) to the row in place; the
// row is given back as it was (each changed logit restored from its saved value, not by
// subtraction).
int32_t sample_row_adjusted(float* logits, int vocab, const RowSampling& s, const LogitAdd* adds,
                            std::vector<float>& scratch);
// log(sum_i exp(logits[i])) over the row's numbers (NaNs left out; max + log of a double sum):
// a token's logprob is its logit minus this (the model's distribution, before any sampling rule).
double row_logsumexp(const float* logits, int vocab);
// The logprob a response reports: logit - lse, clamped to -9999 (JSON has no -inf); NaN -> -9999.
float clamp_logprob(double v);
// The n (<= vocab) best ids of a row, best first, ties to the lower id, NaN as -inf, and their
// logprobs clamp_logprob(logit - lse): a top list on every backend.
void row_top_logprobs(const float* logits, int vocab, int n, double lse, int32_t* ids, float* logprobs);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const GptOssConfig& config() const = 0;
  // (Re)allocates the KV cache; previous contents are dropped.
  virtual void init_kv_cache(const KvCacheConfig& kv) = 0;
  virtual const KvCacheConfig& kv_config() const = 0;
  // Runs the model: stores K/V of every new token into its page, then writes the logits of
  // batch.logit_rows to `logits` (host memory, [logit_rows.size(), vocab] float32).
  virtual void forward(const ForwardBatch& batch, float* logits) = 0;
  // The same pass, returning only the greedy (argmax, ties to the lower id) token of each logit
  // row: the CUDA backend picks them on the device and copies back ids instead of logits. The
  // default runs forward() and takes the argmax on the host.
  virtual void forward_greedy(const ForwardBatch& batch, int32_t* tokens_out);
  // Pipelined greedy decoding (vLLM's async scheduling, for one token a sequence): launch_greedy
  // queues a forward_greedy pass and may return before it has run; finish_greedy waits for the
  // oldest pass launched and not yet finished and writes its ids (one a logit row). With
  // `tokens_from_last`, batch.tokens are not read: row i's token is the id the pass launched just
  // before this one picked for its row i, which the CUDA backend copies on the device, so the host
  // launches pass N + 1 without waiting for pass N. That needs the same layout in both passes:
  // sequence i brings one token, token i, and logit_rows[i] = i, no other pass of this backend
  // between them, and at most two passes launched and not yet finished. The default runs each
  // pass in launch_greedy (forward_greedy) and keeps its ids for finish_greedy.
  virtual void launch_greedy(const ForwardBatch& batch, bool tokens_from_last);
  virtual void finish_greedy(int32_t* tokens_out);
  // The same pass, drawing the token of each logit row by rows[i] (see RowSampling). The CUDA
  // backend samples on the device; the default runs forward() and sample_row() on the host.
  // logprobs_out (when given and samples_logprobs()): each drawn token's logprob under the row's
  // logits (logit - row_logsumexp, clamped as clamp_logprob), so a request asking only for its
  // tokens' logprobs needs no [rows, vocab] copy to the host.
  // kept_logits (when keeps_logits()): the logits of the rows marked keep_logits, in row order,
  // [kept rows, vocab]; those rows are not drawn (token -1). The host then samples them itself
  // (penalties, a structured-output mask) while the backend draws the rest.
  // changes (when applies_logit_changes()): the logit changes and masks rows[i] index.
  // top_out (with logprobs_out, when samples_top_logprobs()): row i's top list when
  // rows[i].top_logprobs > 0, of the row's logits as its logprob is (masked, before changes).
  virtual void forward_sample(const ForwardBatch& batch, const RowSampling* rows, int32_t* tokens_out,
                              float* logprobs_out = nullptr, float* kept_logits = nullptr,
                              const LogitChanges& changes = {}, TopLogprobs* top_out = nullptr);
  // Whether forward_sample fills top_out (the default and one CUDA GPU do).
  virtual bool samples_top_logprobs() const { return samples_logprobs(); }
  // Whether forward_sample applies LogitChanges (logit_bias, penalties, structured-output masks),
  // so such rows need not come to the host (the default and one CUDA GPU do; a tensor-parallel
  // group does not).
  virtual bool applies_logit_changes() const { return true; }
  // Whether forward_sample takes keep_logits rows (the default and one CUDA GPU do; a
  // tensor-parallel group does not).
  virtual bool keeps_logits() const { return true; }
  // Whether forward_sample fills logprobs_out (the default and one CUDA GPU do; a tensor-parallel
  // group, whose vocabulary is split over the ranks, does not).
  virtual bool samples_logprobs() const { return true; }
  // Whether forward() fills ForwardBatch::tap_out (Eagle3 drafts need it).
  virtual bool supports_hidden_taps() const { return false; }
  // An Eagle3 draft head run by this backend itself (the CUDA backend: on its GPU, with the taps
  // left there), or null when the backend has none for this head (then the engine runs the head
  // on the host, engine/eagle3_drafter.h). Throws gptoss::Error when the head does not fit the
  // model (hidden size, vocabulary). A head without embed_tokens shares the backend's embedding.
  virtual std::unique_ptr<Eagle3Head> make_eagle3_head(std::shared_ptr<const Eagle3Weights> head) {
    (void)head;
    return nullptr;
  }
  // Whether forward passes compute on this machine's cores (the CPU backend). When false (a GPU
  // does the work), a thread waiting for a pass may spin on a core instead of sleeping: a wake-up
  // after milliseconds of sleep costs tens of microseconds, which sit between two passes.
  virtual bool computes_on_host() const { return true; }
  // The decode batch sizes (tokens a pass) the backend prepares a pass for once, at its first run
  // (the CUDA backend: a graph per bucket, a pass padded to the smallest bucket that holds it),
  // ascending; empty: none. The start-up warm-up runs each (engine/warm_up.h).
  virtual std::vector<int> decode_batch_buckets() const { return {}; }
  // Bytes of memory the backend can give the KV cache after its weights (0 = no fixed limit).
  virtual size_t kv_memory_available() const { return 0; }
  // The token budget a forward pass gets when the server is not told one
  // (--max-num-batched-tokens, EngineConfig 0). The CUDA backend raises it to 8192 on a large GPU.
  virtual int default_max_num_batched_tokens() const { return 2048; }

 protected:
  // launch_greedy's checks, shared by the backends: throws gptoss::Error unless the batch has the
  // layout `tokens_from_last` needs (one token a sequence, in order, every row wanted) and, with
  // it, as many rows as the last launch (last_rows; -1: none launched yet).
  static void check_pipelined_batch(const ForwardBatch& batch, bool tokens_from_last, int last_rows);
  // The default launch_greedy's results, oldest first, and the last launch's ids.
  std::vector<std::vector<int32_t>> greedy_done_;
  std::vector<int32_t> greedy_last_;
};

// Bytes one page of group g costs in a backend's storage.
size_t kv_page_bytes(const GptOssConfig& c, KvGroup g, int page_size, DType dtype);

}  // namespace gptoss
