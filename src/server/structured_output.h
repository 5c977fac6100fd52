#pragma once
// Structured output for chat requests: response_format (json_schema / json_object) and the
// tools' parameter schemas (and a text completion's response_format), compiled into a per-request JsonConstraint (structured/) that the
// engine applies while sampling. The o200k vocabulary index is built on first use; compiled
// schemas (with their mask caches) are shared by requests that send the same schema.
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "server/openai_api.h"
#include "structured/json_constraint.h"
#include "tokenizer/tokenizer.h"

namespace gptoss::server {

class StructuredOutput {
 public:
  // harmony_output: the model writes harmony (constrain the final channel and tool calls);
  // false: the whole output is the response format's JSON (random weights).
  StructuredOutput(const Tokenizer& tok, bool harmony_output);
  // The constraint for a chat request: with harmony output always (at least the text guard, see
  // JsonConstraintSpec::text_guard_only); otherwise for a response format only (else null). Throws
  // ApiError 400 (param `format_param`, or tools) for an invalid or, when strict, unsupported
  // schema. /v1/responses passes its request mapped onto a chat request, with "text.format".
  std::shared_ptr<structured::JsonConstraint> for_chat(const ChatRequest& r,
                                                       const char* format_param = "response_format");
  // True when a constraint from for_chat() covers the whole output (not harmony).
  bool whole_output() const { return !harmony_; }
  // The constraint for a text completion's response_format (json_object / json_schema): the whole
  // completion is the JSON, then the turn's end token (<|return|>, which stops it), as vLLM
  // constrains a completion; null for text. Throws ApiError 400 as for_chat does.
  std::shared_ptr<structured::JsonConstraint> for_completion(const CompletionRequest& r);

 private:
  std::shared_ptr<const structured::TokenVocabulary> vocabulary();
  std::shared_ptr<const structured::JsonTokenMasker> masker(const ojson* schema, bool strict, const char* param);

  Tokenizer tok_;
  bool harmony_;
  structured::HarmonyTokenIds ids_;
  std::mutex mu_;
  std::shared_ptr<const structured::TokenVocabulary> vocab_;
  std::unordered_map<std::string, std::shared_ptr<const structured::JsonTokenMasker>> maskers_;
};

}  // namespace gptoss::server
