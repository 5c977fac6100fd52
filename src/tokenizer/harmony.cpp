// Harmony rendering (the streaming parser is harmony_parser.cpp); behaviour follows openai/harmony
// (v0.0.8) src/encoding.rs, which the golden files in tests/data/harmony come from.
#include "tokenizer/harmony.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "tokenizer/harmony_internal.h"
#include "tokenizer/tokenizer_impl.h"

namespace gptoss::harmony {

using namespace internal;

namespace {

// A rendering: formatting tokens and text pieces, each text piece encoded on its own.
struct Piece {
  bool special;
  std::string s;
};
using Pieces = std::vector<Piece>;

void text(Pieces& p, std::string s) { p.push_back({false, std::move(s)}); }
void tok(Pieces& p, const char* name) { p.push_back({true, name}); }

// Rust's str::lines(): split on '\n', drop a trailing '\r' of each line and a final empty line.
std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t e = s.find('\n', pos);
    std::string line = s.substr(pos, e == std::string::npos ? std::string::npos : e - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(std::move(line));
    if (e == std::string::npos) break;
    pos = e + 1;
  }
  return out;
}

using Json = nlohmann::ordered_json;

// serde_json's Display of a value (compact JSON).
std::string json_display(const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool is_enum(const Json& s) {
  return s.is_object() && s.contains("enum") && s["enum"].is_array() && !s["enum"].empty();
}

const std::string* get_str(const Json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  if (it == o.end() || !it->is_string()) return nullptr;
  return it->get_ptr<const std::string*>();
}

const Json* get(const Json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

bool nullable(const Json& o) {
  const Json* n = get(o, "nullable");
  return n && n->is_boolean() && n->get<bool>();
}

std::string default_comment(const Json& holder, const Json& dflt) {
  if (dflt.is_string() && !is_enum(holder)) return "default: \"" + dflt.get<std::string>() + "\"";
  if (dflt.is_string()) return "default: " + dflt.get<std::string>();
  return "default: " + json_display(dflt);
}

// JSON schema -> TypeScript-like type, as the reference renders tool parameters.
std::string schema_to_ts(const Json& schema, const std::string& indent) {
  if (const Json* one_of = get(schema, "oneOf"); one_of && one_of->is_array()) {
    std::string out;
    bool first = true;
    for (const Json& variant : *one_of) {
      if (!first) {
        out += "\n" + indent + " | ";
      } else {
        out += "\n" + indent + " | ";
        first = false;
      }
      std::string ts = schema_to_ts(variant, indent + "   ");
      if (nullable(variant) && ts.find("null") == std::string::npos) ts += " | null";
      out += ts;
      std::vector<std::string> trailing;
      if (const std::string* d = get_str(variant, "description")) trailing.push_back(*d);
      if (const Json* d = get(variant, "default")) trailing.push_back(default_comment(variant, *d));
      if (!trailing.empty()) out += " // " + join(trailing, " ");
    }
    return out;
  }
  if (const Json* types = get(schema, "type"); types && types->is_array()) {
    std::vector<std::string> ts;
    for (const Json& t : *types)
      if (t.is_string()) ts.push_back(t.get<std::string>() == "integer" ? "number" : t.get<std::string>());
    if (!ts.empty()) return join(ts, " | ");
  }
  const std::string* ty = get_str(schema, "type");
  if (!ty) return "any";
  if (*ty == "object") {
    std::string out;
    if (const std::string* d = get_str(schema, "description")) out += indent + "// " + *d + "\n";
    out += "{\n";
    const Json* props = get(schema, "properties");
    if (props && props->is_object()) {
      std::vector<std::string> required;
      if (const Json* r = get(schema, "required"); r && r->is_array())
        for (const Json& x : *r)
          if (x.is_string()) required.push_back(x.get<std::string>());
      auto is_req = [&](const std::string& k) {
        return std::find(required.begin(), required.end(), k) != required.end();
      };
      for (auto it = props->begin(); it != props->end(); ++it) {
        const std::string& key = it.key();
        const Json& val = it.value();
        if (const std::string* t = get_str(val, "title")) out += indent + "// " + *t + "\n" + indent + "//\n";
        if (!get(val, "oneOf"))
          if (const std::string* d = get_str(val, "description")) out += indent + "// " + *d + "\n";
        if (const Json* ex = get(val, "examples"); ex && ex->is_array() && !ex->empty()) {
          out += indent + "// Examples:\n";
          for (const Json& e : *ex)
            if (e.is_string()) out += indent + "// - \"" + e.get<std::string>() + "\"\n";
        }
        if (const Json* one_of = get(val, "oneOf"); one_of && one_of->is_array()) {
          const std::string* prop_desc = get_str(val, "description");
          bool skip_prop_desc = false;
          if (prop_desc && !one_of->empty())
            if (const std::string* vd = get_str((*one_of)[0], "description"); vd && *vd == *prop_desc)
              skip_prop_desc = true;
          bool desc_above = false;
          if (!skip_prop_desc && prop_desc) {
            out += indent + "// " + *prop_desc + "\n";
            desc_above = true;
          }
          if (const Json* d = get(val, "default")) out += indent + "// " + default_comment(val, *d) + "\n";
          out += indent + key + (is_req(key) ? "" : "?") + ":\n";
          size_t i = 0;
          for (const Json& variant : *one_of) {
            out += indent + " | ";
            std::string ts = schema_to_ts(variant, indent + "   ");
            if (nullable(variant) && ts.find("null") == std::string::npos) ts += " | null";
            out += ts;
            std::vector<std::string> trailing;
            if (i == 0 && desc_above) {
            } else if (const std::string* vd = get_str(variant, "description")) {
              if (!prop_desc || *vd != *prop_desc) trailing.push_back(*vd);
            }
            if (const Json* d = get(variant, "default")) trailing.push_back(default_comment(variant, *d));
            if (!trailing.empty()) out += " // " + join(trailing, " ");
            out += "\n";
            ++i;
          }
          out += indent + ",\n";
          continue;
        }
        out += indent + key + (is_req(key) ? "" : "?") + ": ";
        std::string ts = schema_to_ts(val, indent + "    ");
        if (nullable(val) && ts.find("null") == std::string::npos) ts += " | null";
        out += ts + ",";
        if (const Json* d = get(val, "default")) out += " // " + default_comment(val, *d);
        out += "\n";
      }
    }
    out += indent + "}";
    return out;
  }
  if (*ty == "string") {
    if (const Json* e = get(schema, "enum"); e && e->is_array()) {
      std::vector<std::string> vals;
      for (const Json& v : *e)
        if (v.is_string()) vals.push_back("\"" + v.get<std::string>() + "\"");
      if (!vals.empty()) return join(vals, " | ");
    }
    return "string";
  }
  if (*ty == "number" || *ty == "integer") return "number";
  if (*ty == "boolean") return "boolean";
  if (*ty == "array") {
    if (const Json* items = get(schema, "items")) return schema_to_ts(*items, indent) + "[]";
    return "Array<any>";
  }
  return "any";
}

std::string tools_section(const std::map<std::string, ToolNamespace>& tools) {
  std::vector<std::string> sections{"# Tools"};
  for (const auto& [key, ns] : tools) {
    std::vector<std::string> c{"## " + ns.name + "\n"};
    if (ns.description)
      for (const std::string& line : lines(*ns.description))
        c.push_back(ns.tools.empty() ? line : "// " + line);
    if (!ns.tools.empty()) {
      c.push_back("namespace " + ns.name + " {\n");
      for (const ToolDescription& t : ns.tools) {
        for (const std::string& line : lines(t.description)) c.push_back("// " + line);
        if (t.parameters)
          c.push_back("type " + t.name + " = (_: " + schema_to_ts(*t.parameters, "") + ") => any;\n");
        else
          c.push_back("type " + t.name + " = () => any;\n");
      }
      c.push_back("} // namespace " + ns.name);
    }
    sections.push_back(join(c, "\n"));
  }
  return join(sections, "\n\n");
}

std::string system_text(const SystemContent& sys, bool has_function_tools) {
  std::vector<std::string> sections, top;
  if (sys.model_identity) top.push_back(*sys.model_identity);
  if (sys.knowledge_cutoff) top.push_back("Knowledge cutoff: " + *sys.knowledge_cutoff);
  if (sys.conversation_start_date) top.push_back("Current date: " + *sys.conversation_start_date);
  if (!top.empty()) sections.push_back(join(top, "\n"));
  if (sys.reasoning_effort)
    sections.push_back("Reasoning: " + std::string(effort_name(*sys.reasoning_effort)));
  if (!sys.tools.empty()) sections.push_back(tools_section(sys.tools));
  if (sys.channel_config && !sys.channel_config->valid_channels.empty()) {
    std::string h = "# Valid channels: " + join(sys.channel_config->valid_channels, ", ") + ".";
    if (sys.channel_config->channel_required) h += " Channel must be included for every message.";
    if (has_function_tools)
      h += "\nCalls to these tools must go to the commentary channel: 'functions'.";
    sections.push_back(h);
  }
  return join(sections, "\n\n");
}

std::string developer_text(const DeveloperContent& dev) {
  std::vector<std::string> sections;
  if (dev.instructions) {
    sections.push_back("# Instructions");
    sections.push_back(*dev.instructions);
  }
  if (dev.response_formats) {
    sections.push_back("# Response Formats");
    sections.push_back(*dev.response_formats);
  }
  if (!dev.tools.empty()) sections.push_back(tools_section(dev.tools));
  return join(sections, "\n\n");
}

void render_message(const Message& m, bool has_function_tools, Pieces& p) {
  tok(p, kStart);
  if (m.role == Role::Tool) {
    if (!m.name) throw Error("harmony: a tool message needs the tool's name as its author name");
    text(p, *m.name);
  } else {
    text(p, std::string(role_name(m.role)));
    if (m.name) text(p, ":" + *m.name);
  }
  if (m.recipient && *m.recipient != "all") text(p, " to=" + *m.recipient);
  if (m.channel) {
    tok(p, kChannel);
    text(p, *m.channel);
  }
  if (m.content_type) {
    const std::string& ct = *m.content_type;
    if (ct.rfind(kConstrain, 0) == 0) {
      text(p, " ");
      tok(p, kConstrain);
      if (ct.size() > std::strlen(kConstrain)) text(p, ct.substr(std::strlen(kConstrain)));
    } else {
      text(p, " " + ct);
    }
  }
  tok(p, kMessage);
  for (const Content& c : m.content) {
    if (auto* s = std::get_if<std::string>(&c)) {
      text(p, *s);
    } else if (auto* sys = std::get_if<SystemContent>(&c)) {
      if (m.role != Role::System) throw Error("harmony: system content may only appear in a system message");
      text(p, system_text(*sys, has_function_tools));
    } else if (auto* dev = std::get_if<DeveloperContent>(&c)) {
      if (m.role != Role::Developer)
        throw Error("harmony: developer content may only appear in a developer message");
      text(p, developer_text(*dev));
    }
  }
  tok(p, m.role == Role::Assistant && m.recipient ? kCall : kEnd);
}

bool has_function_tools(const Conversation& c) {
  for (const Message& m : c.messages)
    for (const Content& x : m.content)
      if (auto* dev = std::get_if<DeveloperContent>(&x)) {
        auto it = dev->tools.find("functions");
        if (it != dev->tools.end() && !it->second.tools.empty()) return true;
      }
  return false;
}

void render_conversation(const Conversation& c, const RenderOptions& o, Pieces& p) {
  bool fn_tools = has_function_tools(c);
  bool last_assistant_is_final = false;
  for (auto it = c.messages.rbegin(); it != c.messages.rend(); ++it)
    if (it->role == Role::Assistant) {
      last_assistant_is_final = it->channel && *it->channel == "final";
      break;
    }
  bool drop = o.auto_drop_analysis && last_assistant_is_final;
  size_t first_final = c.messages.size();
  for (size_t i = 0; i < c.messages.size(); ++i)
    if (c.messages[i].channel && *c.messages[i].channel == "final") {
      first_final = i;
      break;
    }
  for (size_t i = 0; i < c.messages.size(); ++i) {
    const Message& m = c.messages[i];
    if (drop && i < first_final && m.channel && *m.channel == "analysis") continue;
    render_message(m, fn_tools, p);
  }
}

std::string pieces_text(const Pieces& p) {
  std::string s;
  for (const Piece& x : p) s += x.s;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string_view role_name(Role r) {
  switch (r) {
    case Role::User: return "user";
    case Role::Assistant: return "assistant";
    case Role::System: return "system";
    case Role::Developer: return "developer";
    case Role::Tool: return "tool";
  }
  return "user";
}

std::optional<Role> parse_role(std::string_view s) {
  if (s == "user") return Role::User;
  if (s == "assistant") return Role::Assistant;
  if (s == "system") return Role::System;
  if (s == "developer") return Role::Developer;
  if (s == "tool") return Role::Tool;
  return std::nullopt;
}

std::string_view effort_name(ReasoningEffort e) {
  switch (e) {
    case ReasoningEffort::Low: return "low";
    case ReasoningEffort::Medium: return "medium";
    case ReasoningEffort::High: return "high";
  }
  return "medium";
}

ToolNamespace ToolNamespace::browser() {
  ToolNamespace ns;
  ns.name = "browser";
  ns.description =
      "Tool for browsing.\nThe `cursor` appears in brackets before each browsing display: "
      "`[{cursor}]`.\nCite information from the tool using the following format:\n"
      "`\u3010{cursor}\u2020L{line_start}(-L{line_end})?\u3011`, for example: "
      "`\u30106\u2020L9-L11\u3011` or `\u30108\u2020L3\u3011`.\nDo not quote more than 10 words "
      "directly from the tool output.\nsources=web (default: web)";
  ns.tools.push_back(
      {"search", "Searches for information related to `query` and displays `topn` results.",
       Json::parse(R"({"type": "object", "properties": {"query": {"type": "string"},
          "topn": {"type": "number", "default": 10}, "source": {"type": "string"}},
          "required": ["query"]})")});
  ns.tools.push_back(
      {"open",
       "Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, "
       "showing `num_lines` lines.\nValid link ids are displayed with the formatting: "
       "`\u3010{id}\u2020.*\u3011`.\nIf `cursor` is not provided, the most recent page is "
       "implied.\nIf `id` is a string, it is treated as a fully qualified URL associated with "
       "`source`.\nIf `loc` is not provided, the viewport will be positioned at the beginning of "
       "the document or centered on the most relevant passage, if available.\nUse this function "
       "without `id` to scroll to a new location of an opened page.",
       Json::parse(R"({"type": "object", "properties": {
          "id": {"type": ["number", "string"], "default": -1},
          "cursor": {"type": "number", "default": -1}, "loc": {"type": "number", "default": -1},
          "num_lines": {"type": "number", "default": -1},
          "view_source": {"type": "boolean", "default": false},
          "source": {"type": "string"}}})")});
  ns.tools.push_back(
      {"find",
       "Finds exact matches of `pattern` in the current page, or the page given by `cursor`.",
       Json::parse(R"({"type": "object", "properties": {"pattern": {"type": "string"},
          "cursor": {"type": "number", "default": -1}}, "required": ["pattern"]})")});
  return ns;
}

ToolNamespace ToolNamespace::python() {
  ToolNamespace ns;
  ns.name = "python";
  ns.description =
      "Use this tool to execute Python code in your chain of thought. The code will not be shown "
      "to the user. This tool should be used for internal reasoning, but not for code that is "
      "intended to be visible to the user (e.g. when creating plots, tables, or files).\n\nWhen "
      "you send a message containing Python code to python, it will be executed in a stateful "
      "Jupyter notebook environment. python will respond with the output of the execution or time "
      "out after 120.0 seconds. The drive at '/mnt/data' can be used to save and persist user "
      "files. Internet access for this session is UNKNOWN. Depends on the cluster.";
  return ns;
}

SystemContent& SystemContent::with_tools(ToolNamespace ns) {
  std::string key = ns.name;
  tools[key] = std::move(ns);
  return *this;
}

DeveloperContent& DeveloperContent::with_tools(ToolNamespace ns) {
  std::string key = ns.name;
  tools[key] = std::move(ns);
  return *this;
}

DeveloperContent& DeveloperContent::with_function_tools(std::vector<ToolDescription> t) {
  return with_tools(ToolNamespace{"functions", std::nullopt, std::move(t)});
}

Message Message::text(Role role, std::string t) {
  Message m;
  m.role = role;
  m.content.emplace_back(std::move(t));
  return m;
}

Message Message::system(SystemContent c) {
  Message m;
  m.role = Role::System;
  m.content.emplace_back(std::move(c));
  return m;
}

Message Message::developer(DeveloperContent c) {
  Message m;
  m.role = Role::Developer;
  m.content.emplace_back(std::move(c));
  return m;
}

Message Message::tool_result(std::string tool_name, std::string t) {
  Message m = text(Role::Tool, std::move(t));
  m.name = std::move(tool_name);
  m.recipient = "assistant";
  m.channel = "commentary";
  return m;
}

Message& Message::with_channel(std::string c) {
  channel = std::move(c);
  return *this;
}
Message& Message::with_recipient(std::string r) {
  recipient = std::move(r);
  return *this;
}
Message& Message::with_content_type(std::string t) {
  content_type = std::move(t);
  return *this;
}

std::string Message::text_content() const {
  std::string s;
  for (const Content& c : content)
    if (auto* t = std::get_if<std::string>(&c)) s += *t;
  return s;
}

bool Message::operator==(const Message& o) const {
  if (role != o.role || name != o.name || recipient != o.recipient || channel != o.channel ||
      content_type != o.content_type || content.size() != o.content.size())
    return false;
  for (size_t i = 0; i < content.size(); ++i) {
    if (content[i].index() != o.content[i].index()) return false;
    if (auto* s = std::get_if<std::string>(&content[i])) {
      if (*s != std::get<std::string>(o.content[i])) return false;
    } else {
      // Structured contents compare by their rendering.
      Pieces a, b;
      Message x, y;
      x.role = y.role = role;
      x.content = {content[i]};
      y.content = {o.content[i]};
      render_message(x, false, a);
      render_message(y, false, b);
      if (pieces_text(a) != pieces_text(b)) return false;
    }
  }
  return true;
}

std::string render_text(const Message& m, bool fn_tools) {
  Pieces p;
  render_message(m, fn_tools, p);
  return pieces_text(p);
}

std::string render_text_conversation(const Conversation& c, const RenderOptions& o) {
  Pieces p;
  render_conversation(c, o, p);
  return pieces_text(p);
}

std::string render_text_for_completion(const Conversation& c, Role next, const RenderOptions& o) {
  Pieces p;
  render_conversation(c, o, p);
  tok(p, kStart);
  text(p, std::string(role_name(next)));
  return pieces_text(p);
}

// ---------------------------------------------------------------------------------------------
// Renderer.

namespace {
std::vector<TokenId> encode_pieces(const Tokenizer& t, const Pieces& p) {
  std::vector<TokenId> out;
  for (const Piece& x : p) {
    if (x.special) {
      out.push_back(t.require_token_id(x.s));
    } else {
      auto ids = t.encode(x.s, false);
      out.insert(out.end(), ids.begin(), ids.end());
    }
  }
  return out;
}
}  // namespace

Renderer::Renderer(const Tokenizer& t) : tok_(t) {
  for (const char* n : {kStart, kMessage, kEnd, kReturn, kCall, kChannel, kConstrain})
    if (!tok_.token_id(n) || !tok_.is_special(*tok_.token_id(n)))
      throw Error(std::string("harmony: the tokenizer has no special token ") + n);
}

std::vector<TokenId> Renderer::render(const Message& m, bool fn_tools) const {
  Pieces p;
  render_message(m, fn_tools, p);
  return encode_pieces(tok_, p);
}

std::vector<TokenId> Renderer::render_conversation(const Conversation& c, const RenderOptions& o) const {
  Pieces p;
  harmony::render_conversation(c, o, p);
  return encode_pieces(tok_, p);
}

std::vector<TokenId> Renderer::render_for_completion(const Conversation& c, Role next,
                                                     const RenderOptions& o) const {
  Pieces p;
  harmony::render_conversation(c, o, p);
  tok(p, kStart);
  text(p, std::string(role_name(next)));
  return encode_pieces(tok_, p);
}

std::vector<TokenId> Renderer::render_for_training(const Conversation& c, const RenderOptions& o) const {
  auto out = render_conversation(c, o);
  if (!c.messages.empty() && !out.empty()) {
    const Message& last = c.messages.back();
    if (last.role == Role::Assistant && last.channel && *last.channel == "final")
      out.back() = tok_.require_token_id(kReturn);
  }
  return out;
}

std::vector<TokenId> Renderer::stop_tokens() const {
  return {tok_.require_token_id(kReturn), tok_.require_token_id(kCall), tok_.require_token_id(kEnd)};
}

std::vector<TokenId> Renderer::stop_tokens_for_assistant_actions() const {
  return {tok_.require_token_id(kReturn), tok_.require_token_id(kCall)};
}

}  // namespace gptoss::harmony
