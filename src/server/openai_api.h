#pragma once
// OpenAI API request types, their validation, and the error object. Pure functions: parsing a
// request body never touches the engine, so every bad input is answered before it costs anything.
#include <nlohmann/json.hpp>

#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "engine/sampling.h"

namespace gptoss::server {

using ojson = nlohmann::ordered_json;

// An error answered to the client as {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};
nlohmann::json error_body(const ApiError& e);
[[noreturn]] void bad_request(const std::string& msg, const std::string& param = "", const std::string& code = "");

// Every top-level field a route knows, and what it does with it. A field not in its route's
// table is refused (400, code unsupported_value, param naming it), so a field is always either
// honoured or refused, never silently ignored; a parser that forgets to read a field its table
// marks kHonoured refuses it the same way.
enum class FieldUse {
  kHonoured,  // read and acted on by the parser
  kHarmless,  // known and accepted with no effect on the output (e.g. `user`); `note` says why
  kRefused,   // known but not supported: 400 with `note` as the message
};
struct RequestField {
  const char* name;
  FieldUse use;
  const char* note = "";
};
std::span<const RequestField> chat_fields();        // /v1/chat/completions
std::span<const RequestField> completion_fields();  // /v1/completions
std::span<const RequestField> tokenize_fields();    // /tokenize
std::span<const RequestField> detokenize_fields();  // /detokenize
std::span<const RequestField> responses_fields();   // /v1/responses

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

struct ChatMessage {
  std::string role;  // system, developer, user, assistant, tool
  std::optional<std::string> content;
  std::optional<std::string> reasoning;  // assistant: reasoning_content / reasoning (earlier chain of thought)
  std::vector<ToolCall> tool_calls;      // assistant
  std::string tool_call_id;              // tool
  std::string name;                      // optional author name (tool: the function name)
};

struct FunctionTool {
  std::string name;
  std::string description;
  std::optional<ojson> parameters;  // JSON schema (property order kept)
  bool strict = false;              // function.strict: unsupported schema keywords are refused
};

// response_format of a chat or text completion request: "text", "json_object" or "json_schema"
// (name, schema, strict, description).
struct ResponseFormat {
  std::string type = "text";
  std::string name;
  std::string description;
  std::optional<ojson> schema;  // json_schema: absent means any JSON object
  bool strict = false;
};

// Parameters shared by chat and text completions.
struct CommonRequest {
  std::string model;
  std::optional<int> max_tokens;  // max_tokens / max_completion_tokens
  SamplingParams sampling;         // max_tokens filled in later from the prompt length
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats (vLLM)
  bool logprobs = false;
  int top_logprobs = 0;
  ResponseFormat response_format;
};

// tool_choice: a mode, and for a forced call the function (kept apart: a function may be named
// "auto" or "none").
struct ToolChoice {
  std::string mode = "auto";  // none, auto, required, function
  std::string function;       // mode function: the function the model must call
  bool must_call() const { return mode == "required" || mode == "function"; }
  bool may_call(const std::string& name) const {
    return mode == "auto" || mode == "required" || (mode == "function" && name == function);
  }
};

struct ChatRequest : CommonRequest {
  std::vector<ChatMessage> messages;
  std::vector<FunctionTool> tools;
  ToolChoice tool_choice;
  std::optional<std::string> reasoning_effort;  // low, medium, high (reasoning_effort or reasoning.effort)
};

struct CompletionRequest : CommonRequest {
  std::variant<std::string, std::vector<int32_t>> prompt;
  bool echo = false;
};

// /tokenize: a text prompt, or chat messages rendered as a chat request would be (vLLM's
// TokenizeCompletionRequest / TokenizeChatRequest).
struct TokenizeRequest {
  std::optional<std::string> prompt;
  std::optional<ChatRequest> chat;   // when "messages" is given
  bool add_generation_prompt = true;  // chat: end with "<|start|>assistant"
  bool return_token_strs = false;
};

struct DetokenizeRequest {
  std::vector<int32_t> tokens;
};

// /v1/responses (the OpenAI Responses API). The conversation maps onto a chat request, so the
// chat path's harmony rendering and output mapping serve both routes.
struct ResponsesRequest {
  ChatRequest chat;                   // sampling, tools, tool_choice, reasoning effort; messages: this input only
  ojson input_items = ojson::array();  // this request's input as Responses items (a string: one user message)
  std::optional<std::string> instructions;           // a developer message ahead of everything, not carried over
  std::optional<std::string> previous_response_id;  // continue a stored response's conversation
  bool store = true;
  ojson echo = ojson::object();  // the request's settings as the response object repeats them
};
ResponsesRequest parse_responses_request(const ojson& j);
// Responses items (message, reasoning, function_call, function_call_output) as chat messages;
// `where` names the field in errors ("input").
std::vector<ChatMessage> responses_items_to_messages(const ojson& items, const std::string& where);

// Parse the body text (throws ApiError 400 on malformed JSON or wrong types/values, on a raw NUL
// byte, and on arrays and objects nested more than kMaxJsonDepth levels: the body object is level 1).
constexpr int kMaxJsonDepth = 128;
ojson parse_body(const std::string& body);
ChatRequest parse_chat_request(const ojson& j);
CompletionRequest parse_completion_request(const ojson& j);
TokenizeRequest parse_tokenize_request(const ojson& j);
DetokenizeRequest parse_detokenize_request(const ojson& j);

// A fresh id such as "chatcmpl-1a2b..." (random hex).
std::string make_id(const std::string& prefix);

}  // namespace gptoss::server
