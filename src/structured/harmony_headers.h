#pragma once
// The message headers a constrained harmony output may write: a finite set of forms, each a
// sequence of special tokens and text, from what the request allows (the channels; the
// functions it may call, "to=functions.NAME"). A header in progress is a prefix of at least one
// form; a token is allowed when the prefix stays one, so any tokenization of a form passes.
//
// The forms are those gpt-oss writes and harmony's parser reads: the recipient after the
// channel or before it, with or without a content type ("<|constrain|>json", " json"):
//   <|channel|>analysis<|message|>
//   <|channel|>final<|message|>
//   <|channel|>commentary<|message|>                                  (a preamble)
//   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
//    to=functions.NAME<|channel|>commentary json<|message|>           (and the other variants)
// The output's first header follows the prompt's "<|start|>assistant"; every later one starts
// with "<|start|>assistant" of its own.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "structured/token_masker.h"

namespace gptoss::structured {

// Ids of the harmony formatting tokens (looked up by name by whoever builds the constraint).
struct HarmonyTokenIds {
  int32_t start = -1, channel = -1, message = -1, end = -1, return_ = -1, call = -1, constrain = -1;
};

struct HeaderRules {
  bool final_channel = true;           // "<|channel|>final" (false: the request requires a call)
  bool preambles = true;               // "<|channel|>commentary" without a recipient
  std::vector<std::string> functions;  // callable as "to=functions.NAME" (names of [A-Za-z0-9_-])
};

class HarmonyHeaders {
 public:
  enum class Kind { kAnalysis, kPreamble, kFinal, kCall };
  struct Meaning {
    Kind kind = Kind::kAnalysis;
    std::string function;  // kCall: the function called
  };
  // A header in progress: the tokens so far, spelled (special tokens as two-byte codes).
  struct Cursor {
    std::string spelled;
    bool first = true;  // the output's first header (no "<|start|>assistant" of its own)
  };

  HarmonyHeaders(const HeaderRules& rules, const HarmonyTokenIds& ids, std::shared_ptr<const TokenVocabulary> vocab);
  // Sets the bit of every token allowed next (bits: sized to the vocabulary).
  void allowed(const Cursor& c, TokenBitset& bits) const;
  // Advances on token t; false when t leaves every form. At <|message|>, the header's meaning.
  bool advance(Cursor& c, int32_t t, std::optional<Meaning>* done) const;
  // The header in progress as text, special tokens by name (for messages).
  std::string readable(const Cursor& c) const;

 private:
  std::optional<std::string> spell(int32_t t) const;
  const std::map<std::string, Meaning>& forms(const Cursor& c) const { return c.first ? first_ : later_; }

  HarmonyTokenIds ids_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::map<std::string, Meaning> first_, later_;  // spelled form -> what the header means
};

}  // namespace gptoss::structured
