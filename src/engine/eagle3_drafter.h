#pragma once
// The Eagle3 drafter: one Llama-style decoder layer over the target's own hidden states (three
// tapped layers, ForwardBatch::tap_layers) that proposes the next tokens, run on the host in
// exact fp32 (cpu_ops). Format and sources: docs/EAGLE3.md.
//
// The draft step. Row p of the head pairs the target's taps at position p (what the target knew
// after reading token x_p) with the embedding of the token x_{p+1} that followed, at rotary
// position p, and predicts x_{p+2}:
//   h   = fc([t_a ; t_b ; t_c])                         (taps of the three layers, 3*Ht -> H)
//   in  = [rmsnorm(embed(x_{p+1}), input_norm) ; rmsnorm(h, hidden_norm)]           (2H)
//   r   = h + o_proj(attention(q_proj in, k_proj in, v_proj in))  (causal over the head's own
//         K/V cache of earlier rows, from first_pos on; RoPE; no sinks, no window)
//   out = r + down(silu(gate(n)) * up(n)),  n = rmsnorm(r, post_attention_norm)
//   logits = lm_head(rmsnorm(out, norm)) over the draft vocabulary, id i -> target id i + d2t[i].
// Committed rows use the target's taps. To draft K > 1 tokens the head chains: the row after
// the last committed one takes the token it just proposed and, in place of the target's taps
// (unknown until verified), its own pre-norm output `out` as h; those scratch rows are dropped
// at the next commit, which rebuilds the cache from the target's taps of the tokens that were
// actually accepted (the drafter's rollback, matching KvManager::truncate on the target).
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/eagle3_head.h"
#include "model/config.h"
#include "model/eagle3_weights.h"

namespace gptoss {

class Eagle3Drafter {
 public:
  // Per sequence: the head's K/V cache of committed rows (positions first_pos ..
  // first_pos + rows - 1) and the pre-norm output of the last one.
  struct State {
    int32_t first_pos = 0;
    int32_t rows = 0;
    std::vector<float> k, v;  // [rows (+ scratch rows of the last proposal), kv_dim]
    std::vector<float> last;  // [H]; empty when nothing is committed
    void reset() { *this = State(); }
  };

  // `target_embed`: the target's embedding [vocab, H] bf16, used when the head ships none
  // (may be null otherwise). Throws gptoss::Error when the head does not fit the target.
  Eagle3Drafter(std::shared_ptr<const Eagle3Weights> w, const GptOssConfig& target, const TensorView* target_embed,
                std::shared_ptr<const void> keep_alive = nullptr);

  const std::vector<int32_t>& tap_layers() const { return taps_; }
  int tap_width() const { return 3 * c_.target_hidden; }  // floats per token in ForwardBatch::tap_out
  const Eagle3Config& config() const { return c_; }

  // Commits rows for positions pos .. pos + n - 1: next_tokens[i] is the token at pos + i + 1,
  // taps[i] the target's taps at pos + i ([n, tap_width()]). A pos before the committed end
  // rewinds to it (recomputed rows); a pos after it (positions whose taps the drafter never saw,
  // e.g. a prefix-cache hit) restarts the cache there.
  void commit(State& s, int32_t pos, int n, const int32_t* next_tokens, const float* taps) const;

  // Up to k draft tokens (target ids) following the committed rows; empty when nothing is
  // committed. `logits`, when given, receives each step's draft-vocabulary logits.
  std::vector<int32_t> propose(State& s, int k, std::vector<float>* logits = nullptr) const;

 private:
  // Runs rows at positions pos .. pos + n - 1 (tokens[i] embedded, h[i] the hidden input),
  // writing their K/V into s and the last row's pre-norm output to out [H].
  void run_rows(State& s, int32_t pos, int n, const int32_t* tokens, const float* h, float* out) const;
  int32_t draft_token(const float* prenorm, float* logits) const;

  std::shared_ptr<const Eagle3Weights> w_;
  Eagle3Config c_;
  std::shared_ptr<const void> keep_alive_;
  const uint16_t* embed_ = nullptr;
  std::vector<int32_t> taps_;
  YarnTables rope_;
  std::vector<float> input_norm_, hidden_norm_, post_norm_, norm_, no_sinks_;
};

// The Eagle3Head the engine runs on the host (any backend with hidden-state taps): an
// Eagle3Drafter, its State per sequence. Takes host taps only.
class HostEagle3Head final : public Eagle3Head {
 public:
  explicit HostEagle3Head(std::unique_ptr<Eagle3Drafter> d) : d_(std::move(d)) {}
  std::string where() const override { return "host"; }
  std::unique_ptr<Seq> new_seq() const override { return std::make_unique<HostSeq>(); }
  void commit(Seq& s, int32_t pos, int n, const int32_t* next_tokens, const Eagle3Taps& taps) override;
  std::vector<int32_t> propose(Seq& s, int k, std::vector<float>* logits = nullptr) override {
    return d_->propose(static_cast<HostSeq&>(s).state, k, logits);
  }
  const Eagle3Drafter& drafter() const { return *d_; }

 private:
  struct HostSeq final : Seq {
    Eagle3Drafter::State state;
  };
  std::unique_ptr<Eagle3Drafter> d_;
};

}  // namespace gptoss
