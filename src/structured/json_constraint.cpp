#include "structured/json_constraint.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace gptoss::structured {

JsonConstraint::JsonConstraint(JsonConstraintSpec spec) : spec_(std::move(spec)) {
  if (spec_.whole_output) {  // the JSON from the first token, then the turn's end (free)
    if (spec_.final_format) {
      phase_ = Phase::kJson;
      masker_ = spec_.final_format.get();
      state_ = masker_->matcher().start();
      end_token_ = spec_.ids.return_;
    } else {
      phase_ = Phase::kEnd;  // nothing to constrain
    }
    return;
  }
  if (spec_.text_guard_only) return;  // headers_ stays null: headers are not masked
  HeaderRules rules;
  rules.final_channel = spec_.final_channel;
  rules.preambles = spec_.preambles;
  for (const auto& [name, masker] : spec_.tools) rules.functions.push_back(name);
  headers_ = std::make_shared<const HarmonyHeaders>(rules, spec_.ids, spec_.vocab);
}

void JsonConstraint::start_message(const HarmonyHeaders::Meaning& m) {
  using K = HarmonyHeaders::Kind;
  masker_ = nullptr;
  free_ends_ = {-1, -1, -1};
  if (m.kind == K::kCall) {
    auto it = spec_.tools.find(m.function);
    if (it != spec_.tools.end() && it->second) {
      masker_ = it->second.get();
      end_token_ = spec_.ids.call;
    } else {
      free_ends_[0] = spec_.ids.call;
    }
  } else if (m.kind == K::kFinal) {
    if (spec_.final_format) {
      masker_ = spec_.final_format.get();
      end_token_ = spec_.ids.return_;
    } else {
      free_ends_[0] = spec_.ids.return_;
    }
  } else {
    free_ends_[0] = spec_.ids.end;  // analysis and preambles: another message follows
  }
  if (masker_) {
    state_ = masker_->matcher().start();
    phase_ = Phase::kJson;
  } else {
    phase_ = Phase::kFree;
  }
}

bool JsonConstraint::active() const {
  return (phase_ == Phase::kHeader && headers_) || phase_ == Phase::kJson || (redraw_ && phase_ != Phase::kEnd);
}

bool JsonConstraint::rejects(int32_t t) const {
  switch (phase_) {
    case Phase::kFree:
      if (free_end(t)) return false;
      return t < 0 || !spec_.vocab || size_t(t) >= spec_.vocab->size() || spec_.vocab->special(t);
    default: return false;  // masked phases draw from the mask; past the turn's end (ignore_eos) all is free
  }
}

bool JsonConstraint::stays_inactive(int32_t t) const {
  if (phase_ == Phase::kEnd) return true;
  if (spec_.text_guard_only) return !redraw_ && !rejects(t);  // never active: headers are free
  return phase_ == Phase::kFree && !redraw_ && !rejects(t) && !free_end(t);
}

bool JsonConstraint::allowed_tokens(uint64_t* words, int vocab) {
  const size_t n_words = allowed_words(vocab);
  auto clear = [&](int32_t id) {
    if (id >= 0 && id < vocab) words[size_t(id) >> 6] &= ~(uint64_t(1) << (id & 63));
  };
  auto set = [&](int32_t id) {
    if (id >= 0 && id < vocab) words[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
  };
  auto all = [&] {
    std::fill(words, words + n_words, ~uint64_t(0));
    if (vocab % 64) words[n_words - 1] = (uint64_t(1) << (vocab % 64)) - 1;  // no ids past vocab
  };
  // Bits of `b` (ordinary tokens), none past vocab.
  auto copy = [&](const TokenBitset& b) {
    std::fill(words, words + n_words, uint64_t(0));
    std::copy_n(b.words.begin(), std::min(n_words, b.words.size()), words);
    if (vocab % 64 && b.words.size() >= n_words) words[n_words - 1] &= (uint64_t(1) << (vocab % 64)) - 1;
  };
  switch (phase_) {
    case Phase::kEnd: all(); return vocab > 0;  // past the turn's end (ignore_eos): free
    case Phase::kFree: {
      // Every ordinary token, and the message's end token(s): no other special token.
      all();
      for (int32_t id : spec_.vocab->special_ids()) {
        if (id >= vocab) break;
        if (!free_end(id)) clear(id);
      }
      for (int i = int(spec_.vocab->size()); i < vocab; ++i)
        if (!free_end(i)) clear(i);
      return true;
    }
    case Phase::kHeader: {
      if (!headers_) {  // the text guard alone: headers are free
        all();
        return vocab > 0;
      }
      TokenBitset bits(size_t(std::max(vocab, 0)));
      headers_->allowed(cursor_, bits);
      copy(bits);
      return bits.count() > 0;
    }
    case Phase::kJson: break;
  }
  const JsonMatcher& m = masker_->matcher();
  const bool can_end = m.can_end(state_) && end_token_ >= 0 && end_token_ < vocab;
  if (state_.depth == 0) {
    std::fill(words, words + n_words, uint64_t(0));
    if (!can_end) return false;
  } else {
    auto bits = masker_->allowed(state_);
    copy(*bits);
    if (!can_end && bits->count() == 0) return false;
  }
  if (can_end) set(end_token_);
  return true;
}

bool JsonConstraint::accept(int32_t t) {
  redraw_ = false;
  switch (phase_) {
    case Phase::kJson: {
      if (t == end_token_) {
        if (!masker_->matcher().can_end(state_)) return false;
        json_done_ = true;
        phase_ = Phase::kEnd;  // <|return|> and <|call|> both end the turn
        return true;
      }
      const TokenVocabulary& v = masker_->vocab();
      if (t < 0 || size_t(t) >= v.size() || v.special(t)) return false;
      return masker_->matcher().advance(state_, v.bytes(t));
    }
    case Phase::kEnd: return true;
    case Phase::kHeader: {
      if (!headers_) {  // the text guard alone: any header; its message may end as any message does
        if (t == spec_.ids.message) {
          free_ends_ = {spec_.ids.end, spec_.ids.return_, spec_.ids.call};
          phase_ = Phase::kFree;
        }
        return true;
      }
      std::optional<HarmonyHeaders::Meaning> done;
      if (!headers_->advance(cursor_, t, &done)) return false;
      if (done) start_message(*done);
      return true;
    }
    case Phase::kFree:
      if (rejects(t)) return false;
      if (t == spec_.ids.end && free_end(t)) {
        cursor_ = HarmonyHeaders::Cursor{{}, false};  // the next message's header
        phase_ = Phase::kHeader;
      } else if (free_end(t)) {
        phase_ = Phase::kEnd;
      }
      return true;
  }
  return true;
}

}  // namespace gptoss::structured
