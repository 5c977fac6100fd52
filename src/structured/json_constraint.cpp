#include "structured/json_constraint.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace gptoss::structured {

namespace {
// kAdd[byte][i]: 0 where bit i of the byte is set, -inf where clear; adding it masks 8 logits
// at once (vectorized), so a mask costs about a pass over the row.
struct AddTable {
  float v[256][8];
  AddTable() {
    for (int b = 0; b < 256; ++b)
      for (int i = 0; i < 8; ++i) v[b][i] = (b >> i) & 1 ? 0.0f : -std::numeric_limits<float>::infinity();
  }
};
const AddTable kAdd;
}  // namespace

void apply_mask(const TokenBitset& allowed, float* logits, int vocab) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const size_t n = size_t(std::max(vocab, 0));
  for (size_t w = 0; w * 64 < n; ++w) {
    uint64_t bits = w < allowed.words.size() ? allowed.words[w] : 0;
    float* row = logits + w * 64;
    const size_t len = std::min<size_t>(64, n - w * 64);
    if (len < 64) {
      for (size_t i = 0; i < len; ++i) row[i] = ((bits >> i) & 1) ? row[i] : ninf;
      continue;
    }
    if (bits == ~uint64_t(0)) continue;
    if (bits == 0) {
      std::fill(row, row + 64, ninf);
      continue;
    }
    for (int k = 0; k < 8; ++k) {
      const float* add = kAdd.v[(bits >> (8 * k)) & 0xFF];
      for (int i = 0; i < 8; ++i) row[8 * k + i] += add[i];
    }
  }
}

JsonConstraint::JsonConstraint(JsonConstraintSpec spec) : spec_(std::move(spec)) {
  if (spec_.whole_output && spec_.final_format) {
    phase_ = Phase::kJson;
    masker_ = spec_.final_format.get();
    state_ = masker_->matcher().start();
    end_token_ = spec_.ids.return_;
  }
}

void JsonConstraint::on_message_start() {
  // The header: e.g. "<|channel|>final", " to=functions.get_weather<|channel|>commentary
  // <|constrain|>json", "assistant<|channel|>analysis".
  auto word_after = [&](const std::string& marker) -> std::optional<std::string> {
    size_t p = header_.find(marker);
    if (p == std::string::npos) return std::nullopt;
    p += marker.size();
    size_t e = p;
    while (e < header_.size() && header_[e] != ' ' && header_[e] != '<' && header_[e] != '\n') ++e;
    return header_.substr(p, e - p);
  };
  auto channel = word_after("<|channel|>");
  auto recipient = word_after("to=");
  masker_ = nullptr;
  if (recipient && recipient->rfind("functions.", 0) == 0) {
    auto it = spec_.tools.find(recipient->substr(10));
    if (it != spec_.tools.end() && it->second) {
      masker_ = it->second.get();
      end_token_ = spec_.ids.call;
    }
  } else if (!recipient && channel && *channel == "final" && spec_.final_format) {
    masker_ = spec_.final_format.get();
    end_token_ = spec_.ids.return_;
  }
  if (masker_) {
    state_ = masker_->matcher().start();
    phase_ = Phase::kJson;
  } else {
    phase_ = Phase::kFree;
  }
}

bool JsonConstraint::mask_logits(float* logits, int vocab) {
  if (phase_ != Phase::kJson) return true;
  const JsonMatcher& m = masker_->matcher();
  const bool can_end = m.can_end(state_) && end_token_ >= 0 && end_token_ < vocab;
  const float keep_end = can_end ? logits[end_token_] : 0.0f;
  if (state_.depth == 0) {
    if (!can_end) return false;
    std::fill(logits, logits + vocab, -std::numeric_limits<float>::infinity());
  } else {
    auto bits = masker_->allowed(state_);
    apply_mask(*bits, logits, vocab);
    if (!can_end && bits->count() == 0) return false;
  }
  if (can_end) logits[end_token_] = keep_end;
  return true;
}

bool JsonConstraint::accept(int32_t t) {
  const HarmonyTokenIds& id = spec_.ids;
  switch (phase_) {
    case Phase::kJson: {
      if (t == end_token_) {
        if (!masker_->matcher().can_end(state_)) return false;
        json_done_ = true;
        phase_ = spec_.whole_output ? Phase::kEnd : Phase::kFree;
        return true;
      }
      const TokenVocabulary& v = masker_->vocab();
      if (t < 0 || size_t(t) >= v.size() || v.special(t)) return false;
      return masker_->matcher().advance(state_, v.bytes(t));
    }
    case Phase::kEnd: return false;
    case Phase::kHeader:
      if (t == id.message) {
        on_message_start();
      } else if (t == id.channel) {
        header_ += "<|channel|>";
      } else if (t == id.constrain) {
        header_ += "<|constrain|>";
      } else if (t == id.start || t == id.end) {
        header_.clear();
      } else if (spec_.vocab && t >= 0 && size_t(t) < spec_.vocab->size() && !spec_.vocab->special(t) &&
                 header_.size() < 4096) {
        header_ += spec_.vocab->bytes(t);
      }
      return true;
    case Phase::kFree:
      // A message's text, until it ends; the next message's header follows <|start|>.
      if (t == id.start || t == id.end || t == id.call || t == id.return_) {
        header_.clear();
        phase_ = Phase::kHeader;
      }
      return true;
  }
  return true;
}

}  // namespace gptoss::structured
