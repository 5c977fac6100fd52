#pragma once
// The harmony chat format of gpt-oss (openai/harmony docs/format.md): a renderer from a
// conversation to the prompt tokens, byte-exact with the reference, and a streaming parser of
// sampled tokens back into messages.
//
// Rendering is a sequence of pieces, each either a formatting (special) token such as
// "<|start|>" or ordinary text; ordinary text is encoded WITHOUT special-token recognition
// (so a user typing "<|end|>" cannot forge a token). render_text_* writes the same pieces as
// text, special tokens spelled out, as in the reference's golden files.
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace gptoss::harmony {

enum class Role { User, Assistant, System, Developer, Tool };
std::string_view role_name(Role r);  // "user", "assistant", ...
std::optional<Role> parse_role(std::string_view s);

enum class ReasoningEffort { Low, Medium, High };
std::string_view effort_name(ReasoningEffort e);  // "low", "medium", "high"

struct ToolDescription {
  std::string name;
  std::string description;
  // JSON schema of the parameters (rendered as a TypeScript-like type). ordered_json keeps the
  // property order of the request, which the rendering follows (parse requests with
  // nlohmann::ordered_json to keep it).
  std::optional<nlohmann::ordered_json> parameters;
};

struct ToolNamespace {
  std::string name;
  std::optional<std::string> description;
  std::vector<ToolDescription> tools;
  static ToolNamespace browser();  // the reference's built-in browser tool
  static ToolNamespace python();   // the reference's built-in python tool
};

struct ChannelConfig {
  std::vector<std::string> valid_channels;
  bool channel_required = false;
};

// System message content. Defaults are the reference's defaults.
struct SystemContent {
  std::optional<std::string> model_identity =
      "You are ChatGPT, a large language model trained by OpenAI.";
  std::optional<ReasoningEffort> reasoning_effort = ReasoningEffort::Medium;
  std::map<std::string, ToolNamespace> tools;  // built-in tools by namespace name (sorted)
  std::optional<std::string> conversation_start_date;  // "Current date: ..."
  std::optional<std::string> knowledge_cutoff = "2024-06";
  std::optional<ChannelConfig> channel_config =
      ChannelConfig{{"analysis", "commentary", "final"}, true};

  SystemContent& with_tools(ToolNamespace ns);
};

// Developer message content: "# Instructions" and function tools (namespace "functions").
struct DeveloperContent {
  std::optional<std::string> instructions;
  // Body of the "# Response Formats" section (structured output): "## NAME\n\n// DESCRIPTION\nSCHEMA".
  std::optional<std::string> response_formats;
  std::map<std::string, ToolNamespace> tools;

  DeveloperContent& with_tools(ToolNamespace ns);
  DeveloperContent& with_function_tools(std::vector<ToolDescription> tools);
};

using Content = std::variant<std::string, SystemContent, DeveloperContent>;

struct Message {
  Role role = Role::User;
  // Author name: for Role::Tool the tool's name (e.g. "functions.get_weather"), which is what is
  // rendered; for other roles rendered as "role:name" when set.
  std::optional<std::string> name;
  std::optional<std::string> recipient;     // " to=RECIPIENT" ("all" is not rendered)
  std::optional<std::string> channel;       // "analysis", "commentary", "final"
  std::optional<std::string> content_type;  // e.g. "<|constrain|>json" or "json"
  std::vector<Content> content;

  static Message text(Role role, std::string text);
  static Message system(SystemContent c);
  static Message developer(DeveloperContent c);
  // A tool's result: author = tool name, recipient "assistant", channel "commentary".
  static Message tool_result(std::string tool_name, std::string text);
  Message& with_channel(std::string c);
  Message& with_recipient(std::string r);
  Message& with_content_type(std::string t);
  // Concatenated text of the string contents.
  std::string text_content() const;
  bool operator==(const Message& o) const;
};

struct Conversation {
  std::vector<Message> messages;
};

struct RenderOptions {
  // Drop analysis messages before the first "final" when the last assistant message is final
  // (the reference's default: the chain of thought of finished turns is not shown again).
  bool auto_drop_analysis = true;
};

// Text renderings (special tokens spelled out), as the reference's golden files.
std::string render_text(const Message& m, bool conversation_has_function_tools = false);
std::string render_text_conversation(const Conversation& c, const RenderOptions& o = {});
std::string render_text_for_completion(const Conversation& c, Role next = Role::Assistant,
                                       const RenderOptions& o = {});

// Token renderings. Looks every formatting token up by name in the tokenizer.
class Renderer {
 public:
  explicit Renderer(const Tokenizer& tok);
  std::vector<TokenId> render(const Message& m, bool conversation_has_function_tools = false) const;
  std::vector<TokenId> render_conversation(const Conversation& c, const RenderOptions& o = {}) const;
  // The prompt for sampling the next message: conversation + "<|start|>" + role name.
  std::vector<TokenId> render_for_completion(const Conversation& c, Role next = Role::Assistant,
                                             const RenderOptions& o = {}) const;
  // As render_conversation, but a last assistant "final" message ends in <|return|>.
  std::vector<TokenId> render_for_training(const Conversation& c, const RenderOptions& o = {}) const;
  // Tokens that end sampling: <|return|>, <|call|>, <|end|>.
  std::vector<TokenId> stop_tokens() const;
  // Tokens that end an assistant turn: <|return|>, <|call|>.
  std::vector<TokenId> stop_tokens_for_assistant_actions() const;
  const Tokenizer& tokenizer() const { return tok_; }

 private:
  Tokenizer tok_;
};

struct ParsedHeader {
  Role role = Role::Assistant;
  std::optional<std::string> name;  // author name (tool messages)
  std::optional<std::string> recipient;
  std::optional<std::string> channel;
  std::optional<std::string> content_type;
};

struct ParseOptions {
  // Strict (reference default): a stop token inside a header is an error. Non-strict: the header
  // text seen so far becomes a message (role from the parser's initial role).
  bool strict = true;
};

struct ParserEvent {
  enum class Kind { MessageStart, ContentDelta, MessageEnd };
  Kind kind;
  ParsedHeader header;  // MessageStart and MessageEnd
  std::string text;     // ContentDelta: new UTF-8 text; MessageEnd: the whole content
  std::optional<TokenId> end_token;  // MessageEnd: <|end|>/<|call|>/<|return|>; nullopt at EOS
};

// Parses sampled tokens into messages, one token at a time. `role` is the role of the first
// message when the prompt ended in "<|start|>ROLE" (nullopt: the tokens begin with <|start|>).
// Malformed input throws gptoss::Error; the partial message is then dropped and the parser
// waits for the next <|start|> (messages() keeps the messages completed before). It never
// crashes and never emits broken UTF-8.
class StreamParser {
 public:
  StreamParser(const Tokenizer& tok, std::optional<Role> role = Role::Assistant,
               ParseOptions opts = {});
  // Feeds one token; returns the events it produced (possibly none).
  std::vector<ParserEvent> push(TokenId token);
  // End of stream: completes a message in progress (flushing held-back bytes as U+FFFD).
  std::vector<ParserEvent> finish();

  const std::vector<Message>& messages() const { return messages_; }
  const std::vector<TokenId>& tokens() const { return tokens_; }
  // State of the message in progress.
  bool in_content() const { return state_ == State::Content; }
  std::optional<Role> current_role() const;
  std::optional<std::string> current_channel() const;
  std::optional<std::string> current_recipient() const;
  std::optional<std::string> current_content_type() const;
  const std::string& current_content() const { return content_; }
  // Text added by the last push() (nullopt when it added none).
  const std::optional<std::string>& last_content_delta() const { return last_delta_; }

 private:
  enum class State { ExpectStart, Header, Content };
  std::vector<ParserEvent> push_impl(TokenId token);
  ParsedHeader parse_header(const std::string& text, std::optional<Role> role, bool parse_meta,
                            std::string* remaining) const;
  void end_message(std::optional<TokenId> end, std::vector<ParserEvent>& ev);

  Tokenizer tok_;
  ParseOptions opts_;
  TokenId start_, message_, channel_, constrain_;
  std::vector<TokenId> stops_;
  State state_ = State::ExpectStart;
  std::optional<Role> next_role_;
  std::vector<TokenId> header_tokens_;
  ParsedHeader header_;
  std::string content_;
  std::string pending_bytes_;
  std::optional<std::string> last_delta_;
  std::vector<Message> messages_;
  std::vector<TokenId> tokens_;
};

// Convenience: parse a complete completion (all tokens, then EOS).
std::vector<Message> parse_completion(const Tokenizer& tok, std::span<const TokenId> tokens,
                                      std::optional<Role> role = Role::Assistant,
                                      ParseOptions opts = {});

}  // namespace gptoss::harmony
