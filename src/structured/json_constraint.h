#pragma once
// Structured output placed by the harmony format. The model's messages follow harmony's
// grammar: every header is one the request allows (HarmonyHeaders: the channels, and calls to
// the declared functions only); the text of the `final` channel follows the response format's
// grammar and then the turn ends (<|return|>); the arguments of a call to `functions.NAME`
// follow that tool's parameter grammar and end the call (<|call|>). The text of an analysis or
// preamble message is free but may not hold harmony's special tokens, and ends with <|end|>
// (a free final message with <|return|>). For a model that does not write harmony (random
// weights), the whole output is the response format's JSON.
//
// Headers and JSON are masked (active(): sampled on the host). Free text is not: a token drawn
// there without the mask goes through rejects(), and a refused one is drawn again with the mask
// (the engine's redraw), which is the masked distribution exactly (rejection sampling).
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "structured/harmony_headers.h"
#include "structured/token_constraint.h"
#include "structured/token_masker.h"

namespace gptoss::structured {

struct JsonConstraintSpec {
  std::shared_ptr<const TokenVocabulary> vocab;
  std::shared_ptr<const JsonTokenMasker> final_format;  // null: the final channel is free
  // The functions the model may call, by name, each with its arguments' grammar.
  std::map<std::string, std::shared_ptr<const JsonTokenMasker>> tools;
  bool final_channel = true;  // false: the turn must end in a call (tool_choice required or named)
  bool preambles = true;      // commentary messages to the user before a call
  bool whole_output = false;  // not harmony: the whole output is final_format's JSON
  // Harmony's text guard alone (a chat request with no tools and no format): headers are not
  // masked, and a message's text may hold no special token but one that ends a message
  // (<|end|>, <|return|>, <|call|>). Never active but to draw a refused token again.
  bool text_guard_only = false;
  HarmonyTokenIds ids;
};

class JsonConstraint : public TokenConstraint {
 public:
  explicit JsonConstraint(JsonConstraintSpec spec);
  bool active() const override;
  bool allowed_tokens(uint64_t* words, int vocab) override;
  bool accept(int32_t token) override;
  bool rejects(int32_t token) const override;
  void mask_next() override { redraw_ = true; }
  bool stays_inactive(int32_t token) const override;

  // The header of the message in progress (or last begun), special tokens by name.
  std::string header() const { return headers_ ? headers_->readable(cursor_) : std::string(); }
  bool finished_json() const { return json_done_; }

 private:
  // kHeader: a message header (masked); kJson: JSON (masked); kFree: a message's free text;
  // kEnd: after the turn's last token (<|return|> or <|call|>): generation stops there unless the
  // request ignores end tokens (ignore_eos), and what follows is free.
  enum class Phase { kHeader, kFree, kJson, kEnd };
  void start_message(const HarmonyHeaders::Meaning& m);
  bool free_end(int32_t t) const { return t >= 0 && std::find(free_ends_.begin(), free_ends_.end(), t) != free_ends_.end(); }

  JsonConstraintSpec spec_;
  std::shared_ptr<const HarmonyHeaders> headers_;  // null: not harmony
  Phase phase_ = Phase::kHeader;
  HarmonyHeaders::Cursor cursor_;
  const JsonTokenMasker* masker_ = nullptr;
  MatchState state_;
  int32_t end_token_ = -1;               // kJson: the token that ends the JSON's message
  std::array<int32_t, 3> free_ends_{-1, -1, -1};  // kFree: the tokens that may end the message
  bool json_done_ = false;
  bool redraw_ = false;  // the last unmasked draw was refused: mask the next one
};

}  // namespace gptoss::structured
