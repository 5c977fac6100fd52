#include "server/structured_output.h"

namespace gptoss::server {

namespace {
constexpr size_t kMaxCachedSchemas = 16;  // x up to 256 cached masks of 25 KB each
int32_t id_or(const Tokenizer& tok, const char* name) { return tok.token_id(name).value_or(-1); }
}  // namespace

StructuredOutput::StructuredOutput(const Tokenizer& tok, bool harmony_output) : tok_(tok), harmony_(harmony_output) {
  ids_.start = id_or(tok_, "<|start|>");
  ids_.channel = id_or(tok_, "<|channel|>");
  ids_.message = id_or(tok_, "<|message|>");
  ids_.end = id_or(tok_, "<|end|>");
  ids_.return_ = id_or(tok_, "<|return|>");
  ids_.call = id_or(tok_, "<|call|>");
  ids_.constrain = id_or(tok_, "<|constrain|>");
}

std::shared_ptr<const structured::TokenVocabulary> StructuredOutput::vocabulary() {
  std::lock_guard<std::mutex> l(mu_);
  if (!vocab_) {
    std::vector<std::string> bytes(tok_.vocab_size());
    std::vector<bool> special(tok_.vocab_size(), true);
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (!tok_.has_token(int32_t(i)) || tok_.is_special(int32_t(i))) continue;
      bytes[i] = std::string(tok_.token_bytes(int32_t(i)));
      special[i] = false;
    }
    vocab_ = std::make_shared<const structured::TokenVocabulary>(std::move(bytes), special);
  }
  return vocab_;
}

std::shared_ptr<const structured::JsonTokenMasker> StructuredOutput::masker(const ojson* schema, bool strict,
                                                                             const char* param) {
  std::string key = schema ? std::string(strict ? "s" : "n") + schema->dump() : "json_object";
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = maskers_.find(key);
    if (it != maskers_.end()) return it->second;
  }
  std::shared_ptr<const structured::Grammar> g;
  try {
    // ordered_json -> json keeps the values (object key order does not matter to a schema)
    g = schema ? structured::compile_json_schema(nlohmann::json::parse(schema->dump()), strict)
               : structured::any_json_object_grammar();
  } catch (const structured::SchemaError& e) {
    throw ApiError{400, e.what(), "invalid_request_error", param, "invalid_schema"};
  }
  auto m = std::make_shared<const structured::JsonTokenMasker>(std::move(g), vocabulary());
  std::lock_guard<std::mutex> l(mu_);
  if (maskers_.size() >= kMaxCachedSchemas) maskers_.clear();
  return maskers_.emplace(key, std::move(m)).first->second;
}

std::shared_ptr<structured::JsonConstraint> StructuredOutput::for_chat(const ChatRequest& r, const char* format_param) {
  structured::JsonConstraintSpec spec;
  spec.ids = ids_;
  spec.whole_output = !harmony_;
  const ResponseFormat& rf = r.response_format;
  if (rf.type == "json_object") {
    spec.final_format = masker(nullptr, false, format_param);
  } else if (rf.type == "json_schema") {
    spec.final_format = masker(rf.schema ? &*rf.schema : nullptr, rf.strict, format_param);
  }
  // Tool schemas are checked whatever the model. In harmony output a request with tools or a
  // format is constrained as a whole: its headers may call only the functions tool_choice allows
  // (none: no call; a function's name: that one), and required or named choices leave no final
  // channel, so the turn ends in a call. A function without parameters takes any JSON object.
  for (const auto& t : r.tools) {
    auto m = t.parameters ? masker(&*t.parameters, t.strict, "tools") : masker(nullptr, false, "tools");
    if (harmony_ && r.tool_choice.may_call(t.name)) spec.tools[t.name] = std::move(m);
  }
  if (harmony_ && r.tool_choice.must_call()) spec.final_channel = spec.preambles = false;
  // A preamble's text is the answer's content too, which a format holds to its JSON alone.
  if (spec.final_format) spec.preambles = false;
  if (spec.whole_output && !spec.final_format) return nullptr;
  // Nothing to constrain: harmony's text guard alone (no special token inside a message's text;
  // never masked but to draw a refused token again, so it costs a plain request nothing).
  if (!spec.final_format && r.tools.empty()) spec.text_guard_only = true;
  spec.vocab = vocabulary();  // built on the first constrained request only
  return std::make_shared<structured::JsonConstraint>(std::move(spec));
}

std::shared_ptr<structured::JsonConstraint> StructuredOutput::for_completion(const CompletionRequest& r) {
  const ResponseFormat& rf = r.response_format;
  if (rf.type != "json_object" && rf.type != "json_schema") return nullptr;
  structured::JsonConstraintSpec spec;
  spec.ids = ids_;
  spec.whole_output = true;
  spec.final_format = rf.type == "json_object" ? masker(nullptr, false, "response_format")
                                               : masker(rf.schema ? &*rf.schema : nullptr, rf.strict, "response_format");
  spec.vocab = vocabulary();
  return std::make_shared<structured::JsonConstraint>(std::move(spec));
}

}  // namespace gptoss::server
