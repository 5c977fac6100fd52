#pragma once
// The Responses API's output: a response object whose `output` holds reasoning (the analysis
// channel), message (the final text) and function_call items, built from the chat path's
// ChatOutputMapper deltas; when streaming, also the official SSE event sequence
// (response.created, response.in_progress, response.output_item.added, ...content_part.added,
// ...reasoning_text.delta/done, ...output_text.delta/done, ...function_call_arguments.delta/done,
// ...content_part.done, ...output_item.done, response.completed), numbered by sequence_number.
#include <nlohmann/json.hpp>

#include <string>

#include "engine/engine.h"
#include "server/chat_format.h"

namespace gptoss::server {

class ResponseBuilder {
 public:
  // `base`: the response object's fixed fields (id, created_at, model, and the request's
  // settings it repeats); status, output and usage are filled here.
  ResponseBuilder(nlohmann::ordered_json base, bool stream);

  // response.created and response.in_progress.
  void start();
  // One token's output; count_reasoning_token() for a token of the analysis channel (it goes to
  // usage.output_tokens_details.reasoning_tokens).
  void push(const ChatDelta& d);
  void count_reasoning_token() { ++reasoning_tokens_; }
  // Ends the open item and the response: completed (stop), incomplete (length: reason
  // max_output_tokens), failed (error: `error`), cancelled (abort).
  void finish(FinishReason reason, int input_tokens, int output_tokens, const std::string& error = "");

  // The SSE events produced since the last call ("event: TYPE\ndata: JSON\n\n" each).
  std::string take_events();
  // The response object as it stands (the final one after finish()).
  nlohmann::ordered_json response() const;
  const nlohmann::ordered_json& output() const { return output_; }
  int reasoning_tokens() const { return reasoning_tokens_; }

 private:
  enum class Open { None, Reasoning, Message, FunctionCall };
  void emit(const char* type, nlohmann::ordered_json ev);
  void open_item(Open kind, const ChatDelta::ToolCallDelta* call = nullptr);
  void close_item(const char* status = "completed");
  void add_text(Open kind, const std::string& text);

  nlohmann::ordered_json base_;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  std::string status_ = "in_progress";
  nlohmann::ordered_json usage_, error_, incomplete_;
  bool stream_;
  int seq_ = 0;
  std::string events_;
  Open open_ = Open::None;
  std::string text_;  // the open item's text (or arguments) so far
  int reasoning_tokens_ = 0;
};

}  // namespace gptoss::server
