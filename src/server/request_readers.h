#pragma once
// What the request parsers share (openai_api.cpp; responses_request.cpp, the Responses API's):
// typed readers of a body's fields, each refusing a wrong type or an out-of-range value with an
// OpenAI error that names the field, and parse_fields, which refuses the fields a route's table
// does not know and the honoured fields its parser never read. server/ only.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "server/openai_api.h"

namespace gptoss::server::request {

// The top-level keys a parser read, so parse_fields() can refuse an honoured field nobody read.
struct ReadKeys {
  const ojson* obj = nullptr;
  std::vector<std::string> keys;
};
// The parse in progress on this thread (null outside parse_fields): get() records its reads there.
inline ReadKeys*& read_keys_slot() {
  thread_local ReadKeys* slot = nullptr;
  return slot;
}

const char* type_name(const ojson& v);
// Returns the value of key when present and not null.
const ojson* get(const ojson& j, const char* key);
[[noreturn]] void wrong_type(const std::string& key, const char* want, const ojson& v);
std::optional<double> get_number(const ojson& j, const char* key, double lo, double hi);
std::optional<int64_t> get_int(const ojson& j, const char* key, int64_t lo, int64_t hi);
std::optional<bool> get_bool(const ojson& j, const char* key);
std::optional<std::string> get_string(const ojson& j, const char* key);
// get_string for a sub-field: a wrong type is named "where.key".
std::optional<std::string> get_string_at(const ojson& j, const char* key, const std::string& where);
const RequestField* find_field(std::span<const RequestField> table, const std::string& key);
// Sub-fields of an object field: anything but `known` is refused, naming "field.key".
void only_known_keys(const ojson& obj, const std::string& field, std::initializer_list<const char*> known);
// A function tool's name (1-64 letters, digits, '_' and '-'), new among `tools`; its parameters
// schema (an object whose type, if given, is "object", as OpenAI requires). `param` names the field.
void check_tool_name(const std::string& name, const std::vector<FunctionTool>& tools, const std::string& param);
void check_tool_parameters(const ojson& p, const std::string& name, const std::string& param);
// tool_choice as chat completions and the Responses API share it: a string (none, auto, required)
// or an object whose function name the caller read into `named` (each API places it differently;
// the caller refuses an object without one). The function must be among `tools`; required needs
// tools.
ToolChoice resolve_tool_choice(const ojson& tc, const std::optional<std::string>& named,
                               const std::vector<FunctionTool>& tools);
// A reasoning effort: low, medium or high.
std::optional<std::string> parse_effort(const ojson& v, const std::string& key);
// A string, or an array of text content parts (text, input_text, output_text) joined.
std::string content_text(const ojson& c, const std::string& where);

// Runs `parse` after refusing unknown and unsupported fields; then refuses any field the table
// calls honoured that `parse` never read. A null value counts as absent.
template <class Parse>
auto parse_fields(const ojson& j, std::span<const RequestField> table, Parse parse) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_null()) continue;
    const RequestField* f = find_field(table, it.key());
    if (!f) bad_request("Unrecognized request argument supplied: '" + it.key() + "'.", it.key(), "unsupported_value");
    if (f->use == FieldUse::kRefused) bad_request(f->note, it.key(), "unsupported_value");
  }
  ReadKeys read{&j, {}};
  ReadKeys*& slot = read_keys_slot();
  ReadKeys* outer = slot;
  slot = &read;
  struct Restore {
    ReadKeys*& slot;
    ReadKeys* outer;
    ~Restore() { slot = outer; }
  } restore{slot, outer};
  auto r = parse();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const RequestField* f = find_field(table, it.key());
    if (it->is_null() || f->use != FieldUse::kHonoured) continue;
    if (std::find(read.keys.begin(), read.keys.end(), it.key()) == read.keys.end())
      bad_request("'" + it.key() + "' is not supported.", it.key(), "unsupported_value");
  }
  return r;
}

}  // namespace gptoss::server::request
