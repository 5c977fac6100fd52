#pragma once
// A JSON Schema subset compiled into a grammar the byte-level matcher (json_matcher.h) runs.
//
// Supported: type (object, array, string, number, integer, boolean, null, or a list of them),
// properties, required, additionalProperties (false, true or a schema), items, minItems,
// maxItems, enum, const, anyOf/oneOf whose alternatives start with different bytes (e.g.
// string or null; two objects do not), minLength and maxLength (characters; escapes count one;
// not with a format), string formats date, time, date-time and uuid, local
// $ref ("#", "#/$defs/NAME", "#/definitions/NAME", recursion included). Annotations (title,
// description, default, examples, ...) are ignored. Other keywords (pattern, minimum,
// ...) are refused when `strict` and ignored (the output is then looser than the
// schema) when not. A malformed schema is refused either way, an ignored keyword's value too (a
// pattern that is no regular expression, a length that is no integer). Errors are SchemaError.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace gptoss::structured {

class SchemaError : public Error {
 public:
  using Error::Error;
};

// A byte trie over a set of literal strings (enum values, object keys with their quotes).
struct ByteTrie {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t value = -1;                             // index of the string ending here, -1: none
    uint64_t subtree = 0;                           // bits (value % 64) of the strings below
  };
  std::vector<Node> nodes{Node{}};  // 0: root
  int32_t child(int32_t n, uint8_t b) const {
    for (const auto& [c, to] : nodes[size_t(n)].next)
      if (c == b) return to;
    return -1;
  }
  void insert(std::string_view s, int32_t value);
};

enum class NodeKind : uint8_t { kAny, kObject, kArray, kString, kNumber, kInteger, kLiteral, kUnion };
enum class StringFormat : uint8_t { kNone, kDate, kTime, kDateTime, kUuid };

struct GrammarNode {
  NodeKind kind = NodeKind::kAny;
  // kObject
  std::vector<std::string> prop_names;
  std::vector<int32_t> prop_nodes;
  ByteTrie keys;            // "\"name\"" of each property, value = property index
  uint64_t required = 0;    // property bits
  int32_t additional = -1;  // node of properties not listed, -1: none allowed
  // kArray
  int32_t items = -1;
  uint32_t min_items = 0, max_items = UINT32_MAX;
  // kString
  StringFormat format = StringFormat::kNone;
  uint32_t min_len = 0, max_len = UINT32_MAX;  // characters (minLength, maxLength; at most 65535)
  bool key = false;         // an object key outside `properties`: no escapes (so bytes = text)
  // kLiteral: serialized JSON values
  ByteTrie literals;
  // kUnion: the alternatives, and the one taking each first byte (-1: none)
  std::vector<int32_t> alts;
  std::vector<int32_t> alt_by_byte;
  // The fewest matcher frames a shortest value of this node holds at once, its own included:
  // 1 for a scalar, 1 + the deepest required part for a container. The matcher opens a node only
  // where that many frames fit under its depth limit, so a recursive schema never strands it.
  uint8_t min_frames = 1;
  // kObject: the largest min_frames of its properties and additional properties (where all of
  // them fit, the matcher need not check one by one).
  uint8_t max_part_frames = 0;
};

struct Grammar {
  std::vector<GrammarNode> nodes;
  int32_t root = 0;
  // Helper nodes every grammar has (the pieces of "any JSON value").
  int32_t any = 0, any_object = 0, any_array = 0, free_string = 0, free_key = 0, number = 0, literal_tfn = 0;
};

// Compiles a JSON schema (an object, or true). Throws SchemaError.
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema, bool strict);
// Any JSON object (response_format json_object).
std::shared_ptr<const Grammar> any_json_object_grammar();

}  // namespace gptoss::structured
