#include <gtest/gtest.h>

#include "server/openai_api.h"

using namespace gptoss::server;

namespace {
ApiError err_of(const std::string& body, bool chat = true) {
  try {
    ojson j = parse_body(body);
    if (chat) parse_chat_request(j);
    else parse_completion_request(j);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body;
  return {};
}
}  // namespace

TEST(OpenAiApi, ParsesChat) {
  auto r = parse_chat_request(parse_body(R"({
    "model": "m", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 3,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "stop": ["a", "b"], "stream": true,
    "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2, "reasoning_effort": "high",
    "messages": [
      {"role": "system", "content": "be nice"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}}
  })"));
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(*r.sampling.seed, 3u);
  EXPECT_EQ(r.sampling.stop.size(), 2u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.sampling.logprobs, 2);
  EXPECT_EQ(*r.reasoning_effort, "high");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(*r.messages[1].content, "hi there");
  EXPECT_EQ(*r.messages[2].reasoning, "hmm");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].name, "f");
  EXPECT_EQ(r.messages[3].tool_call_id, "call_1");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tool_choice, "f");
}

TEST(OpenAiApi, RejectsBadChat) {
  EXPECT_EQ(err_of("{not json").status, 400);
  EXPECT_EQ(err_of("{not json").code, "invalid_json");
  EXPECT_EQ(err_of("[1,2]").status, 400);
  EXPECT_EQ(err_of(R"({"model":"m"})").param, "messages");
  EXPECT_EQ(err_of(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(err_of(R"({"messages":"hi"})").code, "invalid_type");
  EXPECT_EQ(err_of(R"({"messages":[{"role":"wizard","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(err_of(R"({"messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(err_of(R"({"messages":[{"role":"user","content":5}]})").code, "invalid_type");
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  EXPECT_EQ(err_of("{" + m + R"(,"max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(err_of("{" + m + R"(,"max_tokens":-3})").param, "max_tokens");
  EXPECT_EQ(err_of("{" + m + R"(,"max_tokens":"5"})").code, "invalid_type");
  EXPECT_EQ(err_of("{" + m + R"(,"max_tokens":1.5})").code, "invalid_type");
  EXPECT_EQ(err_of("{" + m + R"(,"temperature":3})").param, "temperature");
  EXPECT_EQ(err_of("{" + m + R"(,"temperature":"hot"})").param, "temperature");
  EXPECT_EQ(err_of("{" + m + R"(,"top_p":0})").param, "top_p");
  EXPECT_EQ(err_of("{" + m + R"(,"n":2})").param, "n");
  EXPECT_EQ(err_of("{" + m + R"(,"stream":"yes"})").param, "stream");
  EXPECT_EQ(err_of("{" + m + R"(,"stop":[1]})").param, "stop");
  EXPECT_EQ(err_of("{" + m + R"(,"model":5})").param, "model");
  EXPECT_EQ(err_of("{" + m + R"(,"top_logprobs":3})").param, "top_logprobs");
  EXPECT_EQ(err_of("{" + m + R"(,"reasoning_effort":"max"})").param, "reasoning_effort");
  EXPECT_EQ(err_of("{" + m + R"(,"tools":[{"type":"function","function":{}}]})").param, "tools");
  EXPECT_EQ(err_of("{" + m + R"(,"tool_choice":"required"})").param, "tool_choice");
  EXPECT_EQ(err_of("{" + m + R"(,"tool_choice":"sometimes"})").param, "tool_choice");
  EXPECT_EQ(err_of("{" + m + R"(,"stream_options":5})").param, "stream_options");
}

TEST(OpenAiApi, ParsesCompletions) {
  auto r = parse_completion_request(parse_body(R"({"prompt":"hello","logprobs":2,"echo":true})"));
  EXPECT_EQ(std::get<std::string>(r.prompt), "hello");
  EXPECT_EQ(r.sampling.logprobs, 2);
  EXPECT_TRUE(r.echo);
  auto t = parse_completion_request(parse_body(R"({"prompt":[1,2,3]})"));
  EXPECT_EQ(std::get<std::vector<int32_t>>(t.prompt), (std::vector<int32_t>{1, 2, 3}));
  auto t2 = parse_completion_request(parse_body(R"({"prompt":[[4,5]]})"));
  EXPECT_EQ(std::get<std::vector<int32_t>>(t2.prompt).size(), 2u);
  auto t3 = parse_completion_request(parse_body(R"({"prompt":["x"]})"));
  EXPECT_EQ(std::get<std::string>(t3.prompt), "x");
  EXPECT_EQ(err_of(R"({})", false).param, "prompt");
  EXPECT_EQ(err_of(R"({"prompt":""})", false).param, "prompt");
  EXPECT_EQ(err_of(R"({"prompt":[]})", false).param, "prompt");
  EXPECT_EQ(err_of(R"({"prompt":["a","b"]})", false).param, "prompt");
  EXPECT_EQ(err_of(R"({"prompt":[1,-2]})", false).param, "prompt");
  EXPECT_EQ(err_of(R"({"prompt":{"a":1}})", false).param, "prompt");
  EXPECT_EQ(err_of(R"({"prompt":"x","logprobs":50})", false).param, "logprobs");
}

TEST(OpenAiApi, ErrorBody) {
  auto j = error_body(ApiError{404, "nope", "invalid_request_error", "model", "model_not_found"});
  EXPECT_EQ(j["error"]["message"], "nope");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  auto k = error_body(ApiError{400, "x", "invalid_request_error", "", ""});
  EXPECT_TRUE(k["error"]["param"].is_null());
  EXPECT_TRUE(k["error"]["code"].is_null());
}
