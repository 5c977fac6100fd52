#pragma once
// JSON constraints on a model's output, placed by the harmony format: the text of the `final`
// channel follows the response format's grammar and then the turn must end (<|return|>); the
// arguments of a call to `functions.NAME` follow that tool's parameter grammar and end the
// call (<|call|>). The analysis channel and message headers are free. For a model that does
// not write harmony (random weights), the whole output is the response format's JSON.
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "structured/token_constraint.h"
#include "structured/token_masker.h"

namespace gptoss::structured {

// Ids of the harmony formatting tokens (looked up by name by whoever builds the constraint).
struct HarmonyTokenIds {
  int32_t start = -1, channel = -1, message = -1, end = -1, return_ = -1, call = -1, constrain = -1;
};

struct JsonConstraintSpec {
  std::shared_ptr<const TokenVocabulary> vocab;          // token bytes (for the message headers)
  std::shared_ptr<const JsonTokenMasker> final_format;  // null: the final channel is free
  std::map<std::string, std::shared_ptr<const JsonTokenMasker>> tools;  // by function name
  bool whole_output = false;  // not harmony: the whole output is final_format's JSON
  HarmonyTokenIds ids;
};

class JsonConstraint : public TokenConstraint {
 public:
  explicit JsonConstraint(JsonConstraintSpec spec);
  bool active() const override { return phase_ == Phase::kJson; }
  bool mask_logits(float* logits, int vocab) override;
  bool accept(int32_t token) override;

  // The header text of the message in progress, with <|channel|>/<|constrain|> spelled out.
  const std::string& header() const { return header_; }
  bool finished_json() const { return json_done_; }

 private:
  enum class Phase { kHeader, kFree, kJson, kEnd };
  void on_message_start();
  JsonConstraintSpec spec_;
  Phase phase_ = Phase::kHeader;
  std::string header_;
  const JsonTokenMasker* masker_ = nullptr;
  MatchState state_;
  int32_t end_token_ = -1;
  bool json_done_ = false;
};

// Sets logits[i] = -inf for every i < vocab whose bit is clear (ids past the mask included).
void apply_mask(const TokenBitset& allowed, float* logits, int vocab);

}  // namespace gptoss::structured
