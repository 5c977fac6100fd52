// /v1/responses: request parsing and refusals, the output items and the official event
// sequence built from harmony tokens, the SQLite store, and the route over a live server
// (create, stream, retrieve, delete, previous_response_id, store: false).
#include <unistd.h>

#include <filesystem>

#include "common/error.h"
#include "http_fixture.h"
#include "json_schema_oracle.h"
#include "server/chat_format.h"
#include "server/response_store.h"
#include "server/responses_format.h"

using namespace httptest;
using namespace gptoss::server;
using gptoss::FinishReason;

namespace {

ApiError responses_error(const std::string& body) {
  try {
    parse_responses_request(parse_body(body));
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body;
  return {};
}

// The events of a stream: ("event: T\ndata: {...}") pairs; checks the event name equals data.type.
std::vector<json> sse_events(const std::string& raw) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t e = raw.find("\n\n", pos);
    if (e == std::string::npos) break;
    std::string ev = raw.substr(pos, e - pos);
    pos = e + 2;
    size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_NE(nl, std::string::npos) << ev;
    if (nl == std::string::npos) continue;
    json d = json::parse(ev.substr(nl + 7));
    EXPECT_EQ(ev.substr(7, nl - 7), d["type"].get<std::string>());
    out.push_back(d);
  }
  return out;
}

std::vector<std::string> types_of(const std::vector<json>& evs) {
  std::vector<std::string> t;
  for (const auto& e : evs) t.push_back(e["type"]);
  return t;
}

}  // namespace

TEST(ResponsesApi, ParsesItems) {
  auto r = parse_responses_request(parse_body(R"({
    "model": "m", "instructions": "be brief", "max_output_tokens": 9, "temperature": 0.3, "top_p": 0.8,
    "reasoning": {"effort": "high"}, "store": false, "metadata": {"k": "v"}, "tool_choice": {"type": "function", "name": "f"},
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
    "input": [
      {"role": "user", "content": "hi"},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
      {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"x\":1}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "42"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "it is 42"}]}
    ]
  })"));
  EXPECT_EQ(*r.chat.max_tokens, 9);
  EXPECT_FLOAT_EQ(r.chat.sampling.temperature, 0.3f);
  EXPECT_FLOAT_EQ(r.chat.sampling.top_p, 0.8f);
  EXPECT_EQ(*r.chat.reasoning_effort, "high");
  EXPECT_FALSE(r.store);
  EXPECT_EQ(*r.instructions, "be brief");
  EXPECT_EQ(r.chat.tool_choice.function, "f");
  ASSERT_EQ(r.chat.tools.size(), 1u);
  ASSERT_EQ(r.chat.messages.size(), 5u);
  EXPECT_EQ(r.chat.messages[0].role, "user");
  EXPECT_EQ(*r.chat.messages[1].reasoning, "think");
  EXPECT_EQ(r.chat.messages[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.chat.messages[2].tool_calls[0].arguments, "{\"x\":1}");
  EXPECT_EQ(r.chat.messages[3].role, "tool");
  EXPECT_EQ(*r.chat.messages[3].content, "42");
  EXPECT_EQ(*r.chat.messages[4].content, "it is 42");
  EXPECT_EQ(r.echo["metadata"]["k"], "v");
  auto s = parse_responses_request(parse_body(R"({"input": "hello"})"));
  ASSERT_EQ(s.chat.messages.size(), 1u);
  EXPECT_EQ(*s.chat.messages[0].content, "hello");
  EXPECT_TRUE(s.store);  // the API's default
}

TEST(ResponsesApi, RefusesWhatItCannotHonour) {
  // text.format: a bad type, a json_schema without its name or schema, keys it does not know.
  auto e = responses_error(R"({"input":"x","text":{"format":{"type":"yaml"}}})");
  EXPECT_EQ(e.code, "invalid_value");
  EXPECT_EQ(e.param, "text.format.type");
  EXPECT_EQ(responses_error(R"({"input":"x","text":{"format":{}}})").param, "text.format");
  EXPECT_EQ(responses_error(R"({"input":"x","text":{"format":"json"}})").code, "invalid_type");
  EXPECT_EQ(responses_error(R"({"input":"x","text":{"format":{"type":"json_schema","schema":{}}}})").param,
            "text.format.name");
  EXPECT_EQ(responses_error(R"({"input":"x","text":{"format":{"type":"json_schema","name":"n"}}})").param,
            "text.format.schema");
  EXPECT_EQ(responses_error(R"({"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":3}}})").param,
            "text.format.schema");
  EXPECT_EQ(responses_error(R"({"input":"x","text":{"format":{"type":"json_schema","name":"a b","schema":{}}}})").param,
            "text.format.name");
  EXPECT_EQ(
      responses_error(R"({"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{},"json_schema":{}}}})")
          .param,
      "text.format.json_schema");
  EXPECT_EQ(responses_error(R"({"input":"x","text":{"format":{"type":"json_object","schema":{}}}})").param,
            "text.format.schema");
  EXPECT_EQ(responses_error(R"({"input":"x","text":{"verbosity":"low"}})").param, "text.verbosity");
  EXPECT_EQ(responses_error(R"({"input":"x","reasoning":{"summary":"auto"}})").param, "reasoning.summary");
  EXPECT_EQ(responses_error(R"({"input":"x","tools":[{"type":"web_search"}]})").param, "tools[0].type");
  EXPECT_EQ(responses_error(R"({"input":"x","include":["reasoning.encrypted_content"]})").param, "include");
  EXPECT_EQ(responses_error(R"({"input":"x","background":true})").param, "background");
  EXPECT_EQ(responses_error(R"({"input":"x","truncation":"auto"})").param, "truncation");
  EXPECT_EQ(responses_error(R"({"input":"x","top_logprobs":2})").param, "top_logprobs");
  EXPECT_EQ(responses_error(R"({"input":"x","max_tokens":5})").param, "max_tokens");  // a chat field
  EXPECT_EQ(responses_error(R"({"input":"x","max_output_tokens":0})").param, "max_output_tokens");
  EXPECT_EQ(responses_error(R"({})").param, "input");
  EXPECT_EQ(responses_error(R"({"input":[]})").param, "input");
  EXPECT_EQ(responses_error(R"({"input":[{"type":"item_reference","id":"x"}]})").param, "input[0].type");
  EXPECT_EQ(responses_error(R"({"input":[{"type":"message","role":"user","content":[{"type":"input_image"}]}]})").param,
            "input[0].content");
  EXPECT_EQ(responses_error(R"({"input":[{"type":"function_call_output","output":"x"}]})").param, "input[0].call_id");
  EXPECT_EQ(responses_error(R"({"input":"x","tool_choice":{"type":"function","name":"g"}})").param, "tool_choice");
  // Function tools as on chat completions: names of at most 64 characters, each once; parameters of type object.
  EXPECT_EQ(responses_error(R"({"input":"x","tools":[{"type":"function","name":"f"},{"type":"function","name":"f"}]})").param,
            "tools[1].name");
  EXPECT_EQ(responses_error(R"({"input":"x","tools":[{"type":"function","name":")" + std::string(65, 'f') + R"("}]})").param,
            "tools[0].name");
  EXPECT_EQ(
      responses_error(R"({"input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"string"}}]})").code,
      "invalid_schema");
  EXPECT_EQ(responses_error(R"({"input":"x","tools":[{"type":"function","name":5}]})").param, "tools[0].name");
}

// text.format maps onto the chat path's response format (so the same structured-output code
// constrains it) and is repeated in the response object; strict tools are honoured.
TEST(ResponsesApi, ParsesTextFormat) {
  auto r = parse_responses_request(parse_body(R"({"input": "x", "text": {"format": {"type": "json_schema",
      "name": "pet", "description": "one pet", "strict": true, "schema": {"type": "object", "properties": {}}}},
      "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}]})"));
  EXPECT_EQ(r.chat.response_format.type, "json_schema");
  EXPECT_EQ(r.chat.response_format.name, "pet");
  EXPECT_EQ(r.chat.response_format.description, "one pet");
  EXPECT_TRUE(r.chat.response_format.strict);
  ASSERT_TRUE(r.chat.response_format.schema);
  EXPECT_EQ((*r.chat.response_format.schema)["type"], "object");
  EXPECT_EQ(r.echo["text"]["format"]["type"], "json_schema");
  EXPECT_EQ(r.echo["text"]["format"]["name"], "pet");
  EXPECT_EQ(r.echo["text"]["format"]["strict"], true);
  EXPECT_EQ(r.echo["text"]["format"]["schema"]["type"], "object");
  ASSERT_EQ(r.chat.tools.size(), 1u);
  EXPECT_TRUE(r.chat.tools[0].strict);
  auto o = parse_responses_request(parse_body(R"({"input": "x", "text": {"format": {"type": "json_object"}}})"));
  EXPECT_EQ(o.chat.response_format.type, "json_object");
  EXPECT_EQ(o.echo["text"]["format"], ojson({{"type", "json_object"}}));
  auto t = parse_responses_request(parse_body(R"({"input": "x", "text": {}})"));
  EXPECT_EQ(t.chat.response_format.type, "text");
  EXPECT_EQ(t.echo["text"]["format"], ojson({{"type", "text"}}));
}

// Harmony tokens through the chat path's mapper into the builder: analysis -> reasoning item,
// final -> message item, a call -> function_call item; the events in the official order with
// consecutive sequence numbers.
TEST(ResponsesApi, ItemsAndEventsFromHarmony) {
  auto run = [](const std::string& text, FinishReason reason) {
    ChatOutputMapper mapper(tok());
    ResponseBuilder b({{"id", "resp_x"}, {"object", "response"}}, true);
    b.start();
    auto ids = tok().encode(text, true);
    for (auto t : ids) {
      ChatDelta d = mapper.push(t);
      if (!d.reasoning.empty()) b.count_reasoning_token();
      b.push(d);
    }
    b.push(mapper.finish());
    b.finish(reason, 10, int(ids.size()));
    return std::make_pair(b.response(), sse_events(b.take_events()));
  };
  auto [resp, evs] = run(
      "<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>Hi there<|return|>",
      FinishReason::kStop);
  EXPECT_EQ(resp["status"], "completed");
  ASSERT_EQ(resp["output"].size(), 2u);
  EXPECT_EQ(resp["output"][0]["type"], "reasoning");
  EXPECT_EQ(resp["output"][0]["content"][0]["text"], "Let me think.");
  EXPECT_EQ(resp["output"][1]["type"], "message");
  EXPECT_EQ(resp["output"][1]["content"][0]["text"], "Hi there");
  EXPECT_EQ(resp["output"][1]["status"], "completed");
  EXPECT_GT(resp["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
  EXPECT_EQ(resp["usage"]["total_tokens"], resp["usage"]["input_tokens"].get<int>() + resp["usage"]["output_tokens"].get<int>());
  for (size_t i = 0; i < evs.size(); ++i) EXPECT_EQ(evs[i]["sequence_number"], int(i));
  // The order, with the deltas collapsed.
  std::vector<std::string> order;
  for (auto& t : types_of(evs))
    if (order.empty() || order.back() != t) order.push_back(t);
  std::vector<std::string> want = {"response.created",           "response.in_progress",
                                   "response.output_item.added", "response.content_part.added",
                                   "response.reasoning_text.delta", "response.reasoning_text.done",
                                   "response.content_part.done", "response.output_item.done",
                                   "response.output_item.added", "response.content_part.added",
                                   "response.output_text.delta", "response.output_text.done",
                                   "response.content_part.done", "response.output_item.done",
                                   "response.completed"};
  EXPECT_EQ(order, want);
  std::string deltas;
  for (auto& e : evs)
    if (e["type"] == "response.output_text.delta") deltas += e["delta"].get<std::string>();
  EXPECT_EQ(deltas, "Hi there");
  EXPECT_EQ(json::parse(evs.back()["response"]["output"].dump()), json::parse(resp["output"].dump()));

  auto [call, cevs] = run(
      "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
      "<|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
      FinishReason::kStop);
  ASSERT_EQ(call["output"].size(), 2u);
  const auto& fc = call["output"][1];
  EXPECT_EQ(fc["type"], "function_call");
  EXPECT_EQ(fc["name"], "get_weather");
  EXPECT_EQ(fc["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(fc["call_id"].get<std::string>().rfind("call_", 0), 0u);
  bool args_done = false;
  for (auto& e : cevs)
    if (e["type"] == "response.function_call_arguments.done") {
      args_done = true;
      EXPECT_EQ(e["arguments"], "{\"city\":\"Paris\"}");
      EXPECT_EQ(e["item_id"].get<std::string>(), fc["id"].get<std::string>());
    }
  EXPECT_TRUE(args_done);

  auto [cut, kevs] = run("<|channel|>final<|message|>Hello wor", FinishReason::kLength);
  EXPECT_EQ(cut["status"], "incomplete");
  EXPECT_EQ(cut["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(kevs.back()["type"], "response.incomplete");
  EXPECT_EQ(cut["output"].back()["status"], "incomplete");
}

TEST(ResponsesApi, StoreKeepsResponsesInSqlite) {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("gptoss-store-" + std::to_string(getpid())) / "sub" / "responses.sqlite")
                         .string();
  {
    ResponseStore st(path);
    st.put("resp_1", {json{{"id", "resp_1"}, {"x", 1}}, ojson::array({{{"type", "message"}}})});
    EXPECT_FALSE(st.get("resp_2"));
  }
  ResponseStore again(path);  // a restarted server finds it
  auto r = again.get("resp_1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->response["x"], 1);
  EXPECT_EQ(r->items.size(), 1u);
  EXPECT_TRUE(again.remove("resp_1"));
  EXPECT_FALSE(again.remove("resp_1"));
  EXPECT_FALSE(again.get("resp_1"));
  std::filesystem::remove_all(std::filesystem::path(path).parent_path().parent_path());
  EXPECT_THROW(ResponseStore("/proc/nonexistent/dir/x.sqlite"), gptoss::Error);
}

// The route over a live server (fake backend: its text is not harmony, so it maps to a message).
TEST(ResponsesRoute, CreateStreamRetrieveDeleteContinue) {
  Fixture f;
  json first = f.ok("/v1/responses", {{"model", "test-model"}, {"input", "Hello!"}, {"max_output_tokens", 8},
                                      {"instructions", "Be brief."}, {"metadata", {{"k", "v"}}}});
  EXPECT_EQ(first["object"], "response");
  EXPECT_EQ(first["model"], "test-model");
  EXPECT_EQ(first["instructions"], "Be brief.");
  EXPECT_EQ(first["metadata"]["k"], "v");
  EXPECT_EQ(first["max_output_tokens"], 8);
  EXPECT_TRUE(first["status"] == "completed" || first["status"] == "incomplete") << first;
  ASSERT_FALSE(first["output"].empty());
  EXPECT_EQ(first["output"].back()["type"], "message");
  const json& u = first["usage"];
  EXPECT_LE(u["output_tokens"].get<int>(), 8);
  EXPECT_GT(u["input_tokens"].get<int>(), 0);
  EXPECT_TRUE(u["output_tokens_details"].contains("reasoning_tokens"));
  const std::string id = first["id"];
  EXPECT_EQ(id.rfind("resp_", 0), 0u);

  // GET returns the stored response, DELETE removes it.
  auto c = httplib::Client("127.0.0.1", f.port);
  auto got = c.Get(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body)["output"], first["output"]);
  // input_items is not implemented: said so, not "no response with id '<id>/input_items'".
  auto items = c.Get(("/v1/responses/" + id + "/input_items").c_str());
  ASSERT_TRUE(items);
  EXPECT_EQ(items->status, 404);
  EXPECT_EQ(json::parse(items->body)["error"]["code"], "not_implemented") << items->body;
  // A function_call_output that answers no call is named as the Responses API names it.
  auto orphan = c.Post("/v1/responses",
                       json{{"input", {{{"type", "function_call_output"}, {"call_id", "x"}, {"output", "y"}}}}}.dump(),
                       "application/json");
  ASSERT_TRUE(orphan);
  EXPECT_EQ(orphan->status, 400);
  EXPECT_EQ(json::parse(orphan->body)["error"]["param"], "input") << orphan->body;

  // previous_response_id: the earlier turn is part of the prompt (more input tokens than the
  // first turn's whole conversation), and the instructions are not carried over.
  json second = f.ok("/v1/responses", {{"input", "And again?"}, {"previous_response_id", id}, {"max_output_tokens", 4}});
  EXPECT_EQ(second["previous_response_id"], id);
  EXPECT_TRUE(second["instructions"].is_null());
  json alone = f.ok("/v1/responses", {{"input", "And again?"}, {"max_output_tokens", 4}, {"store", false}});
  EXPECT_GT(second["usage"]["input_tokens"].get<int>(),
            alone["usage"]["input_tokens"].get<int>() + first["usage"]["output_tokens"].get<int>() - 1);
  // store: false keeps nothing
  auto none = c.Get(("/v1/responses/" + alone["id"].get<std::string>()).c_str());
  EXPECT_EQ(none->status, 404);

  auto del = c.Delete(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 200);
  EXPECT_EQ(json::parse(del->body)["deleted"], true);
  EXPECT_EQ(c.Get(("/v1/responses/" + id).c_str())->status, 404);
  EXPECT_EQ(c.Delete(("/v1/responses/" + id).c_str())->status, 404);
  expect_error(f, "/v1/responses", {{"input", "x"}, {"previous_response_id", id}}, 404, "previous_response_id",
               "previous_response_not_found");

  // Streaming: the official sequence, numbered from 0, ending in the finished response.
  json body = {{"input", "Tell me a story"}, {"max_output_tokens", 6}, {"stream", true}};
  std::string raw;
  int status = 0;
  f.post("/v1/responses", body, &status, &raw);
  EXPECT_EQ(status, 200);
  auto evs = sse_events(raw);
  ASSERT_GE(evs.size(), 4u) << raw;
  for (size_t i = 0; i < evs.size(); ++i) EXPECT_EQ(evs[i]["sequence_number"], int(i));
  EXPECT_EQ(evs[0]["type"], "response.created");
  EXPECT_EQ(evs[0]["response"]["status"], "in_progress");
  EXPECT_EQ(evs[1]["type"], "response.in_progress");
  const json& last = evs.back();
  EXPECT_TRUE(last["type"] == "response.completed" || last["type"] == "response.incomplete") << last;
  std::string text;
  for (auto& e : evs)
    if (e["type"] == "response.output_text.delta") text += e["delta"].get<std::string>();
  ASSERT_FALSE(last["response"]["output"].empty());
  EXPECT_EQ(text, last["response"]["output"].back()["content"][0]["text"]);
  auto streamed = c.Get(("/v1/responses/" + last["response"]["id"].get<std::string>()).c_str());
  EXPECT_EQ(streamed->status, 200);

  // Errors name their field.
  expect_error(f, "/v1/responses", {{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}}}}}}, 400,
               "text.format.name", "missing_required_parameter");
  expect_error(f, "/v1/responses", {{"input", "x"}, {"max_output_tokens", 100000}}, 400, "max_output_tokens",
               "context_length_exceeded");
  expect_error(f, "/v1/responses", {{"input", "x"}, {"frequency_penalty", 1}}, 400, "frequency_penalty",
               "unsupported_value");
  int st404 = 0;
  f.post("/v1/responses", {{"input", "x"}, {"model", "other"}}, &st404);
  EXPECT_EQ(st404, 404);
}

// ---------------------------------------------------------------------------- text.format
namespace {

// (The Responses API has no seed: each request samples afresh at temperature 1.)
json format_body(const json& format, int max_output_tokens, bool stream) {
  return {{"model", "test-model"}, {"input", "Answer in JSON."}, {"max_output_tokens", max_output_tokens},
          {"temperature", 1.0}, {"stream", stream}, {"text", {{"format", format}}}};
}

json schema_format(const json& schema, bool strict = true) {
  return {{"type", "json_schema"}, {"name", "answer"}, {"strict", strict}, {"schema", schema}};
}

// A response (streamed or not) as the final response object; for a stream, also checks that the
// output_text deltas add up to the message's text.
json run_response(Fixture& f, const json& body) {
  int status = 0;
  std::string raw;
  json j = f.post("/v1/responses", body, &status, &raw);
  EXPECT_EQ(status, 200) << raw;
  if (!body.value("stream", false)) return j;
  auto evs = sse_events(raw);
  if (evs.empty()) return nullptr;
  std::string text;
  for (auto& e : evs)
    if (e["type"] == "response.output_text.delta") text += e["delta"].get<std::string>();
  json resp = evs.back()["response"];
  if (!resp["output"].empty() && resp["output"].back()["type"] == "message") {
    EXPECT_EQ(text, resp["output"].back()["content"][0]["text"]);
  }
  return resp;
}

std::string message_text(const json& resp) {
  for (const auto& item : resp["output"])
    if (item["type"] == "message") return item["content"][0]["text"];
  return "";
}

}  // namespace

// A model that does not write harmony (the fake's random tokens, like random weights): the whole
// answer is constrained by text.format, and must be JSON valid under the schema for every run,
// streamed or not; the stored response repeats its text.format.
TEST(ResponsesRoute, TextFormatJsonSchemaIsValidForEveryRun) {
  ServerOptions so;
  so.harmony_output = false;
  gptoss::EngineConfig ec;
  Fixture f(ec, so, 2048);
  const std::vector<json> schemas = {
      json::parse(R"({"type":"object","properties":{"kind":{"enum":["cat","dog"]},"legs":{"type":"integer"},
                     "ok":{"type":"boolean"},"born":{"type":"string","format":"date"}},
                     "required":["kind","legs","ok","born"],"additionalProperties":false})"),
      json::parse(R"({"type":"object","properties":{"points":{"type":"array","items":{"type":"object",
                     "properties":{"x":{"type":"number"},"y":{"type":["integer","null"]}},"required":["x","y"],
                     "additionalProperties":false},"minItems":1,"maxItems":3}},"required":["points"],
                     "additionalProperties":false})"),
  };
  auto c = httplib::Client("127.0.0.1", f.port);
  for (size_t i = 0; i < schemas.size(); ++i) {
    for (uint64_t run = 1; run <= 6; ++run) {
      json body = format_body(schema_format(schemas[i]), 400, run % 2 == 0);
      body["metadata"] = {{"run", std::to_string(run)}};
      json resp = run_response(f, body);
      ASSERT_TRUE(resp.is_object());
      ASSERT_EQ(resp["status"], "completed") << "schema " << i << " run " << run << ": " << resp;
      std::string text = message_text(resp);
      json v;
      ASSERT_NO_THROW(v = json::parse(text)) << "schema " << i << " run " << run << ": " << text;
      EXPECT_TRUE(gptoss::testing::schema_valid(schemas[i], v)) << "schema " << i << " run " << run << ": " << text;
      EXPECT_EQ(resp["text"]["format"]["name"], "answer");
      EXPECT_EQ(resp["text"]["format"]["schema"], schemas[i]);
      // store: the retrieved response keeps the format and the constrained text.
      auto got = c.Get(("/v1/responses/" + resp["id"].get<std::string>()).c_str());
      ASSERT_TRUE(got);
      ASSERT_EQ(got->status, 200);
      json stored = json::parse(got->body);
      EXPECT_EQ(stored["text"]["format"], resp["text"]["format"]);
      EXPECT_EQ(message_text(stored), text);
    }
  }
  // json_object starts an object (its keys are free strings, so a random model rarely ends one).
  json obj = run_response(f, format_body({{"type", "json_object"}}, 24, false));
  std::string text = message_text(obj);
  ASSERT_FALSE(text.empty()) << obj;
  EXPECT_EQ(text[0], '{') << text;
  if (obj["status"] == "completed") {
    EXPECT_TRUE(json::parse(text).is_object()) << text;
  }
  EXPECT_EQ(obj["text"]["format"]["type"], "json_object");
  // "text" leaves the output alone.
  json plain = run_response(f, format_body({{"type", "text"}}, 8, false));
  EXPECT_EQ(plain["status"], "incomplete");
  EXPECT_FALSE(json::accept(message_text(plain))) << plain;
}

// Bad schemas are 400s naming text.format, the chat path's compiler saying what is wrong.
TEST(ResponsesRoute, TextFormatRefusesBadSchemas) {
  Fixture f;
  auto post = [&](const json& fmt) { return format_body(fmt, 4, false); };
  expect_error(f, "/v1/responses", post(schema_format(json::parse(R"({"type":"strin"})"))), 400, "text.format",
               "invalid_schema");
  expect_error(f, "/v1/responses", post(schema_format(json::parse(R"({"type":"string","pattern":"^a"})"))), 400,
               "text.format", "invalid_schema");
  int status = 0;
  std::string raw;
  f.post("/v1/responses",
         post(schema_format(json::parse(R"({"type":"object","properties":{"a":{"type":"integer","minimum":1}}})"))),
         &status, &raw);
  EXPECT_EQ(status, 400);
  EXPECT_NE(raw.find("minimum at /properties/a"), std::string::npos) << raw;
  // Not strict: unsupported keywords are ignored (the output is looser), malformed ones are not.
  f.ok("/v1/responses", post(schema_format(json::parse(R"({"type":"string","pattern":"^a"})"), false)));
  expect_error(f, "/v1/responses", post(schema_format(json::parse(R"({"type":"array","minItems":-1})"), false)), 400,
               "text.format", "invalid_schema");
  expect_error(f, "/v1/responses", post({{"type", "yaml"}}), 400, "text.format.type", "invalid_value");
  // A tool's parameters are compiled too.
  json b = post({{"type", "text"}});
  b["tools"] = json::parse(R"([{"type":"function","name":"f","parameters":{"type":"object",
                             "properties":{"a":{"type":"nope"}}}}])");
  expect_error(f, "/v1/responses", b, 400, "tools", "invalid_schema");
}

// A scripted model that writes harmony: the reasoning item stays free text while the message
// (the final channel, where the script says "Sure") is constrained to the schema; a function
// call's arguments follow the tool's parameters. Streamed and not.
TEST(ResponsesRoute, TextFormatOnlyInTheFinalChannelAndToolArguments) {
  const json schema = json::parse(R"({"type":"object","properties":{"kind":{"enum":["cat","dog"]},
      "n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["kind","n","ok"],"additionalProperties":false})");
  const json params = json::parse(R"({"type":"object","properties":{"unit":{"enum":["c","f"]},
      "days":{"type":"integer"}},"required":["unit","days"],"additionalProperties":false})");
  Fixture f;  // harmony_output: true
  for (int tool = 0; tool < 2; ++tool) {
    json body = format_body(schema_format(schema), 300, false);
    body["tools"] = json::array({{{"type", "function"}, {"name", "get_weather"}, {"parameters", params}}});
    gptoss::harmony::Renderer ren(tok());
    const size_t prompt_len = render_chat_prompt(ren, parse_responses_request(parse_body(body.dump())).chat).size();
    const std::string script_text =
        tool ? "<|channel|>analysis<|message|>Need {weather} first.<|end|><|start|>assistant to=functions.get_weather"
               "<|channel|>commentary <|constrain|>json<|message|>Sure"
             : "<|channel|>analysis<|message|>I think {not json} here.<|end|><|start|>assistant<|channel|>final"
               "<|message|>Sure";
    const std::vector<int32_t> script = tok().encode(script_text, true);
    f.backend.shape_logits = gptoss::testing::FakeBackend::scripted(script, prompt_len);
    for (uint64_t run = 1; run <= 4; ++run) {
      body["stream"] = run % 2 == 0;
      json resp = run_response(f, body);
      ASSERT_TRUE(resp.is_object());
      ASSERT_GE(resp["output"].size(), 2u) << resp;
      EXPECT_EQ(resp["output"][0]["type"], "reasoning") << resp;
      const json& last = resp["output"].back();
      if (tool) {
        EXPECT_EQ(resp["output"][0]["content"][0]["text"], "Need {weather} first.") << resp;
        ASSERT_EQ(last["type"], "function_call") << resp;
        EXPECT_EQ(last["name"], "get_weather");
        json args;
        ASSERT_NO_THROW(args = json::parse(last["arguments"].get<std::string>())) << resp;
        EXPECT_TRUE(gptoss::testing::schema_valid(params, args)) << resp;
      } else {
        EXPECT_EQ(resp["output"][0]["content"][0]["text"], "I think {not json} here.") << resp;
        ASSERT_EQ(resp["status"], "completed") << resp;
        ASSERT_EQ(last["type"], "message") << resp;
        json v;
        ASSERT_NO_THROW(v = json::parse(message_text(resp))) << resp;
        EXPECT_TRUE(gptoss::testing::schema_valid(schema, v)) << resp;
      }
    }
  }
}
