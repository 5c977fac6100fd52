#pragma once
// Chat completions <-> the harmony format: OpenAI messages and tools to a harmony conversation
// (and its prompt tokens), and sampled tokens back to content, reasoning and tool calls.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_api.h"
#include "tokenizer/harmony.h"
#include "tokenizer/tokenizer.h"

namespace gptoss::server {

// The harmony conversation for a chat request: a system message (reasoning effort), a developer
// message with the request's system/developer text as instructions and its function tools, then
// the user/assistant/tool turns (earlier reasoning as analysis, tool calls as commentary to
// functions.NAME, tool results from functions.NAME).
harmony::Conversation build_conversation(const ChatRequest& r);
// Prompt tokens: the conversation plus "<|start|>assistant".
std::vector<TokenId> render_chat_prompt(const harmony::Renderer& renderer, const ChatRequest& r);

// One streamed change of the assistant message.
struct ChatDelta {
  std::string content;
  std::string reasoning;
  struct ToolCallDelta {
    int index = 0;
    std::string id;         // set on the first delta of a call
    std::string name;       // set on the first delta of a call
    std::string arguments;  // appended text
  };
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(const ChatDelta& d);
};

// Maps sampled tokens (after the prompt's "<|start|>assistant") to content / reasoning /
// tool calls through the harmony streaming parser. Messages on the analysis channel are
// reasoning; messages to a recipient ("to=functions.NAME") are tool calls whose arguments are
// the message text; everything else (final, commentary without recipient) is content. Output
// the parser rejects (a random model's) falls back to plain decoded text as content.
class ChatOutputMapper {
 public:
  // A header (between <|start|> and <|message|>) longer than this, or one that cannot become a
  // header gpt-oss writes (plausible_header), is not harmony: the mapper falls back to plain
  // text, so a model that never formats its output still streams, from its first tokens.
  static constexpr size_t kMaxHeaderTokens = 48;
  static bool plausible_header(std::string_view header_text, bool role_known);

  // plain_text: the output is known not to be harmony (structured output of a model that does
  // not write harmony): every ordinary token is content from the first one.
  explicit ChatOutputMapper(const Tokenizer& tok, bool plain_text = false);
  ChatDelta push(TokenId t);
  ChatDelta finish();

  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::vector<ToolCall>& tool_calls() const { return calls_; }
  bool has_tool_calls() const { return !calls_.empty(); }

 private:
  enum class Kind { None, Content, Reasoning, Tool };
  void on_events(const std::vector<harmony::ParserEvent>& evs, ChatDelta& d);
  void start_message(const harmony::ParsedHeader& h, ChatDelta& d);
  void add_text(const std::string& text, ChatDelta& d);
  void raw_text(TokenId t, ChatDelta& d);
  bool plausible_header_tokens() const;

  Tokenizer tok_;
  std::optional<harmony::StreamParser> parser_;
  std::optional<StreamingDecoder> raw_;  // fallback after a parse error
  std::vector<TokenId> tokens_;
  std::vector<TokenId> header_tokens_;  // tokens since the last message boundary, outside content
  Kind kind_ = Kind::None;
  std::string msg_streamed_;  // text of the current message already emitted
  std::string content_, reasoning_;
  std::vector<ToolCall> calls_;
  bool any_output_ = false;
  bool any_message_ = false;  // a header was parsed: the output is harmony, even if every message is empty
};

// Stop strings on a stream of text (chat content): feed() returns what is safe to show, holding
// back a tail that may begin a stop string; once one completes, matched() and the text from it
// on is dropped.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::string feed(const std::string& text);
  std::string flush();  // end of stream: the held-back tail (nothing once matched)
  bool matched() const { return matched_; }
  const std::string& matched_stop() const { return which_; }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
  std::string which_;
};

}  // namespace gptoss::server
