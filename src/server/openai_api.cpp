#include "server/openai_api.h"

#include <cctype>
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <random>

#include "server/request_readers.h"

namespace gptoss::server {

nlohmann::json error_body(const ApiError& e) {
  nlohmann::json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  return {{"error", err}};
}

void bad_request(const std::string& msg, const std::string& param, const std::string& code) {
  throw ApiError{400, msg, "invalid_request_error", param, code};
}

ojson parse_body(const std::string& body) {
  if (body.empty()) bad_request("The request has no body: send a JSON object.", "", "missing_body");
  // A raw NUL is never JSON (strings spell it \u0000), but the parser stops at one as at the end.
  if (body.find('\0') != std::string::npos)
    bad_request("The request body is not valid JSON: it holds a NUL byte.", "", "invalid_json");
  // Arrays and objects nested past kMaxJsonDepth are refused while parsing: what later copies,
  // prints or renders the values (tool arguments and schemas, response formats) recurses, and a
  // value nested 100,000 deep overflowed the stack; no real request comes near the limit (a
  // schema at the structured-output checker's 24 levels takes ~50).
  struct TooDeep {};
  ojson j;
  try {
    j = ojson::parse(body, [](int depth, ojson::parse_event_t ev, ojson&) {
      if ((ev == ojson::parse_event_t::object_start || ev == ojson::parse_event_t::array_start) &&
          depth >= kMaxJsonDepth)
        throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    bad_request("The request body nests arrays and objects more than " + std::to_string(kMaxJsonDepth) +
                    " levels deep.",
                "", "invalid_json");
  } catch (const std::exception& e) {
    bad_request(std::string("The request body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) bad_request("The request body must be a JSON object.");
  return j;
}

namespace request {

const char* type_name(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::object: return "an object";
    case ojson::value_t::array: return "an array";
    case ojson::value_t::string: return "a string";
    case ojson::value_t::boolean: return "a boolean";
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned: return "an integer";
    case ojson::value_t::number_float: return "a number";
    default: return "an unknown type";
  }
}

// Returns the value of key when present and not null.
const ojson* get(const ojson& j, const char* key) {
  if (ReadKeys* rk = read_keys_slot(); rk && rk->obj == &j) rk->keys.emplace_back(key);
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void wrong_type(const std::string& key, const char* want, const ojson& v) {
  bad_request("'" + key + "' must be " + want + ", not " + type_name(v) + ".", key, "invalid_type");
}

std::optional<double> get_number(const ojson& j, const char* key, double lo, double hi) {
  const ojson* v = get(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be between %g and %g, got %g.", key, lo, hi, d);
    bad_request(buf, key, "invalid_value");
  }
  return d;
}

std::optional<int64_t> get_int(const ojson& j, const char* key, int64_t lo, int64_t hi) {
  const ojson* v = get(j, key);
  if (!v) return std::nullopt;
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::floor(d) != d) wrong_type(key, "an integer", *v);
    // (2^63 itself passes `d > double(INT64_MAX)`, which rounds to it, and would not convert)
    if (d < double(lo) || d > double(hi) || d >= 9223372036854775808.0)
      bad_request("'" + std::string(key) + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ".",
                  key, "invalid_value");
    return int64_t(d);
  }
  if (!v->is_number_integer()) wrong_type(key, "an integer", *v);
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(hi))
      bad_request("'" + std::string(key) + "' must be at most " + std::to_string(hi) + ".", key, "invalid_value");
    if (lo > 0 && u < uint64_t(lo))  // JSON reads 0 as unsigned
      bad_request("'" + std::string(key) + "' must be at least " + std::to_string(lo) + ".", key, "invalid_value");
    return int64_t(u);
  }
  int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    bad_request("'" + std::string(key) + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                    std::to_string(x) + ".",
                key, "invalid_value");
  return x;
}

std::optional<bool> get_bool(const ojson& j, const char* key) {
  const ojson* v = get(j, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const ojson& j, const char* key) {
  const ojson* v = get(j, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(key, "a string", *v);
  return v->get<std::string>();
}

std::optional<std::string> get_string_at(const ojson& j, const char* key, const std::string& where) {
  const ojson* v = get(j, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(where + "." + key, "a string", *v);
  return v->get<std::string>();
}

const RequestField* find_field(std::span<const RequestField> table, const std::string& key) {
  for (const auto& f : table)
    if (key == f.name) return &f;
  return nullptr;
}

void only_known_keys(const ojson& obj, const std::string& field, std::initializer_list<const char*> known) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (it->is_null()) continue;
    bool ok = false;
    for (const char* k : known) ok |= it.key() == k;
    if (!ok)
      bad_request("'" + field + "." + it.key() + "' is not supported.", field + "." + it.key(), "unsupported_value");
  }
}

void check_tool_name(const std::string& name, const std::vector<FunctionTool>& tools, const std::string& param) {
  if (name.empty()) bad_request("Each tool needs a 'name'.", param, "missing_required_parameter");
  if (name.size() > 64) bad_request("Tool names may have at most 64 characters.", param, "invalid_value");
  for (char ch : name)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-'))
      bad_request("Tool names may hold only letters, digits, '_' and '-'.", param, "invalid_value");
  for (const auto& other : tools)
    if (other.name == name) bad_request("Two tools are named '" + name + "'.", param, "invalid_value");
}

void check_tool_parameters(const ojson& p, const std::string& name, const std::string& param) {
  if (!p.is_object()) wrong_type(param, "an object", p);
  if (auto t = p.find("type"); t != p.end() && !(t->is_string() && *t == "object"))
    bad_request("Invalid schema for function '" + name + "': its parameters must be of type 'object'.", param,
                "invalid_schema");
}

ToolChoice resolve_tool_choice(const ojson& tc, const std::optional<std::string>& named,
                               const std::vector<FunctionTool>& tools) {
  ToolChoice choice;
  if (tc.is_string()) {
    choice.mode = tc.get<std::string>();
    if (choice.mode != "none" && choice.mode != "auto" && choice.mode != "required")
      bad_request("'tool_choice' must be none, auto, required or a function.", "tool_choice", "invalid_value");
  } else if (tc.is_object()) {
    bool found = false;
    for (const auto& t : tools) found |= t.name == *named;
    if (!found) bad_request("'tool_choice' names a function not in 'tools'.", "tool_choice", "invalid_value");
    choice.mode = "function";
    choice.function = *named;
  } else {
    wrong_type("tool_choice", "a string or an object", tc);
  }
  if (choice.mode == "required" && tools.empty())
    bad_request("'tool_choice' is required but no 'tools' were given.", "tool_choice", "invalid_value");
  return choice;
}

std::optional<std::string> parse_effort(const ojson& v, const std::string& key) {
  if (!v.is_string()) wrong_type(key, "a string", v);
  std::string e = v.get<std::string>();
  if (e != "low" && e != "medium" && e != "high") bad_request("'" + key + "' must be low, medium or high.", key, "invalid_value");
  return e;
}

std::string content_text(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string out;
    for (const auto& part : c) {
      if (!part.is_object()) wrong_type(where, "a string or an array of content parts", part);
      auto type = get_string(part, "type");
      if (!type) bad_request("Each content part needs a 'type'.", where, "invalid_value");
      if (*type == "text" || *type == "input_text" || *type == "output_text") {
        auto t = get_string(part, "text");
        if (!t) bad_request("A text content part needs 'text'.", where, "invalid_value");
        out += *t;
      } else {
        bad_request("Content parts of type '" + *type + "' are not supported.", where, "unsupported_value");
      }
    }
    return out;
  }
  wrong_type(where, "a string or an array of content parts", c);
}

}  // namespace request

using namespace request;

namespace {

// ------------------------------------------------------------------ field tables
// The fields of chat and text completions alike (parse_common reads them).
const RequestField kCommonFields[] = {
    {"model", FieldUse::kHonoured},
    {"max_tokens", FieldUse::kHonoured},
    {"max_completion_tokens", FieldUse::kHonoured},
    {"temperature", FieldUse::kHonoured},
    {"top_p", FieldUse::kHonoured},
    {"top_k", FieldUse::kHonoured},
    {"min_p", FieldUse::kHonoured},
    {"presence_penalty", FieldUse::kHonoured},
    {"frequency_penalty", FieldUse::kHonoured},
    {"seed", FieldUse::kHonoured},
    {"n", FieldUse::kHonoured},  // 1 only
    {"stop", FieldUse::kHonoured},
    {"stop_token_ids", FieldUse::kHonoured},
    {"ignore_eos", FieldUse::kHonoured},
    {"stream", FieldUse::kHonoured},
    {"stream_options", FieldUse::kHonoured},
    {"logit_bias", FieldUse::kHonoured},
    // text, json_object, json_schema (structured output; a completion's whole text, as vLLM's)
    {"response_format", FieldUse::kHonoured},
    {"skip_special_tokens", FieldUse::kHonoured},         // vLLM's; true only (special tokens never show)
    {"include_stop_str_in_output", FieldUse::kHonoured},  // vLLM's; false only
    {"user", FieldUse::kHarmless, "an end-user id for the provider's abuse monitoring; nothing is kept"},
    {"repetition_penalty", FieldUse::kRefused,
     "'repetition_penalty' is not supported; use 'presence_penalty' or 'frequency_penalty'."},
};

const RequestField kChatOnlyFields[] = {
    {"messages", FieldUse::kHonoured},
    {"logprobs", FieldUse::kHonoured},
    {"top_logprobs", FieldUse::kHonoured},
    {"tools", FieldUse::kHonoured},
    {"tool_choice", FieldUse::kHonoured},
    // gpt-oss makes one call per turn (generation ends at <|call|>), so true and false both hold.
    {"parallel_tool_calls", FieldUse::kHonoured},
    {"reasoning_effort", FieldUse::kHonoured},
    {"reasoning", FieldUse::kHonoured},
    {"store", FieldUse::kHonoured},            // false only: this server stores nothing
    {"metadata", FieldUse::kHarmless, "tags for stored completions; this server stores nothing (store is false)"},
    {"safety_identifier", FieldUse::kHarmless, "an end-user id for the provider's abuse monitoring; nothing is kept"},
    {"prompt_cache_key", FieldUse::kHarmless, "a routing hint for the provider's prompt cache; one server, no routing"},
    {"functions", FieldUse::kRefused, "The legacy 'functions' parameter is not supported; use 'tools'."},
    {"function_call", FieldUse::kRefused, "The legacy 'function_call' parameter is not supported; use 'tool_choice'."},
};

const RequestField kCompletionOnlyFields[] = {
    {"prompt", FieldUse::kHonoured},
    {"logprobs", FieldUse::kHonoured},
    {"echo", FieldUse::kHonoured},
    {"best_of", FieldUse::kHonoured},  // 1 only
    {"add_special_tokens", FieldUse::kHarmless,
     "o200k_harmony adds no BOS/EOS tokens, so true and false give the same tokens"},
    {"suffix", FieldUse::kRefused, "'suffix' (text insertion) is not supported."},
};

std::vector<RequestField> concat(std::span<const RequestField> a, std::span<const RequestField> b) {
  std::vector<RequestField> v(a.begin(), a.end());
  v.insert(v.end(), b.begin(), b.end());
  return v;
}
const std::vector<RequestField> kChatFields = concat(kCommonFields, kChatOnlyFields);
const std::vector<RequestField> kCompletionFields = concat(kCommonFields, kCompletionOnlyFields);

const RequestField kTokenizeFields[] = {
    {"model", FieldUse::kHonoured},
    {"prompt", FieldUse::kHonoured},
    {"messages", FieldUse::kHonoured},
    {"tools", FieldUse::kHonoured},
    {"tool_choice", FieldUse::kHonoured},
    {"reasoning_effort", FieldUse::kHonoured},
    {"reasoning", FieldUse::kHonoured},
    {"add_generation_prompt", FieldUse::kHonoured},
    {"continue_final_message", FieldUse::kHonoured},  // false only
    {"return_token_strs", FieldUse::kHonoured},
    {"add_special_tokens", FieldUse::kHarmless,
     "o200k_harmony adds no BOS/EOS tokens, so true and false give the same tokens"},
};

const RequestField kDetokenizeFields[] = {
    {"model", FieldUse::kHonoured},
    {"tokens", FieldUse::kHonoured},
};

// /v1/responses: its own fields (the Responses API names them differently from chat).
const RequestField kResponsesFields[] = {
    {"model", FieldUse::kHonoured},
    {"input", FieldUse::kHonoured},
    {"instructions", FieldUse::kHonoured},
    {"previous_response_id", FieldUse::kHonoured},
    {"store", FieldUse::kHonoured},
    {"stream", FieldUse::kHonoured},
    {"max_output_tokens", FieldUse::kHonoured},
    {"temperature", FieldUse::kHonoured},
    {"top_p", FieldUse::kHonoured},
    {"tools", FieldUse::kHonoured},        // type function only
    {"tool_choice", FieldUse::kHonoured},
    // gpt-oss makes one call per turn (generation ends at <|call|>), so true and false both hold.
    {"parallel_tool_calls", FieldUse::kHonoured},
    {"reasoning", FieldUse::kHonoured},    // effort; summaries refused (gpt-oss writes none)
    {"text", FieldUse::kHonoured},         // format: text, json_object, json_schema (structured output)
    {"metadata", FieldUse::kHonoured},     // kept with the stored response and repeated in it
    {"truncation", FieldUse::kHonoured},   // "disabled" only: a prompt past the context is a 400
    {"include", FieldUse::kHonoured},      // an empty list only
    {"background", FieldUse::kHonoured},   // false only
    {"user", FieldUse::kHarmless, "an end-user id for the provider's abuse monitoring; nothing is kept"},
    {"safety_identifier", FieldUse::kHarmless, "an end-user id for the provider's abuse monitoring; nothing is kept"},
    {"prompt_cache_key", FieldUse::kHarmless, "a routing hint for the provider's prompt cache; one server, no routing"},
    {"service_tier", FieldUse::kHarmless, "one server, one tier"},
    {"top_logprobs", FieldUse::kRefused, "'top_logprobs' is not supported on /v1/responses."},
    {"max_tool_calls", FieldUse::kRefused, "'max_tool_calls' is not supported (gpt-oss makes one call per turn)."},
    {"conversation", FieldUse::kRefused, "'conversation' objects are not supported; use 'previous_response_id'."},
    {"prompt", FieldUse::kRefused, "Stored prompt templates ('prompt') are not supported."},
};

// logit_bias: {"token id": bias in [-100, 100]}, added to the logits before sampling (the ids
// are checked against the vocabulary when the request is submitted).
void parse_logit_bias(const ojson& j, SamplingParams& sp) {
  const ojson* lb = get(j, "logit_bias");
  if (!lb) return;
  if (!lb->is_object()) wrong_type("logit_bias", "an object mapping token ids to numbers", *lb);
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& k = it.key();
    bool digits = !k.empty() && k.size() <= 10;
    for (char c : k) digits &= c >= '0' && c <= '9';
    if (!digits || std::stoll(k) > INT32_MAX)
      bad_request("'logit_bias' keys must be token ids, got '" + k + "'.", "logit_bias", "invalid_value");
    if (!it->is_number()) wrong_type("logit_bias", "an object mapping token ids to numbers", *it);
    double b = it->get<double>();
    if (!std::isfinite(b) || b < -100.0 || b > 100.0)
      bad_request("'logit_bias' values must be between -100 and 100.", "logit_bias", "invalid_value");
    sp.logit_bias.emplace_back(int32_t(std::stoll(k)), float(b));
  }
}

// reasoning_effort, or the object form reasoning: {"effort": ...}; both must agree.
void parse_reasoning(const ojson& j, ChatRequest& r) {
  if (const ojson* e = get(j, "reasoning_effort")) r.reasoning_effort = parse_effort(*e, "reasoning_effort");
  if (const ojson* o = get(j, "reasoning")) {
    if (!o->is_object()) wrong_type("reasoning", "an object", *o);
    only_known_keys(*o, "reasoning", {"effort"});
    if (const ojson* e = get(*o, "effort")) {
      auto effort = parse_effort(*e, "reasoning.effort");
      if (r.reasoning_effort && *r.reasoning_effort != *effort)
        bad_request("'reasoning.effort' and 'reasoning_effort' disagree.", "reasoning.effort", "invalid_value");
      r.reasoning_effort = effort;
    }
  }
}

ResponseFormat parse_response_format(const ojson& rf);

void parse_common(const ojson& j, CommonRequest& r) {
  const ojson* model = get(j, "model");
  if (model && !model->is_string()) wrong_type("model", "a string", *model);
  if (model) r.model = model->get<std::string>();
  // max_completion_tokens is the newer name of max_tokens: either, or both when they agree.
  const auto mct = get_int(j, "max_completion_tokens", 1, INT64_MAX);
  const auto mt = get_int(j, "max_tokens", 1, INT64_MAX);
  if (mct && mt && *mct != *mt)
    bad_request("'max_tokens' and 'max_completion_tokens' disagree; send one of them.", "max_tokens", "invalid_value");
  if (mct || mt) r.max_tokens = int(std::min<int64_t>(mct ? *mct : *mt, 1 << 30));
  SamplingParams& sp = r.sampling;
  if (auto t = get_number(j, "temperature", 0.0, 2.0)) sp.temperature = float(*t);
  if (auto t = get_number(j, "top_p", 0.0, 1.0)) {
    if (*t <= 0.0) bad_request("'top_p' must be greater than 0.", "top_p", "invalid_value");
    sp.top_p = float(*t);
  }
  if (auto t = get_int(j, "top_k", -1, 1 << 30)) sp.top_k = int(*t);
  if (auto t = get_number(j, "min_p", 0.0, 1.0)) sp.min_p = float(*t);
  if (auto t = get_number(j, "presence_penalty", -2.0, 2.0)) sp.presence_penalty = float(*t);
  if (auto t = get_number(j, "frequency_penalty", -2.0, 2.0)) sp.frequency_penalty = float(*t);
  if (auto t = get_int(j, "seed", INT64_MIN, INT64_MAX)) sp.seed = uint64_t(*t);
  if (auto n = get_int(j, "n", 1, 1 << 30); n && *n != 1)
    bad_request("Only n=1 is supported.", "n", "unsupported_value");
  if (const ojson* st = get(j, "stop")) {
    if (st->is_string()) {
      sp.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      if (st->size() > 16) bad_request("'stop' may hold at most 16 strings.", "stop", "invalid_value");
      for (const auto& s : *st) {
        if (!s.is_string()) wrong_type("stop", "a string or an array of strings", s);
        sp.stop.push_back(s.get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *st);
    }
    for (const auto& s : sp.stop)
      if (s.empty()) bad_request("'stop' strings must not be empty.", "stop", "invalid_value");
  }
  if (const ojson* ids = get(j, "stop_token_ids")) {
    if (!ids->is_array()) wrong_type("stop_token_ids", "an array of integers", *ids);
    for (const auto& v : *ids) {
      if (!v.is_number_integer()) wrong_type("stop_token_ids", "an array of integers", v);
      // The range before the cast: 2^32 + 32 must not become token 32 (the vocabulary is checked
      // when the request is submitted).
      const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(INT32_MAX)
                                                   : v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
      if (!in_range)
        bad_request("stop_token_ids holds an id outside the vocabulary.", "stop_token_ids", "invalid_value");
      sp.stop_token_ids.push_back(int32_t(v.get<int64_t>()));
    }
  }
  if (auto b = get_bool(j, "ignore_eos")) sp.ignore_eos = *b;
  if (auto b = get_bool(j, "stream")) r.stream = *b;
  if (const ojson* so = get(j, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    only_known_keys(*so, "stream_options", {"include_usage", "continuous_usage_stats"});
    if (auto b = get_bool(*so, "include_usage")) r.include_usage = *b;
    if (auto b = get_bool(*so, "continuous_usage_stats")) r.continuous_usage = *b;
  }
  if (const ojson* u = get(j, "user"); u && !u->is_string()) wrong_type("user", "a string", *u);
  parse_logit_bias(j, sp);
  // vLLM's output switches, accepted at the values this server implements.
  if (auto b = get_bool(j, "skip_special_tokens"); b && !*b)
    bad_request("'skip_special_tokens': false is not supported.", "skip_special_tokens", "unsupported_value");
  if (auto b = get_bool(j, "include_stop_str_in_output"); b && *b)
    bad_request("'include_stop_str_in_output': true is not supported.", "include_stop_str_in_output",
                "unsupported_value");
  if (const ojson* rf = get(j, "response_format")) r.response_format = parse_response_format(*rf);
}

ResponseFormat parse_response_format(const ojson& rf) {
  const char* P = "response_format";
  if (!rf.is_object()) wrong_type(P, "an object", rf);
  only_known_keys(rf, P, {"type", "json_schema"});
  ResponseFormat f;
  auto type = get_string(rf, "type");
  if (!type) bad_request("'response_format' needs a 'type' (text, json_object or json_schema).", P, "missing_required_parameter");
  f.type = *type;
  if (f.type == "text" || f.type == "json_object") return f;
  if (f.type != "json_schema")
    bad_request("'response_format.type' must be text, json_object or json_schema, not '" + f.type + "'.", P, "invalid_value");
  const ojson* js = get(rf, "json_schema");
  if (!js) bad_request("'response_format' of type json_schema needs a 'json_schema' object.", P, "missing_required_parameter");
  if (!js->is_object()) wrong_type("response_format.json_schema", "an object", *js);
  only_known_keys(*js, "response_format.json_schema", {"name", "description", "schema", "strict"});
  auto name = get_string(*js, "name");
  if (!name || name->empty()) bad_request("'response_format.json_schema.name' is required.", P, "missing_required_parameter");
  if (name->size() > 64) bad_request("'response_format.json_schema.name' may have at most 64 characters.", P, "invalid_value");
  for (char ch : *name)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-'))
      bad_request("'response_format.json_schema.name' may hold only letters, digits, '_' and '-'.", P, "invalid_value");
  f.name = *name;
  if (auto d = get_string(*js, "description")) f.description = *d;
  if (auto st = get_bool(*js, "strict")) f.strict = *st;
  if (const ojson* sc = get(*js, "schema")) {
    if (!sc->is_object() && !sc->is_boolean()) wrong_type("response_format.json_schema.schema", "an object", *sc);
    f.schema = *sc;
  }
  return f;
}

}  // namespace

std::span<const RequestField> chat_fields() { return kChatFields; }
std::span<const RequestField> completion_fields() { return kCompletionFields; }
std::span<const RequestField> tokenize_fields() { return kTokenizeFields; }
std::span<const RequestField> detokenize_fields() { return kDetokenizeFields; }
std::span<const RequestField> responses_fields() { return kResponsesFields; }

namespace {

ChatRequest parse_chat_body(const ojson& j) {
  ChatRequest r;
  parse_common(j, r);
  if (auto b = get_bool(j, "logprobs")) r.logprobs = *b;
  if (auto t = get_int(j, "top_logprobs", 0, 20)) {
    r.top_logprobs = int(*t);
    if (*t > 0 && !r.logprobs)
      bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs", "invalid_value");
  }
  r.sampling.logprobs = r.logprobs ? r.top_logprobs : -1;
  const ojson* msgs = get(j, "messages");
  if (!msgs) bad_request("'messages' is required.", "messages", "missing_required_parameter");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) bad_request("'messages' must not be empty.", "messages", "invalid_value");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(where, "an object", m);
    ChatMessage cm;
    auto role = get_string_at(m, "role", where);
    if (!role) bad_request(where + " needs a 'role'.", where + ".role", "missing_required_parameter");
    cm.role = *role;
    if (cm.role != "system" && cm.role != "developer" && cm.role != "user" && cm.role != "assistant" &&
        cm.role != "tool")
      bad_request(where + ".role '" + cm.role + "' is not one of system, developer, user, assistant, tool.",
                  where + ".role", "invalid_value");
    // Each role's keys: anything else would be read by nobody. `name` only names a tool message's
    // function: harmony gives the other roles no author names. An assistant message as clients
    // echo it back may carry an empty refusal and annotations.
    if (cm.role == "assistant")
      only_known_keys(m, where, {"role", "content", "reasoning_content", "reasoning", "tool_calls", "refusal", "annotations"});
    else if (cm.role == "tool")
      only_known_keys(m, where, {"role", "content", "tool_call_id", "name"});
    else
      only_known_keys(m, where, {"role", "content"});
    if (const ojson* c = get(m, "content")) cm.content = content_text(*c, where + ".content");
    if (cm.role == "assistant") {
      if (auto rf = get_string_at(m, "refusal", where); rf && !rf->empty())
        bad_request(where + ".refusal: refusals are not supported in the conversation.", where + ".refusal",
                    "unsupported_value");
      if (const ojson* an = get(m, "annotations"); an && !(an->is_array() && an->empty()))
        bad_request(where + ".annotations: annotations are not supported.", where + ".annotations", "unsupported_value");
      if (auto rc = get_string_at(m, "reasoning_content", where)) cm.reasoning = *rc;
      else if (auto rs = get_string_at(m, "reasoning", where)) cm.reasoning = *rs;
      if (const ojson* tcs = get(m, "tool_calls")) {
        if (!tcs->is_array()) wrong_type(where + ".tool_calls", "an array", *tcs);
        for (size_t k = 0; k < tcs->size(); ++k) {
          const ojson& tc = (*tcs)[k];
          const std::string tw = where + ".tool_calls[" + std::to_string(k) + "]";
          if (!tc.is_object()) wrong_type(tw, "an object", tc);
          only_known_keys(tc, tw, {"id", "type", "function"});
          if (auto type = get_string_at(tc, "type", tw); type && *type != "function")
            bad_request(tw + ".type must be 'function'.", tw + ".type", "invalid_value");
          ToolCall c;
          if (auto id = get_string_at(tc, "id", tw)) c.id = *id;
          const ojson* fn = get(tc, "function");
          if (!fn || !fn->is_object()) bad_request(tw + " needs a 'function' object.", tw + ".function", "invalid_value");
          only_known_keys(*fn, tw + ".function", {"name", "arguments"});
          auto name = get_string_at(*fn, "name", tw + ".function");
          if (!name || name->empty()) bad_request(tw + ".function needs a 'name'.", tw + ".function.name", "invalid_value");
          c.name = *name;
          if (const ojson* a = get(*fn, "arguments")) c.arguments = a->is_string() ? a->get<std::string>() : a->dump();
          cm.tool_calls.push_back(std::move(c));
        }
      }
      if (!cm.content && !cm.reasoning && cm.tool_calls.empty())
        bad_request(where + " (assistant) needs 'content' or 'tool_calls'.", where + ".content", "invalid_value");
    } else {
      if (!cm.content)
        bad_request(where + " needs 'content'.", where + ".content", "missing_required_parameter");
    }
    if (cm.role == "tool") {
      if (auto id = get_string_at(m, "tool_call_id", where)) cm.tool_call_id = *id;
      if (auto n = get_string_at(m, "name", where)) cm.name = *n;
    }
    r.messages.push_back(std::move(cm));
  }
  if (const ojson* tools = get(j, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    for (size_t k = 0; k < tools->size(); ++k) {
      const ojson& t = (*tools)[k];
      const std::string tw = "tools[" + std::to_string(k) + "]";
      if (!t.is_object()) wrong_type(tw, "an object", t);
      only_known_keys(t, tw, {"type", "function"});
      auto type = get_string_at(t, "type", tw);
      if (type && *type != "function")
        bad_request("Only tools of type 'function' are supported.", tw + ".type", "unsupported_value");
      const ojson* fn = get(t, "function");
      if (!fn || !fn->is_object()) bad_request("Each tool needs a 'function' object.", tw + ".function", "invalid_value");
      const std::string fw = tw + ".function";
      only_known_keys(*fn, fw, {"name", "description", "parameters", "strict"});
      FunctionTool ft;
      ft.name = get_string_at(*fn, "name", fw).value_or("");
      check_tool_name(ft.name, r.tools, fw + ".name");
      if (auto d = get_string_at(*fn, "description", fw)) ft.description = *d;
      if (const ojson* p = get(*fn, "parameters")) {
        check_tool_parameters(*p, ft.name, fw + ".parameters");
        ft.parameters = *p;
      }
      if (const ojson* st = get(*fn, "strict")) {
        if (!st->is_boolean()) wrong_type(fw + ".strict", "a boolean", *st);
        ft.strict = st->get<bool>();
      }
      r.tools.push_back(std::move(ft));
    }
  }
  if (const ojson* tc = get(j, "tool_choice")) {
    std::optional<std::string> name;  // chat's object form: {"type": "function", "function": {"name"}}
    if (tc->is_object()) {
      only_known_keys(*tc, "tool_choice", {"type", "function"});
      if (auto type = get_string_at(*tc, "type", "tool_choice"); type && *type != "function")
        bad_request("'tool_choice.type' must be 'function'.", "tool_choice.type", "invalid_value");
      const ojson* fn = get(*tc, "function");
      if (fn && fn->is_object()) only_known_keys(*fn, "tool_choice.function", {"name"});
      name = fn && fn->is_object() ? get_string(*fn, "name") : std::nullopt;
      if (!name) bad_request("'tool_choice' object needs function.name.", "tool_choice", "invalid_value");
    }
    r.tool_choice = resolve_tool_choice(*tc, name, r.tools);
  }
  parse_reasoning(j, r);
  (void)get_bool(j, "parallel_tool_calls");  // type-checked; see kChatFields
  if (auto st = get_bool(j, "store"); st && *st)
    bad_request("'store' is not supported: this server keeps no completions.", "store", "unsupported_value");
  if (const ojson* md = get(j, "metadata"); md && !md->is_object()) wrong_type("metadata", "an object", *md);
  return r;
}

CompletionRequest parse_completion_body(const ojson& j) {
  CompletionRequest r;
  parse_common(j, r);
  if (auto b = get_int(j, "best_of", 1, 1 << 30); b && *b != 1)
    bad_request("Only best_of=1 is supported.", "best_of", "unsupported_value");
  if (auto lp = get_int(j, "logprobs", 0, 20)) {
    r.logprobs = true;
    r.top_logprobs = int(*lp);
  }
  r.sampling.logprobs = r.logprobs ? r.top_logprobs : -1;
  if (auto e = get_bool(j, "echo")) r.echo = *e;
  const ojson* p = get(j, "prompt");
  if (!p) bad_request("'prompt' is required.", "prompt", "missing_required_parameter");
  auto int_list = [&](const ojson& a) {
    std::vector<int32_t> ids;
    for (const auto& v : a) {
      if (!v.is_number_integer()) wrong_type("prompt", "a string, an array of strings or an array of token ids", v);
      int64_t x = v.get<int64_t>();
      if (x < 0 || x > INT32_MAX) bad_request("Token id " + std::to_string(x) + " is out of range.", "prompt", "invalid_value");
      ids.push_back(int32_t(x));
    }
    return ids;
  };
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) bad_request("'prompt' must not be empty.", "prompt", "invalid_value");
    const ojson& first = (*p)[0];
    if (first.is_string() || first.is_array()) {
      if (p->size() != 1) bad_request("Only one prompt per request is supported.", "prompt", "unsupported_value");
      if (first.is_string()) r.prompt = first.get<std::string>();
      else r.prompt = int_list(first);
    } else {
      r.prompt = int_list(*p);
    }
  } else {
    wrong_type("prompt", "a string, an array of strings or an array of token ids", *p);
  }
  if (auto* s = std::get_if<std::string>(&r.prompt); s && s->empty())
    bad_request("'prompt' must not be empty.", "prompt", "invalid_value");
  if (auto* ids = std::get_if<std::vector<int32_t>>(&r.prompt); ids && ids->empty())
    bad_request("'prompt' must not be empty.", "prompt", "invalid_value");
  return r;
}

}  // namespace

ChatRequest parse_chat_request(const ojson& j) {
  return parse_fields(j, kChatFields, [&] { return parse_chat_body(j); });
}

CompletionRequest parse_completion_request(const ojson& j) {
  return parse_fields(j, kCompletionFields, [&] { return parse_completion_body(j); });
}

TokenizeRequest parse_tokenize_request(const ojson& j) {
  return parse_fields(j, kTokenizeFields, [&] {
    TokenizeRequest r;
    if (const ojson* m = get(j, "model"); m && !m->is_string()) wrong_type("model", "a string", *m);
    if (auto b = get_bool(j, "add_generation_prompt")) r.add_generation_prompt = *b;
    if (auto b = get_bool(j, "return_token_strs")) r.return_token_strs = *b;
    if (auto b = get_bool(j, "continue_final_message"); b && *b)
      bad_request("'continue_final_message' is not supported.", "continue_final_message", "unsupported_value");
    if (auto b = get_bool(j, "add_special_tokens")) (void)b;
    const ojson* msgs = get(j, "messages");
    auto prompt = get_string(j, "prompt");
    if (msgs && prompt) bad_request("Give 'prompt' or 'messages', not both.", "prompt", "invalid_value");
    if (msgs) {
      // The chat fields, parsed as a chat request would parse them.
      ojson chat = ojson::object();
      for (const char* k : {"model", "messages", "tools", "tool_choice", "reasoning_effort", "reasoning"})
        if (const ojson* v = get(j, k)) chat[k] = *v;
      r.chat = parse_chat_request(chat);
    } else if (prompt) {
      r.prompt = *prompt;
    } else {
      for (const char* k : {"tools", "tool_choice", "reasoning_effort", "reasoning"})
        if (get(j, k)) bad_request("'" + std::string(k) + "' needs 'messages'.", k, "invalid_value");
      bad_request("'prompt' (a string) or 'messages' is required.", "prompt", "missing_required_parameter");
    }
    return r;
  });
}

DetokenizeRequest parse_detokenize_request(const ojson& j) {
  return parse_fields(j, kDetokenizeFields, [&] {
    DetokenizeRequest r;
    if (const ojson* m = get(j, "model"); m && !m->is_string()) wrong_type("model", "a string", *m);
    const ojson* t = get(j, "tokens");
    if (!t) bad_request("'tokens' (an array of token ids) is required.", "tokens", "missing_required_parameter");
    if (!t->is_array()) wrong_type("tokens", "an array of token ids", *t);
    for (const auto& v : *t) {
      if (!v.is_number_integer()) wrong_type("tokens", "an array of token ids", v);
      int64_t x = v.get<int64_t>();
      if (x < 0 || x > INT32_MAX) bad_request("Token id " + std::to_string(x) + " is out of range.", "tokens", "invalid_value");
      r.tokens.push_back(int32_t(x));
    }
    return r;
  });
}

std::string make_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)rng(), (unsigned long long)(rng() & 0xffffffff));
  return prefix + buf;
}

}  // namespace gptoss::server
