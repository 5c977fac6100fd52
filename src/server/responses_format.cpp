#include "server/responses_format.h"

#include "server/openai_api.h"

namespace gptoss::server {

using oj = nlohmann::ordered_json;

ResponseBuilder::ResponseBuilder(oj base, bool stream) : base_(std::move(base)), stream_(stream) {}

void ResponseBuilder::emit(const char* type, oj ev) {
  if (!stream_) return;
  oj out = {{"type", type}, {"sequence_number", seq_++}};
  for (auto it = ev.begin(); it != ev.end(); ++it) out[it.key()] = *it;
  events_ += "event: ";
  events_ += type;
  events_ += "\ndata: " + out.dump(-1, ' ', false, oj::error_handler_t::replace) + "\n\n";
}

std::string ResponseBuilder::take_events() { return std::exchange(events_, {}); }

oj ResponseBuilder::response() const {
  oj r = base_;
  r["status"] = status_;
  r["error"] = error_.is_null() ? oj(nullptr) : error_;
  r["incomplete_details"] = incomplete_.is_null() ? oj(nullptr) : incomplete_;
  r["output"] = output_;
  r["usage"] = usage_.is_null() ? oj(nullptr) : usage_;
  return r;
}

void ResponseBuilder::start() {
  emit("response.created", {{"response", response()}});
  emit("response.in_progress", {{"response", response()}});
}

void ResponseBuilder::open_item(Open kind, const ChatDelta::ToolCallDelta* call) {
  close_item();
  open_ = kind;
  text_.clear();
  const int index = int(output_.size());
  oj item;
  if (kind == Open::Reasoning) {
    item = {{"id", make_id("rs_")}, {"type", "reasoning"}, {"summary", oj::array()}, {"content", oj::array()},
            {"status", "in_progress"}};
  } else if (kind == Open::Message) {
    item = {{"id", make_id("msg_")}, {"type", "message"}, {"role", "assistant"}, {"status", "in_progress"},
            {"content", oj::array()}};
  } else {
    item = {{"id", make_id("fc_")}, {"type", "function_call"}, {"call_id", call->id}, {"name", call->name},
            {"arguments", ""}, {"status", "in_progress"}};
  }
  output_.push_back(item);
  emit("response.output_item.added", {{"output_index", index}, {"item", item}});
  if (kind == Open::FunctionCall) return;
  oj part = kind == Open::Reasoning ? oj{{"type", "reasoning_text"}, {"text", ""}}
                                    : oj{{"type", "output_text"}, {"text", ""}, {"annotations", oj::array()}, {"logprobs", oj::array()}};
  output_.back()["content"].push_back(part);
  emit("response.content_part.added",
       {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"part", part}});
}

void ResponseBuilder::add_text(Open kind, const std::string& text) {
  if (text.empty()) return;
  if (open_ != kind) open_item(kind);
  text_ += text;
  oj& item = output_.back();
  const int index = int(output_.size()) - 1;
  if (kind == Open::FunctionCall) {
    item["arguments"] = text_;
    emit("response.function_call_arguments.delta", {{"item_id", item["id"]}, {"output_index", index}, {"delta", text}});
    return;
  }
  item["content"][0]["text"] = text_;
  oj ev = {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"delta", text}};
  if (kind == Open::Message) ev["logprobs"] = oj::array();
  emit(kind == Open::Reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", std::move(ev));
}

void ResponseBuilder::close_item(const char* status) {
  if (open_ == Open::None) return;
  oj& item = output_.back();
  const int index = int(output_.size()) - 1;
  const oj id = item["id"];
  if (open_ == Open::FunctionCall) {
    emit("response.function_call_arguments.done",
         {{"item_id", id}, {"output_index", index}, {"name", item["name"]}, {"arguments", text_}});
  } else {
    const bool reasoning = open_ == Open::Reasoning;
    oj ev = {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}};
    if (!reasoning) ev["logprobs"] = oj::array();
    emit(reasoning ? "response.reasoning_text.done" : "response.output_text.done", std::move(ev));
    emit("response.content_part.done",
         {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", item["content"][0]}});
  }
  item["status"] = status;
  emit("response.output_item.done", {{"output_index", index}, {"item", item}});
  open_ = Open::None;
  text_.clear();
}

void ResponseBuilder::push(const ChatDelta& d) {
  // harmony writes the analysis channel first, then a final message or a call; one token's
  // delta rarely spans two, and in this order when it does.
  add_text(Open::Reasoning, d.reasoning);
  add_text(Open::Message, d.content);
  for (const auto& t : d.tool_calls) {
    if (!t.id.empty()) open_item(Open::FunctionCall, &t);
    add_text(Open::FunctionCall, t.arguments);
  }
}

void ResponseBuilder::finish(FinishReason reason, int input_tokens, int output_tokens, const std::string& error) {
  close_item(reason == FinishReason::kStop ? "completed" : "incomplete");  // an item cut short says so
  usage_ = {{"input_tokens", input_tokens},
            {"input_tokens_details", {{"cached_tokens", 0}}},
            {"output_tokens", output_tokens},
            {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
            {"total_tokens", input_tokens + output_tokens}};
  const char* event = "response.completed";
  switch (reason) {
    case FinishReason::kLength:
      status_ = "incomplete";
      incomplete_ = {{"reason", "max_output_tokens"}};
      event = "response.incomplete";
      break;
    case FinishReason::kError:
      status_ = "failed";
      error_ = {{"code", "server_error"}, {"message", "Generation failed: " + error}};
      event = "response.failed";
      break;
    case FinishReason::kAbort:
      status_ = "cancelled";
      event = "response.failed";
      break;
    default:
      status_ = "completed";
  }
  emit(event, {{"response", response()}});
}

}  // namespace gptoss::server
