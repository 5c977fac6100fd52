#include "structured/json_grammar.h"

#include "structured/json_matcher.h"

#include <algorithm>
#include <bitset>
#include <map>
#include <regex>
#include <set>

#include "structured/json_matcher.h"

namespace gptoss::structured {

using json = nlohmann::json;

void ByteTrie::insert(std::string_view s, int32_t value) {
  int32_t n = 0;
  nodes[0].subtree |= uint64_t(1) << (value % 64);
  for (unsigned char c : s) {
    int32_t next = child(n, c);
    if (next < 0) {
      next = int32_t(nodes.size());
      nodes.emplace_back();
      auto& v = nodes[size_t(n)].next;
      v.insert(std::upper_bound(v.begin(), v.end(), std::make_pair(c, INT32_MIN),
                                [](const auto& a, const auto& b) { return a.first < b.first; }),
               {c, next});
    }
    n = next;
    nodes[size_t(n)].subtree |= uint64_t(1) << (value % 64);
  }
  nodes[size_t(n)].value = value;
}

namespace {

constexpr int kMaxSchemaDepth = 24;
constexpr size_t kMaxProperties = 64;

const std::set<std::string> kAnnotations = {"title",    "description", "default",  "examples",   "$schema", "$id",
                                             "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
const std::set<std::string> kSupported = {"type",     "properties", "required", "additionalProperties",
                                           "items",    "minItems",   "maxItems", "enum",
                                           "const",    "anyOf",      "oneOf",    "format",
                                           "$ref",     "minLength",  "maxLength"};

class Compiler {
 public:
  Compiler(const json& root, bool strict) : root_(root), strict_(strict) {
    Grammar& g = g_;
    g.any = add(NodeKind::kAny);
    g.free_string = add(NodeKind::kString);
    g.free_key = add(NodeKind::kString);
    g.nodes[size_t(g.free_key)].key = true;
    g.number = add(NodeKind::kNumber);
    g.literal_tfn = add(NodeKind::kLiteral);
    for (const char* lit : {"true", "false", "null"}) insert_literal(g.literal_tfn, lit);
    g.any_object = add(NodeKind::kObject);
    g.nodes[size_t(g.any_object)].additional = g.any;
    g.any_array = add(NodeKind::kArray);
    g.nodes[size_t(g.any_array)].items = g.any;
  }

  std::shared_ptr<const Grammar> compile(bool any_object = false) {
    g_.root = any_object ? g_.any_object : compile(root_, "", 0);
    finish_unions();
    set_min_frames();
    if (g_.nodes[size_t(g_.root)].min_frames > kMaxDepth)
      throw SchemaError("Invalid JSON schema: every document it allows nests deeper than " + std::to_string(kMaxDepth) +
                        " objects and arrays.");
    if (!unsupported_.empty()) {
      std::string msg = "Unsupported JSON Schema keyword";
      msg += unsupported_.size() > 1 ? "s: " : ": ";
      for (size_t i = 0; i < unsupported_.size(); ++i) msg += (i ? ", " : "") + unsupported_[i];
      msg += " (strict structured output supports type, properties, required, additionalProperties, items, "
             "minItems, maxItems, enum, const, anyOf/oneOf of different types, minLength, maxLength, "
             "format date/time/date-time/uuid, $ref and $defs).";
      throw SchemaError(msg);
    }
    return std::make_shared<Grammar>(std::move(g_));
  }

 private:
  // GrammarNode::min_frames by iteration to the fixed point (recursion through $ref included): a
  // container's count is 1 + its deepest required part's (properties listed in required, items
  // when minItems > 0), a union's its shallowest alternative's. 255: no finite document.
  void set_min_frames() {
    auto& nodes = g_.nodes;
    std::vector<int> m(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      const NodeKind k = nodes[i].kind;
      m[i] = k == NodeKind::kObject || k == NodeKind::kArray || k == NodeKind::kUnion ? 255 : 1;
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < nodes.size(); ++i) {
        const GrammarNode& n = nodes[i];
        int v = m[i];
        if (n.kind == NodeKind::kObject) {
          int deepest = 0;
          for (size_t p = 0; p < n.prop_nodes.size() && p < 64; ++p)
            if (n.required >> p & 1) deepest = std::max(deepest, m[size_t(n.prop_nodes[p])]);
          v = std::min(255, 1 + deepest);
        } else if (n.kind == NodeKind::kArray) {
          v = std::min(255, 1 + (n.min_items > 0 && n.items >= 0 ? m[size_t(n.items)] : 0));
        } else if (n.kind == NodeKind::kUnion) {
          v = 255;
          for (int32_t a : n.alts) v = std::min(v, m[size_t(a)]);
        }
        if (v < m[i]) {
          m[i] = v;
          changed = true;
        }
      }
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      GrammarNode& n = nodes[i];
      n.min_frames = uint8_t(m[i]);
      if (n.kind != NodeKind::kObject) continue;
      int parts = n.additional >= 0 ? m[size_t(n.additional)] : 0;
      for (int32_t p : n.prop_nodes) parts = std::max(parts, m[size_t(p)]);
      n.max_part_frames = uint8_t(parts);
    }
  }
  static std::string where(const std::string& path) { return path.empty() ? "the schema root" : "'" + path + "'"; }
  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    throw SchemaError("Invalid JSON schema at " + where(path) + ": " + what);
  }
  // s[key], a non-negative integer (at most 65535 kept), or dflt when absent.
  static uint32_t non_negative(const json& s, const char* key, uint32_t dflt, const std::string& path) {
    auto it = s.find(key);
    if (it == s.end()) return dflt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) fail(path + "/" + key, "must be a non-negative integer");
    return uint32_t(std::min<int64_t>(it->get<int64_t>(), 65535));
  }
  // A keyword the grammar does not enforce is still refused when malformed (when not strict it is
  // ignored, not taken on trust): a pattern must be a valid regular expression (ECMAScript, as
  // JSON Schema's), lengths and bounds numbers.
  void check_ignored(const std::string& path, const std::string& k, const json& v) {
    if (k == "pattern") {
      if (!v.is_string()) fail(path + "/pattern", "must be a string");
      try {
        std::regex re(v.get<std::string>(), std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        fail(path + "/pattern", std::string("is not a valid regular expression (") + e.what() + ")");
      }
    } else if (k == "minProperties" || k == "maxProperties") {
      if (!v.is_number_unsigned()) fail(path + "/" + k, "must be a non-negative integer");
    } else if (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum" ||
               k == "multipleOf") {
      if (!v.is_number()) fail(path + "/" + k, "must be a number");
    }
  }
  void unsupported(const std::string& path, const std::string& what) {
    if (strict_) unsupported_.push_back(what + (path.empty() ? "" : " at " + path));
  }

  int32_t add(NodeKind k) {
    g_.nodes.emplace_back();
    g_.nodes.back().kind = k;
    return int32_t(g_.nodes.size()) - 1;
  }
  void insert_literal(int32_t node, const std::string& text) {
    GrammarNode& n = g_.nodes[size_t(node)];
    n.literals.insert(text, int32_t(n.literals.nodes.size()));  // any value >= 0 marks an end
  }

  int32_t compile(const json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth) fail(path, "nested deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "the schema `false` allows no value");
      return g_.any;
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k) || kSupported.count(k)) continue;
      check_ignored(path, k, v);
      unsupported(path, k);
    }
    if (auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) fail(path + "/$ref", "must be a string");
      for (const auto& [k, v] : s.items())
        if (kSupported.count(k) && k != "$ref") unsupported(path, k + " beside $ref");
      return resolve_ref(it->get<std::string>(), path, depth);
    }
    if (s.contains("enum") || s.contains("const")) return compile_literals(s, path);
    for (const char* key : {"anyOf", "oneOf"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      if (!it->is_array() || it->empty()) fail(path + "/" + key, "must be a non-empty array of schemas");
      if (s.contains("type")) unsupported(path, std::string("type beside ") + key);
      int32_t u = add(NodeKind::kUnion);
      std::vector<int32_t> alts;
      for (size_t i = 0; i < it->size(); ++i)
        alts.push_back(compile((*it)[i], path + "/" + key + "/" + std::to_string(i), depth + 1));
      g_.nodes[size_t(u)].alts = std::move(alts);
      unions_.push_back({u, path + "/" + key});
      return u;
    }
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array() && !it->empty()) {
        for (const auto& t : *it) {
          if (!t.is_string()) fail(path + "/type", "must be a type name or an array of them");
          types.push_back(t.get<std::string>());
        }
      } else {
        fail(path + "/type", "must be a type name or an array of them");
      }
      for (const auto& t : types)
        if (t != "object" && t != "array" && t != "string" && t != "number" && t != "integer" && t != "boolean" &&
            t != "null")
          fail(path + "/type", "unknown type '" + t + "'");
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types = {"array"};
    } else if (s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
      types = {"string"};
    } else {
      return g_.any;
    }
    // "integer" with "number" is "number".
    if (std::count(types.begin(), types.end(), "number") && std::count(types.begin(), types.end(), "integer"))
      types.erase(std::find(types.begin(), types.end(), "integer"));
    std::sort(types.begin(), types.end());
    types.erase(std::unique(types.begin(), types.end()), types.end());
    if (types.size() == 1) return compile_typed(s, types[0], path, depth);
    int32_t u = add(NodeKind::kUnion);
    std::vector<int32_t> alts;
    for (const auto& t : types) alts.push_back(compile_typed(s, t, path, depth));
    g_.nodes[size_t(u)].alts = std::move(alts);
    unions_.push_back({u, path + "/type"});
    return u;
  }

  int32_t compile_typed(const json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "object") return compile_object(s, path, depth);
    if (t == "array") return compile_array(s, path, depth);
    if (t == "string") {
      int32_t n = add(NodeKind::kString);
      if (auto it = s.find("format"); it != s.end()) {
        if (!it->is_string()) fail(path + "/format", "must be a string");
        std::string f = it->get<std::string>();
        StringFormat sf = StringFormat::kNone;
        if (f == "date") sf = StringFormat::kDate;
        else if (f == "time") sf = StringFormat::kTime;
        else if (f == "date-time") sf = StringFormat::kDateTime;
        else if (f == "uuid") sf = StringFormat::kUuid;
        else unsupported(path, "format '" + f + "'");
        g_.nodes[size_t(n)].format = sf;
      }
      const uint32_t lo = non_negative(s, "minLength", 0, path), hi = non_negative(s, "maxLength", UINT32_MAX, path);
      if (lo > hi) fail(path, "minLength is larger than maxLength");
      if ((lo > 0 || hi != UINT32_MAX) && g_.nodes[size_t(n)].format != StringFormat::kNone) {
        unsupported(path, "minLength or maxLength beside a format");  // the format fixes the length
      } else {
        g_.nodes[size_t(n)].min_len = lo;
        g_.nodes[size_t(n)].max_len = hi;
      }
      return n;
    }
    if (t == "number") return add(NodeKind::kNumber);
    if (t == "integer") return add(NodeKind::kInteger);
    int32_t n = add(NodeKind::kLiteral);
    if (t == "boolean") {
      insert_literal(n, "true");
      insert_literal(n, "false");
    } else {
      insert_literal(n, "null");
    }
    return n;
  }

  int32_t compile_object(const json& s, const std::string& path, int depth) {
    int32_t n = add(NodeKind::kObject);
    std::vector<std::string> names;
    std::vector<int32_t> nodes;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) fail(path + "/properties", "must be an object");
      if (it->size() > kMaxProperties)
        fail(path + "/properties", "at most " + std::to_string(kMaxProperties) + " properties per object are supported");
      for (const auto& [k, v] : it->items()) {
        names.push_back(k);
        nodes.push_back(compile(v, path + "/properties/" + k, depth + 1));
      }
    }
    int32_t additional = g_.any;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean()) additional = it->get<bool>() ? g_.any : -1;
      else if (it->is_object()) additional = compile(*it, path + "/additionalProperties", depth + 1);
      else fail(path + "/additionalProperties", "must be a boolean or a schema");
    }
    uint64_t required = 0;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) fail(path + "/required", "must be an array of property names");
      for (const auto& r : *it) {
        if (!r.is_string()) fail(path + "/required", "must be an array of property names");
        auto k = std::find(names.begin(), names.end(), r.get<std::string>());
        if (k == names.end()) {
          if (additional < 0)
            fail(path + "/required", "'" + r.get<std::string>() + "' is required but not among the properties");
          unsupported(path, "required '" + r.get<std::string>() + "' not among the properties");
          continue;
        }
        required |= uint64_t(1) << (k - names.begin());
      }
    }
    GrammarNode& o = g_.nodes[size_t(n)];
    o.prop_names = names;
    o.prop_nodes = nodes;
    o.required = required;
    o.additional = additional;
    for (size_t i = 0; i < names.size(); ++i) o.keys.insert(json(names[i]).dump(), int32_t(i));
    return n;
  }

  int32_t compile_array(const json& s, const std::string& path, int depth) {
    int32_t items = g_.any;
    if (auto it = s.find("items"); it != s.end()) {
      if (!it->is_object() && !it->is_boolean()) fail(path + "/items", "must be a schema");
      if (it->is_boolean() && !it->get<bool>()) {
        items = -1;
      } else {
        items = compile(*it, path + "/items", depth + 1);
      }
    }
    uint32_t lo = non_negative(s, "minItems", 0, path), hi = non_negative(s, "maxItems", UINT32_MAX, path);
    if (items < 0) hi = 0;
    if (lo > hi) fail(path, "minItems is larger than maxItems (or items is false)");
    int32_t n = add(NodeKind::kArray);
    g_.nodes[size_t(n)].items = items < 0 ? g_.any : items;
    g_.nodes[size_t(n)].min_items = lo;
    g_.nodes[size_t(n)].max_items = hi;
    return n;
  }

  int32_t compile_literals(const json& s, const std::string& path) {
    std::vector<json> values;
    if (auto it = s.find("const"); it != s.end()) values.push_back(*it);
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) fail(path + "/enum", "must be a non-empty array");
      if (s.contains("const")) fail(path, "has both enum and const");
      for (const auto& v : *it) values.push_back(v);
    }
    if (auto it = s.find("type"); it != s.end()) {
      // Keep the values of the given type(s).
      std::vector<std::string> types;
      if (it->is_string()) types.push_back(it->get<std::string>());
      else if (it->is_array())
        for (const auto& t : *it)
          if (t.is_string()) types.push_back(t.get<std::string>());
      auto type_of = [](const json& v) -> std::vector<std::string> {
        if (v.is_object()) return {"object"};
        if (v.is_array()) return {"array"};
        if (v.is_string()) return {"string"};
        if (v.is_boolean()) return {"boolean"};
        if (v.is_null()) return {"null"};
        if (v.is_number_integer() || (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>()))))
          return {"integer", "number"};
        return {"number"};
      };
      std::vector<json> kept;
      for (const auto& v : values) {
        bool ok = false;
        for (const auto& t : type_of(v)) ok |= std::count(types.begin(), types.end(), t) > 0;
        if (ok) kept.push_back(v);
      }
      if (kept.empty()) fail(path, "no enum/const value has the given type");
      values = std::move(kept);
    }
    int32_t n = add(NodeKind::kLiteral);
    std::set<std::string> texts;
    for (const auto& v : values) texts.insert(v.dump());
    for (const auto& t : texts) insert_literal(n, t);
    return n;
  }

  int32_t resolve_ref(const std::string& ref, const std::string& path, int depth) {
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    const json* target = nullptr;
    if (ref == "#") {
      target = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        std::string p = prefix;
        if (ref.rfind(p, 0) != 0) continue;
        std::string name = ref.substr(p.size());
        auto defs = root_.find(p.substr(2, p.size() - 3));
        if (defs != root_.end() && defs->is_object() && defs->contains(name)) target = &(*defs)[name];
      }
    }
    if (!target) fail(path + "/$ref", "cannot resolve '" + ref + "' (only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\")");
    int32_t placeholder = add(NodeKind::kAny);
    refs_[ref] = placeholder;
    int32_t real = compile(*target, ref.substr(1), depth + 1);
    GrammarNode copy = g_.nodes[size_t(real)];
    g_.nodes[size_t(placeholder)] = std::move(copy);
    for (size_t i = 0, n = unions_.size(); i < n; ++i)
      if (unions_[i].first == real) unions_.push_back({placeholder, unions_[i].second});
    return placeholder;
  }

  // First bytes a node's values can start with.
  std::bitset<256> first_bytes(int32_t node, std::set<int32_t>& seen) {
    std::bitset<256> b;
    const GrammarNode& n = g_.nodes[size_t(node)];
    auto number = [&] {
      b.set('-');
      for (int c = '0'; c <= '9'; ++c) b.set(size_t(c));
    };
    switch (n.kind) {
      case NodeKind::kObject: b.set('{'); break;
      case NodeKind::kArray: b.set('['); break;
      case NodeKind::kString: b.set('"'); break;
      case NodeKind::kNumber:
      case NodeKind::kInteger: number(); break;
      case NodeKind::kLiteral:
        for (const auto& [c, to] : n.literals.nodes[0].next) b.set(c);
        break;
      case NodeKind::kAny:
        b.set('{'), b.set('['), b.set('"'), b.set('t'), b.set('f'), b.set('n');
        number();
        break;
      case NodeKind::kUnion:
        if (!seen.insert(node).second) break;
        for (int32_t a : n.alts) b |= first_bytes(a, seen);
        break;
    }
    return b;
  }

  void finish_unions() {
    for (const auto& [u, path] : unions_) {
      GrammarNode& n = g_.nodes[size_t(u)];
      std::vector<int32_t> by(256, -1);
      bool clash = false;
      for (int32_t a : n.alts) {
        std::set<int32_t> seen{u};
        auto fb = first_bytes(a, seen);
        for (int c = 0; c < 256; ++c)
          if (fb[size_t(c)]) {
            if (by[size_t(c)] >= 0 && by[size_t(c)] != a) clash = true;
            by[size_t(c)] = a;
          }
      }
      if (clash) {
        unsupported(path, "alternatives that can start with the same character (e.g. two objects)");
        n.kind = NodeKind::kAny;  // not strict: any value
        n.alts.clear();
        continue;
      }
      n.alt_by_byte = std::move(by);
    }
  }

  const json& root_;
  bool strict_;
  Grammar g_;
  std::map<std::string, int32_t> refs_;
  std::vector<std::pair<int32_t, std::string>> unions_;
  std::vector<std::string> unsupported_;
};

}  // namespace

std::shared_ptr<const Grammar> compile_json_schema(const json& schema, bool strict) {
  return Compiler(schema, strict).compile();
}

std::shared_ptr<const Grammar> any_json_object_grammar() {
  static const json empty = json::object();
  return Compiler(empty, false).compile(true);
}

}  // namespace gptoss::structured
