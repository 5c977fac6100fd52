// /v1/responses (the OpenAI Responses API): its request parsed into a chat request plus what the
// response object repeats, and its input items mapped onto chat messages.
#include <cctype>
#include <string>
#include <vector>

#include "server/openai_api.h"
#include "server/request_readers.h"

namespace gptoss::server {

using namespace request;

namespace {

// text: {format: {type: "text"} | {type: "json_object"} |
//        {type: "json_schema", name, schema, description?, strict?}} (the Responses API's flat
// form of chat's response_format). Returns the format and fills `echo` with what the response
// object repeats; every error names param "text.format" (or the sub-field).
ResponseFormat parse_text_format(const ojson& text, ojson& echo) {
  only_known_keys(text, "text", {"format"});
  ResponseFormat f;
  echo = {{"type", "text"}};
  const ojson* fo = get(text, "format");
  if (!fo) return f;
  const char* P = "text.format";
  if (!fo->is_object()) wrong_type(P, "an object", *fo);
  auto type = get_string(*fo, "type");
  if (!type) bad_request("'text.format' needs a 'type' (text, json_object or json_schema).", P, "missing_required_parameter");
  f.type = *type;
  if (f.type == "text" || f.type == "json_object") {
    only_known_keys(*fo, P, {"type"});
    echo = {{"type", f.type}};
    return f;
  }
  if (f.type != "json_schema")
    bad_request("'text.format.type' must be text, json_object or json_schema, not '" + f.type + "'.", "text.format.type",
                "invalid_value");
  only_known_keys(*fo, P, {"type", "name", "schema", "description", "strict"});
  auto name = get_string(*fo, "name");
  if (!name || name->empty()) bad_request("'text.format.name' is required for json_schema.", "text.format.name", "missing_required_parameter");
  if (name->size() > 64) bad_request("'text.format.name' may have at most 64 characters.", "text.format.name", "invalid_value");
  for (char ch : *name)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-'))
      bad_request("'text.format.name' may hold only letters, digits, '_' and '-'.", "text.format.name", "invalid_value");
  f.name = *name;
  const ojson* sc = get(*fo, "schema");
  if (!sc) bad_request("'text.format.schema' is required for json_schema.", "text.format.schema", "missing_required_parameter");
  if (!sc->is_object()) wrong_type("text.format.schema", "an object", *sc);
  f.schema = *sc;
  if (auto d = get_string(*fo, "description")) f.description = *d;
  if (auto st = get_bool(*fo, "strict")) f.strict = *st;
  echo = {{"type", "json_schema"}, {"name", f.name}, {"schema", *f.schema}, {"strict", f.strict}};
  if (!f.description.empty()) echo["description"] = f.description;
  return f;
}

// A content array's text (input_text / output_text / text parts), or a string.
std::string item_text(const ojson& c, const std::string& where) { return content_text(c, where); }

// Responses tools: {"type": "function", "name", "description", "parameters", "strict"}.
FunctionTool parse_responses_tool(const ojson& t, const std::string& where, const std::vector<FunctionTool>& earlier) {
  if (!t.is_object()) wrong_type(where, "an object", t);
  auto type = get_string(t, "type");
  if (!type || *type != "function")
    bad_request("Only tools of type 'function' are supported" + (type ? ", not '" + *type + "'." : "."), where + ".type",
                "unsupported_value");
  only_known_keys(t, where, {"type", "name", "description", "parameters", "strict"});
  FunctionTool ft;
  ft.name = get_string_at(t, "name", where).value_or("");
  check_tool_name(ft.name, earlier, where + ".name");
  if (auto d = get_string_at(t, "description", where)) ft.description = *d;
  if (const ojson* p = get(t, "parameters")) {
    check_tool_parameters(*p, ft.name, where + ".parameters");
    ft.parameters = *p;
  }
  // The arguments are constrained to `parameters` either way (StructuredOutput); strict also
  // refuses schema keywords the matcher cannot enforce, as on chat completions.
  if (auto s = get_bool(t, "strict")) ft.strict = *s;
  return ft;
}

ResponsesRequest parse_responses_body(const ojson& j) {
  ResponsesRequest r;
  ChatRequest& c = r.chat;
  ojson& echo = r.echo;
  if (auto m = get_string(j, "model")) c.model = *m;
  if (auto t = get_number(j, "temperature", 0.0, 2.0)) c.sampling.temperature = float(*t), echo["temperature"] = *t;
  if (auto t = get_number(j, "top_p", 0.0, 1.0)) {
    if (*t <= 0.0) bad_request("'top_p' must be greater than 0.", "top_p", "invalid_value");
    c.sampling.top_p = float(*t);
    echo["top_p"] = *t;
  }
  if (auto n = get_int(j, "max_output_tokens", 1, 1 << 30)) c.max_tokens = int(*n), echo["max_output_tokens"] = *n;
  if (auto b = get_bool(j, "stream")) c.stream = *b;
  if (auto b = get_bool(j, "store")) r.store = *b;
  echo["store"] = r.store;
  if (auto p = get_string(j, "previous_response_id")) {
    if (p->empty()) bad_request("'previous_response_id' must not be empty.", "previous_response_id", "invalid_value");
    r.previous_response_id = *p;
  }
  if (auto i = get_string(j, "instructions")) r.instructions = *i;
  bool parallel = true;
  if (auto b = get_bool(j, "parallel_tool_calls")) parallel = *b;
  echo["parallel_tool_calls"] = parallel;
  if (const ojson* md = get(j, "metadata")) {
    if (!md->is_object()) wrong_type("metadata", "an object", *md);
    if (md->size() > 16) bad_request("'metadata' may hold at most 16 keys.", "metadata", "invalid_value");
    for (auto it = md->begin(); it != md->end(); ++it)
      if (!it->is_string()) bad_request("'metadata' values must be strings.", "metadata", "invalid_value");
    echo["metadata"] = *md;
  }
  if (auto t = get_string(j, "truncation"); t && *t != "disabled")
    bad_request("Only 'truncation': 'disabled' is supported.", "truncation", "unsupported_value");
  if (const ojson* inc = get(j, "include")) {
    if (!inc->is_array()) wrong_type("include", "an array", *inc);
    if (!inc->empty())
      bad_request("'include' values are not supported (reasoning text is always returned in full).", "include",
                  "unsupported_value");
  }
  if (auto b = get_bool(j, "background"); b && *b)
    bad_request("'background' responses are not supported.", "background", "unsupported_value");
  for (const char* k : {"user", "safety_identifier", "prompt_cache_key", "service_tier"})
    if (const ojson* u = get(j, k); u && !u->is_string()) wrong_type(k, "a string", *u);
  if (auto u = get_string(j, "user")) echo["user"] = *u;

  // input: a string (one user message) or an array of items.
  const ojson* in = get(j, "input");
  if (!in) bad_request("'input' is required.", "input", "missing_required_parameter");
  if (in->is_string()) {
    r.input_items.push_back({{"type", "message"}, {"role", "user"}, {"content", in->get<std::string>()}});
  } else if (in->is_array()) {
    r.input_items = *in;
  } else {
    wrong_type("input", "a string or an array of items", *in);
  }
  c.messages = responses_items_to_messages(r.input_items, "input");
  if (c.messages.empty() && !r.previous_response_id)
    bad_request("'input' must not be empty.", "input", "invalid_value");

  echo["tools"] = ojson::array();
  if (const ojson* tools = get(j, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i)
      c.tools.push_back(parse_responses_tool((*tools)[i], "tools[" + std::to_string(i) + "]", c.tools));
    echo["tools"] = *tools;
  }
  echo["tool_choice"] = "auto";
  if (const ojson* tc = get(j, "tool_choice")) {
    std::optional<std::string> name;  // the Responses API's flat object form: {"type": "function", "name"}
    if (tc->is_object()) {
      auto type = get_string(*tc, "type");
      if (!type || *type != "function")
        bad_request("'tool_choice' objects must be of type 'function'.", "tool_choice", "unsupported_value");
      name = get_string(*tc, "name");
      if (!name) bad_request("'tool_choice' needs the function's 'name'.", "tool_choice", "invalid_value");
    }
    c.tool_choice = resolve_tool_choice(*tc, name, c.tools);
    echo["tool_choice"] = *tc;
  }
  echo["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  if (const ojson* o = get(j, "reasoning")) {
    if (!o->is_object()) wrong_type("reasoning", "an object", *o);
    only_known_keys(*o, "reasoning", {"effort", "summary", "generate_summary"});
    if (const ojson* e = get(*o, "effort")) c.reasoning_effort = parse_effort(*e, "reasoning.effort");
    for (const char* k : {"summary", "generate_summary"})
      if (get(*o, k))
        bad_request("'reasoning." + std::string(k) + "' is not supported: gpt-oss returns its full reasoning text, no summary.",
                    std::string("reasoning.") + k, "unsupported_value");
    if (c.reasoning_effort) echo["reasoning"]["effort"] = *c.reasoning_effort;
  }
  echo["text"] = {{"format", {{"type", "text"}}}};
  if (const ojson* t = get(j, "text")) {
    if (!t->is_object()) wrong_type("text", "an object", *t);
    c.response_format = parse_text_format(*t, echo["text"]["format"]);
  }
  echo["instructions"] = r.instructions ? ojson(*r.instructions) : ojson(nullptr);
  echo["previous_response_id"] = r.previous_response_id ? ojson(*r.previous_response_id) : ojson(nullptr);
  return r;
}
}  // namespace

std::vector<ChatMessage> responses_items_to_messages(const ojson& items, const std::string& field) {
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const ojson& it = items[i];
    std::string where = field + "[" + std::to_string(i) + "]";
    if (!it.is_object()) wrong_type(where, "an object", it);
    std::string type;
    if (auto t = get_string(it, "type")) type = *t;
    else if (it.contains("role")) type = "message";  // an EasyInputMessage: {role, content}
    else bad_request(where + " needs a 'type'.", where + ".type", "missing_required_parameter");
    ChatMessage m;
    if (type == "message") {
      only_known_keys(it, where, {"type", "role", "content", "id", "status"});
      auto role = get_string(it, "role");
      if (!role) bad_request(where + " needs a 'role'.", where + ".role", "missing_required_parameter");
      if (*role != "user" && *role != "system" && *role != "developer" && *role != "assistant")
        bad_request(where + ".role must be user, system, developer or assistant.", where + ".role", "invalid_value");
      const ojson* c = get(it, "content");
      if (!c) bad_request(where + " needs 'content'.", where + ".content", "missing_required_parameter");
      m.role = *role;
      m.content = item_text(*c, where + ".content");
    } else if (type == "reasoning") {
      // The analysis channel of an earlier turn: its text in content[] (reasoning_text), or
      // failing that the summary's. The renderer drops it once a final answer followed, as
      // harmony wants, and keeps it between a tool call and its result.
      only_known_keys(it, where, {"type", "id", "content", "summary", "status"});
      std::string text;
      for (const char* key : {"content", "summary"}) {
        const ojson* parts = get(it, key);
        if (!parts || !text.empty()) continue;
        if (!parts->is_array()) wrong_type(where + "." + key, "an array", *parts);
        for (const auto& p : *parts) {
          if (!p.is_object()) wrong_type(where + "." + key, "an array of objects", p);
          auto t = get_string(p, "text");
          if (!t) bad_request(where + "." + key + " parts need 'text'.", where + "." + key, "invalid_value");
          text += *t;
        }
      }
      m.role = "assistant";
      m.reasoning = text;
    } else if (type == "function_call") {
      only_known_keys(it, where, {"type", "id", "call_id", "name", "arguments", "status"});
      ToolCall tc;
      auto call_id = get_string(it, "call_id");
      auto name = get_string(it, "name");
      if (!call_id) bad_request(where + " needs a 'call_id'.", where + ".call_id", "missing_required_parameter");
      if (!name || name->empty()) bad_request(where + " needs a 'name'.", where + ".name", "missing_required_parameter");
      tc.id = *call_id;
      tc.name = *name;
      if (auto a = get_string(it, "arguments")) tc.arguments = *a;
      m.role = "assistant";
      m.tool_calls.push_back(std::move(tc));
    } else if (type == "function_call_output") {
      only_known_keys(it, where, {"type", "id", "call_id", "output", "status"});
      auto call_id = get_string(it, "call_id");
      if (!call_id) bad_request(where + " needs a 'call_id'.", where + ".call_id", "missing_required_parameter");
      const ojson* o = get(it, "output");
      if (!o) bad_request(where + " needs an 'output'.", where + ".output", "missing_required_parameter");
      m.role = "tool";
      m.tool_call_id = *call_id;
      m.content = item_text(*o, where + ".output");
    } else {
      bad_request(where + ": items of type '" + type + "' are not supported.", where + ".type", "unsupported_value");
    }
    out.push_back(std::move(m));
  }
  return out;
}

ResponsesRequest parse_responses_request(const ojson& j) {
  return parse_fields(j, responses_fields(), [&] { return parse_responses_body(j); });
}

}  // namespace gptoss::server
