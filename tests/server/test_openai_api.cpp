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
  EXPECT_EQ(r.tool_choice.mode, "function");
  EXPECT_EQ(r.tool_choice.function, "f");
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
  EXPECT_EQ(err_of("{" + m + R"(,"tools":[{"type":"function","function":{}}]})").param, "tools[0].function.name");
  EXPECT_EQ(err_of("{" + m + R"(,"tool_choice":"required"})").param, "tool_choice");
  EXPECT_EQ(err_of("{" + m + R"(,"tool_choice":"sometimes"})").param, "tool_choice");
  EXPECT_EQ(err_of("{" + m + R"(,"stream_options":5})").param, "stream_options");
}

// What a fuzzing pass found (fortieth session): each once answered 200 with the value misread or
// ignored, or (the nesting) crashed the server.
TEST(OpenAiApi, RefusesNestingPastTheLimit) {
  // The body object is level 1: kMaxJsonDepth levels parse, one more is refused (while parsing:
  // what copies and prints tool arguments and schemas recurses, and 100,000 levels overflowed the stack).
  auto body = [](int levels) {  // `levels` levels in all: the body, metadata, then levels - 2 arrays
    std::string v = "0";
    for (int i = 0; i < levels - 2; ++i) v = "[" + v + "]";
    return R"({"metadata":{"a":)" + v + "}}";
  };
  EXPECT_NO_THROW(parse_body(body(kMaxJsonDepth)));
  ApiError e = err_of(body(kMaxJsonDepth + 1));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_NE(e.message.find("levels deep"), std::string::npos) << e.message;
  // The case that crashed: a tool call's arguments 100,000 arrays deep.
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  EXPECT_EQ(err_of(R"({"messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":)" +
                   deep + "}}]}]}")
                .code,
            "invalid_json");
  // A raw NUL ends the text for the parser; it is never JSON.
  EXPECT_EQ(err_of(std::string(R"({"messages":[{"role":"user","content":"x"}]})") + '\0').code, "invalid_json");
}

TEST(OpenAiApi, RefusesWhatNoOneReads) {
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  // stop_token_ids out of 32 bits: once cut to 32 bits (2^32 + 32 became token 32).
  EXPECT_EQ(err_of("{" + m + R"(,"stop_token_ids":[4294967328]})").param, "stop_token_ids");
  EXPECT_EQ(err_of("{" + m + R"(,"stop_token_ids":[-1]})").param, "stop_token_ids");
  EXPECT_EQ(err_of("{" + m + R"(,"stop_token_ids":[18446744073709551615]})").param, "stop_token_ids");
  EXPECT_EQ(parse_chat_request(parse_body("{" + m + R"(,"stop_token_ids":[200012]})")).sampling.stop_token_ids,
            std::vector<int32_t>{200012});
  // max_tokens and max_completion_tokens: both when they agree, refused when not; each names itself.
  EXPECT_EQ(*parse_chat_request(parse_body("{" + m + R"(,"max_tokens":5,"max_completion_tokens":5})")).max_tokens, 5);
  EXPECT_EQ(*parse_chat_request(parse_body("{" + m + R"(,"max_completion_tokens":6})")).max_tokens, 6);
  EXPECT_EQ(err_of("{" + m + R"(,"max_tokens":5,"max_completion_tokens":6})").message.find("disagree") != std::string::npos,
            true);
  EXPECT_EQ(err_of("{" + m + R"(,"max_completion_tokens":0})").param, "max_completion_tokens");
  EXPECT_EQ(err_of("{" + m + R"(,"max_tokens":9223372036854775808.0})").param, "max_tokens");
  // A message's keys, by role; a wrong type names the message's field.
  EXPECT_EQ(err_of(R"({"messages":[{"role":"user","content":"x","foo":1}]})").param, "messages[0].foo");
  EXPECT_EQ(err_of(R"({"messages":[{"role":"user","content":"x","name":"bob"}]})").param, "messages[0].name");
  EXPECT_EQ(err_of(R"({"messages":[{"role":"user","content":"x","tool_call_id":"c"}]})").param, "messages[0].tool_call_id");
  EXPECT_EQ(err_of(R"({"messages":[{"role":"user","content":"x","reasoning_content":"r"}]})").param,
            "messages[0].reasoning_content");
  EXPECT_EQ(err_of(R"({"messages":[{"role":1,"content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(err_of(R"({"messages":[{"role":"tool","content":"x","name":5}]})").param, "messages[0].name");
  EXPECT_EQ(err_of(R"({"messages":[{"role":"assistant","content":"x","refusal":"no"}]})").param, "messages[0].refusal");
  // An assistant message as a client echoes it back (nulls, an empty refusal and annotations) is taken.
  auto echo = parse_chat_request(parse_body(
      R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y","refusal":null,"annotations":[],)"
      R"("audio":null,"function_call":null,"reasoning_content":"r","reasoning":"r"},{"role":"user","content":"z"}]})"));
  EXPECT_EQ(*echo.messages[1].reasoning, "r");
  const std::string call = R"({"messages":[{"role":"assistant","tool_calls":[)";
  EXPECT_EQ(err_of(call + R"({"id":"c","type":"function","function":{"name":"f","arguments":"{}"},"x":1}]}]})").param,
            "messages[0].tool_calls[0].x");
  EXPECT_EQ(err_of(call + R"({"id":"c","type":"custom","function":{"name":"f","arguments":"{}"}}]}]})").param,
            "messages[0].tool_calls[0].type");
  EXPECT_EQ(err_of(call + R"({"id":"c","function":{"name":"f","arguments":"{}","strict":true}}]}]})").param,
            "messages[0].tool_calls[0].function.strict");
  // Tools: their keys, names (at most 64 characters, each once), parameters of type object.
  auto tools = [&](const std::string& t) { return err_of("{" + m + R"(,"tools":)" + t + "}"); };
  EXPECT_EQ(tools(R"([{"type":"function","function":{"name":"x"},"foo":1}])").param, "tools[0].foo");
  EXPECT_EQ(tools(R"([{"type":"function","function":{"name":"x","foo":1}}])").param, "tools[0].function.foo");
  EXPECT_EQ(tools(R"([{"type":"function","function":{"name":")" + std::string(65, 'a') + R"("}}])").param,
            "tools[0].function.name");
  EXPECT_EQ(tools(R"([{"function":{"name":"x"}},{"function":{"name":"x"}}])").param, "tools[1].function.name");
  EXPECT_EQ(tools(R"([{"function":{"name":"x","parameters":{"type":"array"}}}])").code, "invalid_schema");
  EXPECT_EQ(parse_chat_request(parse_body("{" + m + R"(,"tools":[{"function":{"name":")" + std::string(64, 'a') +
                                          R"(","parameters":{}}}]})"))
                .tools.size(),
            1u);
  // tool_choice: of type function, with function.name alone.
  const std::string t = R"(,"tools":[{"type":"function","function":{"name":"x"}}])";
  EXPECT_EQ(err_of("{" + m + t + R"(,"tool_choice":{"type":"custom","function":{"name":"x"}}})").param, "tool_choice.type");
  EXPECT_EQ(err_of("{" + m + t + R"(,"tool_choice":{"type":"function","function":{"name":"x","a":1}}})").param,
            "tool_choice.function.a");
  EXPECT_EQ(parse_chat_request(parse_body("{" + m + t + R"(,"tool_choice":{"type":"function","function":{"name":"x"}}})"))
                .tool_choice.function,
            "x");
  // A function may be named like a mode: forcing it is not that mode.
  const std::string named_auto = R"(,"tools":[{"type":"function","function":{"name":"auto"}}])";
  const auto forced = parse_chat_request(
      parse_body("{" + m + named_auto + R"(,"tool_choice":{"type":"function","function":{"name":"auto"}}})"));
  EXPECT_EQ(forced.tool_choice.mode, "function");
  EXPECT_TRUE(forced.tool_choice.must_call());
  EXPECT_FALSE(forced.tool_choice.may_call("other"));
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

namespace {
// A valid value for every field a route's table may list: a field added to a table without a
// sample here fails FieldTables.EveryHonouredFieldIsRead, so its parser gets tested.
const ojson& sample_values() {
  static const ojson s = ojson::parse(R"({
    "model": "m", "max_tokens": 5, "max_completion_tokens": 5, "temperature": 0.5, "top_p": 0.9,
    "top_k": 3, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": 0.5, "seed": 1, "n": 1,
    "stop": "x", "stop_token_ids": [7], "ignore_eos": true, "stream": true,
    "stream_options": {"include_usage": true}, "logit_bias": {"15": 1.5}, "user": "u",
    "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 0,
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
    "parallel_tool_calls": false, "reasoning_effort": "low", "reasoning": {"effort": "low"},
    "response_format": {"type": "text"}, "store": false, "metadata": {"k": "v"},
    "prompt": "hi", "echo": true, "best_of": 1, "add_generation_prompt": false,
    "continue_final_message": false, "return_token_strs": true, "add_special_tokens": true,
    "tokens": [1, 2], "skip_special_tokens": true, "include_stop_str_in_output": false,
    "safety_identifier": "s", "prompt_cache_key": "k",
    "input": "hi", "instructions": "be brief", "previous_response_id": "resp_1", "max_output_tokens": 5,
    "text": {"format": {"type": "text"}}, "truncation": "disabled", "include": [], "background": false,
    "service_tier": "auto"
  })");
  return s;
}

ApiError parse_error(const ojson& j, const std::string& route) {
  try {
    if (route == "chat") parse_chat_request(j);
    else if (route == "completions") parse_completion_request(j);
    else if (route == "tokenize") parse_tokenize_request(j);
    else if (route == "responses") parse_responses_request(j);
    else parse_detokenize_request(j);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError{200, "", "", "", ""};
}

ojson base_of(const std::string& route) {
  if (route == "chat") return {{"messages", ojson::array({{{"role", "user"}, {"content", "hi"}}})}};
  if (route == "completions") return {{"prompt", "hi"}};
  if (route == "tokenize") return {{"prompt", "hi"}};
  if (route == "responses") return {{"input", "hi"}};
  return {{"tokens", {1}}};
}
}  // namespace

// Item 1 of issue 17: every field in a route's table is either read by its parser or refused;
// a table entry the parser never reads would be answered 400 too, so the sample must parse.
TEST(FieldTables, EveryHonouredFieldIsRead) {
  std::vector<std::pair<std::string, std::span<const RequestField>>> routes = {
      {"chat", chat_fields()}, {"completions", completion_fields()}, {"tokenize", tokenize_fields()},
      {"detokenize", detokenize_fields()}, {"responses", responses_fields()}};
  for (auto& [route, table] : routes) {
    for (const RequestField& f : table) {
      if (f.use == FieldUse::kRefused) continue;
      ojson j = base_of(route);
      if (std::string(f.name) == "logprobs") {  // a boolean for chat, a count for completions
        j["logprobs"] = route == "chat" ? ojson(true) : ojson(2);
        EXPECT_EQ(parse_error(j, route).status, 200) << route << " logprobs";
        continue;
      }
      ASSERT_TRUE(sample_values().contains(f.name)) << "no sample value for " << f.name;
      if (route == "tokenize" && (std::string(f.name) == "messages" || std::string(f.name) == "tools" ||
                                  std::string(f.name) == "tool_choice" || std::string(f.name).rfind("reasoning", 0) == 0)) {
        j.erase("prompt");
        j["messages"] = sample_values()["messages"];
      }
      j[f.name] = sample_values()[f.name];
      if (route == "responses" && std::string(f.name) == "tools")  // the Responses API's flat form
        j["tools"] = ojson::parse(R"([{"type": "function", "name": "f"}])");
      if (route == "chat" && std::string(f.name) == "top_logprobs") j["logprobs"] = true;
      ApiError e = parse_error(j, route);
      EXPECT_EQ(e.status, 200) << route << " " << f.name << ": " << e.message;
    }
  }
}

TEST(FieldTables, UnknownAndUnsupportedFieldsAreRefusedByName) {
  struct Case {
    std::string route, body, param;
  };
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  std::vector<Case> cases = {
      {"chat", "{" + m + R"(,"response_format":{"type":"json_object","schema":{}}})", "response_format.schema"},
      {"chat", "{" + m + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schemas":{}}}})",
       "response_format.json_schema.schemas"},
      {"chat", "{" + m + R"(,"functions":[{"name":"f"}]})", "functions"},
      {"chat", "{" + m + R"(,"function_call":"auto"})", "function_call"},
      {"chat", "{" + m + R"(,"repetition_penalty":1.1})", "repetition_penalty"},
      {"chat", "{" + m + R"(,"best_of":2})", "best_of"},
      {"chat", "{" + m + R"(,"frobnicate":true})", "frobnicate"},
      {"chat", "{" + m + R"(,"store":true})", "store"},
      {"chat", "{" + m + R"(,"reasoning":{"effort":"low","summary":"auto"}})", "reasoning.summary"},
      {"chat", "{" + m + R"(,"stream_options":{"include_obfuscation":true}})", "stream_options.include_obfuscation"},
      {"chat", "{" + m + R"(,"skip_special_tokens":false})", "skip_special_tokens"},
      {"completions", R"({"prompt":"x","include_stop_str_in_output":true})", "include_stop_str_in_output"},
      {"completions", R"({"prompt":"x","suffix":"y"})", "suffix"},
      {"completions", R"({"prompt":"x","best_of":3})", "best_of"},
      {"completions", R"({"prompt":"x","repetition_penalty":1.2})", "repetition_penalty"},
      {"completions", R"({"prompt":"x","messages":[]})", "messages"},
      {"tokenize", R"({"prompt":"x","temperature":1})", "temperature"},
      {"tokenize", R"({"messages":[{"role":"user","content":"x"}],"continue_final_message":true})",
       "continue_final_message"},
      {"detokenize", R"({"tokens":[1],"prompt":"x"})", "prompt"},
  };
  for (const auto& c : cases) {
    ApiError e = parse_error(parse_body(c.body), c.route);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.code, "unsupported_value") << c.body << ": " << e.message;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error");
  }
  // A bogus response_format type is a bad value, not an unsupported one; null means absent.
  EXPECT_EQ(parse_error(parse_body("{" + m + R"(,"response_format":{"type":"bogus"}})"), "chat").param,
            "response_format");
  EXPECT_EQ(parse_error(parse_body("{" + m + R"(,"suffix":null,"functions":null,"frobnicate":null})"), "chat").status,
            200);
  EXPECT_EQ(parse_error(parse_body(R"({"prompt":"x","suffix":null,"best_of":1})"), "completions").status, 200);
}

TEST(OpenAiApi, LogitBiasAndReasoningObject) {
  const std::string m = R"("messages":[{"role":"user","content":"x"}])";
  auto r = parse_chat_request(parse_body("{" + m + R"(,"logit_bias":{"15":-100,"200":2.5}})"));
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias[0], (std::pair<int32_t, float>{15, -100.0f}));
  EXPECT_EQ(r.sampling.logit_bias[1], (std::pair<int32_t, float>{200, 2.5f}));
  auto c = parse_completion_request(parse_body(R"({"prompt":"x","logit_bias":{"7":100}})"));
  ASSERT_EQ(c.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(err_of("{" + m + R"(,"logit_bias":{"abc":1}})").param, "logit_bias");
  EXPECT_EQ(err_of("{" + m + R"(,"logit_bias":{"-1":1}})").param, "logit_bias");
  EXPECT_EQ(err_of("{" + m + R"(,"logit_bias":{"5":101}})").param, "logit_bias");
  EXPECT_EQ(err_of("{" + m + R"(,"logit_bias":{"5":"x"}})").code, "invalid_type");
  EXPECT_EQ(err_of("{" + m + R"(,"logit_bias":[1]})").code, "invalid_type");

  auto e = parse_chat_request(parse_body("{" + m + R"(,"reasoning":{"effort":"high"}})"));
  ASSERT_TRUE(e.reasoning_effort);
  EXPECT_EQ(*e.reasoning_effort, "high");
  auto both = parse_chat_request(parse_body("{" + m + R"(,"reasoning":{"effort":"low"},"reasoning_effort":"low"})"));
  EXPECT_EQ(*both.reasoning_effort, "low");
  EXPECT_EQ(err_of("{" + m + R"(,"reasoning":{"effort":"low"},"reasoning_effort":"high"})").param, "reasoning.effort");
  EXPECT_EQ(err_of("{" + m + R"(,"reasoning":{"effort":"max"}})").param, "reasoning.effort");
  EXPECT_EQ(err_of("{" + m + R"(,"reasoning":"high"})").code, "invalid_type");
}

TEST(OpenAiApi, TokenizeRequests) {
  auto t = parse_tokenize_request(parse_body(R"({"prompt":"hi","return_token_strs":true})"));
  EXPECT_EQ(*t.prompt, "hi");
  EXPECT_TRUE(t.return_token_strs);
  EXPECT_FALSE(t.chat);
  auto c = parse_tokenize_request(
      parse_body(R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"reasoning_effort":"high"})"));
  ASSERT_TRUE(c.chat);
  EXPECT_FALSE(c.add_generation_prompt);
  EXPECT_EQ(*c.chat->reasoning_effort, "high");
  EXPECT_EQ(parse_error(parse_body(R"({})"), "tokenize").param, "prompt");
  EXPECT_EQ(parse_error(parse_body(R"({"prompt":"x","messages":[]})"), "tokenize").param, "prompt");
  auto d = parse_detokenize_request(parse_body(R"({"tokens":[1,2,3]})"));
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_error(parse_body(R"({"tokens":[-1]})"), "detokenize").param, "tokens");
  EXPECT_EQ(parse_error(parse_body(R"({"tokens":"1"})"), "detokenize").code, "invalid_type");
}

TEST(OpenAiApi, ResponseFormatShapes) {
  auto parse = [](const std::string& rf) {
    return parse_chat_request(parse_body(R"({"messages":[{"role":"user","content":"x"}],"response_format":)" + rf + "}"));
  };
  EXPECT_EQ(parse(R"({"type":"text"})").response_format.type, "text");
  EXPECT_EQ(parse(R"({"type":"json_object"})").response_format.type, "json_object");
  auto js = parse(R"({"type":"json_schema","json_schema":{"name":"a_b-1","schema":{"type":"string"}}})").response_format;
  EXPECT_EQ(js.name, "a_b-1");
  EXPECT_FALSE(js.strict);
  ASSERT_TRUE(js.schema);
  for (const char* bad : {R"("json")", R"({})", R"({"type":"xml"})", R"({"type":"json_schema"})",
                          R"({"type":"json_schema","json_schema":{"schema":{}}})",
                          R"({"type":"json_schema","json_schema":{"name":"a b","schema":{}}})",
                          R"({"type":"json_schema","json_schema":{"name":"a","schema":[1]}})",
                          R"({"type":"json_schema","json_schema":{"name":"a","strict":"yes"}})"}) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << bad;
      EXPECT_FALSE(e.message.empty());
    }
  }
}
