#pragma once
// OpenAI API request types, their validation, and the error object. Pure functions: parsing a
// request body never touches the engine, so every bad input is answered before it costs anything.
#include <nlohmann/json.hpp>

#include <optional>
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
};

struct ChatRequest : CommonRequest {
  std::vector<ChatMessage> messages;
  std::vector<FunctionTool> tools;
  std::string tool_choice = "auto";  // none, auto, required, or a function name when forced
  std::optional<std::string> reasoning_effort;  // low, medium, high
};

struct CompletionRequest : CommonRequest {
  std::variant<std::string, std::vector<int32_t>> prompt;
  bool echo = false;
};

// Parse the body text (throws ApiError 400 on malformed JSON or wrong types/values).
ojson parse_body(const std::string& body);
ChatRequest parse_chat_request(const ojson& j);
CompletionRequest parse_completion_request(const ojson& j);

// A fresh id such as "chatcmpl-1a2b..." (random hex).
std::string make_id(const std::string& prefix);

}  // namespace gptoss::server
