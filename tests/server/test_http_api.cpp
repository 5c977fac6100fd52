// The OpenAI API over a live server (fake backend, real tokenizer): every request field honoured
// or refused, harmony specials in text prompts, completions logprobs (text_offset in characters,
// echo with the prompt's logprobs), streamed chat logprobs riding with their text, /tokenize and
// /detokenize as vLLM has them, unformatted chat output streamed from its first tokens.
#include "http_fixture.h"

using namespace httptest;
using gptoss::TokenId;

namespace {

json chat(int max_tokens) {
  return {{"model", "test-model"},
          {"messages", json::array({{{"role", "user"}, {"content", "Hello!"}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

TEST(HttpApi, LogitBiasSteersSampling) {
  Fixture f;
  std::vector<TokenId> cat = tok().encode(" cat");
  ASSERT_EQ(cat.size(), 1u);
  const std::string id = std::to_string(cat[0]);
  // Greedy and sampled alike: a +100 bias makes the token win every step (logits are in [-4, 4]).
  for (double temperature : {0.0, 1.0}) {
    json j = f.ok("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 5}, {"temperature", temperature},
                                      {"seed", 3}, {"logit_bias", {{id, 100}}}});
    EXPECT_EQ(j["choices"][0]["text"], " cat cat cat cat cat") << temperature;
  }
  json c = f.ok("/v1/chat/completions", [&] {
    json b = chat(4);
    b["logit_bias"] = {{id, 100}};
    return b;
  }());
  EXPECT_EQ(c["choices"][0]["message"]["content"], " cat cat cat cat");
  // -100 bans the greedy choice.
  json plain = f.ok("/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 1}, {"temperature", 0}});
  std::vector<TokenId> first = tok().encode(plain["choices"][0]["text"].get<std::string>());
  if (first.size() == 1) {
    json banned = f.ok("/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 1}, {"temperature", 0},
                                           {"logit_bias", {{std::to_string(first[0]), -100}}}});
    EXPECT_NE(banned["choices"][0]["text"], plain["choices"][0]["text"]);
  }
  expect_error(f, "/v1/completions", {{"prompt", "x"}, {"logit_bias", {{"300000", 1}}}}, 400, "logit_bias", "invalid_value");
}

TEST(HttpApi, ReasoningObjectSetsTheEffort) {
  Fixture f;
  json b = chat(2);
  b["reasoning"] = {{"effort", "high"}};
  json t = f.ok("/tokenize", {{"messages", b["messages"]}, {"reasoning", b["reasoning"]}});
  std::vector<TokenId> ids = t["tokens"].get<std::vector<TokenId>>();
  EXPECT_NE(tok().decode(ids).find("Reasoning: high"), std::string::npos) << tok().decode(ids);
  json r = f.ok("/v1/chat/completions", b);
  EXPECT_EQ(r["usage"]["prompt_tokens"], t["count"]);
  json plain = f.ok("/tokenize", {{"messages", b["messages"]}, {"reasoning_effort", "high"}});
  EXPECT_EQ(plain["tokens"], t["tokens"]);
}

TEST(HttpApi, UnsupportedFieldsAreRefusedByName) {
  Fixture f;
  auto with = [](json b, const char* k, json v) {
    b[k] = std::move(v);
    return b;
  };
  const json c = chat(2);
  // response_format is honoured (structured output); keys it does not know are refused by name.
  f.ok("/v1/chat/completions", with(c, "response_format", {{"type", "json_object"}}));
  expect_error(f, "/v1/chat/completions",
               with(c, "response_format",
                    {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", json::object()}, {"foo", 1}}}}),
               400, "response_format.json_schema.foo", "unsupported_value");
  expect_error(f, "/v1/chat/completions", with(c, "response_format", {{"type", "bogus"}}), 400, "response_format");
  expect_error(f, "/v1/chat/completions", with(c, "functions", json::array({{{"name", "f"}}})), 400, "functions",
               "unsupported_value");
  expect_error(f, "/v1/chat/completions", with(c, "function_call", "auto"), 400, "function_call", "unsupported_value");
  expect_error(f, "/v1/chat/completions", with(c, "repetition_penalty", 1.1), 400, "repetition_penalty",
               "unsupported_value");
  expect_error(f, "/v1/chat/completions", with(c, "no_such_field", 1), 400, "no_such_field", "unsupported_value");
  const json p = {{"prompt", "x"}, {"max_tokens", 2}};
  expect_error(f, "/v1/completions", with(p, "best_of", 2), 400, "best_of", "unsupported_value");
  expect_error(f, "/v1/completions", with(p, "suffix", "y"), 400, "suffix", "unsupported_value");
  // A completion's response_format is honoured (its whole text), its keys checked as chat's.
  f.ok("/v1/completions", with(p, "response_format", {{"type", "text"}}));
  expect_error(f, "/v1/completions", with(p, "response_format", {{"type", "bogus"}}), 400, "response_format");
  // Harmless known fields are accepted.
  f.ok("/v1/chat/completions", with(with(with(c, "user", "u1"), "n", 1), "metadata", {{"k", "v"}}));
  f.ok("/v1/chat/completions", with(with(c, "response_format", {{"type", "text"}}), "parallel_tool_calls", false));
  f.ok("/v1/completions", with(with(p, "best_of", 1), "user", "u1"));
}

TEST(HttpApi, CompletionsParseHarmonySpecialTokens) {
  Fixture f;
  const std::string prompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant";
  json j = f.ok("/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}});
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);  // <|start|> user <|message|> Hi <|end|> <|start|> assistant
  json t = f.ok("/tokenize", {{"prompt", prompt}, {"return_token_strs", true}});
  EXPECT_EQ(t["count"], 7);
  EXPECT_EQ(t["token_strs"], json({"<|start|>", "user", "<|message|>", "Hi", "<|end|>", "<|start|>", "assistant"}));
}

TEST(HttpApi, CompletionsLogprobsEchoAndCharacterOffsets) {
  Fixture f;
  const std::string prompt = "Grüße aus Köln und München, schön";
  const std::vector<TokenId> ids = tok().encode(prompt);
  const size_t P = ids.size();
  ASSERT_GT(P, 5u);
  json body = {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 3}, {"echo", true}};
  json j = f.ok("/v1/completions", body);
  const json& ch = j["choices"][0];
  const json& lp = ch["logprobs"];
  const size_t n = lp["tokens"].size();
  ASSERT_EQ(n, P + j["usage"]["completion_tokens"].get<size_t>()) << lp.dump();
  EXPECT_EQ(ch["text"].get<std::string>().substr(0, prompt.size()), prompt);
  // The first prompt token has no logprob; the others do.
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < n; ++i) {
    ASSERT_TRUE(lp["token_logprobs"][i].is_number()) << i;
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 3u);
  }
  // text_offset counts characters: each prompt token starts where the text before it ends.
  std::string before;
  for (size_t i = 0; i < P; ++i) {
    EXPECT_EQ(lp["tokens"][i], tok().decode(std::vector<TokenId>{ids[i]}));
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), code_points(before)) << i;
    before += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(lp["text_offset"][P].get<size_t>(), code_points(prompt));
  // A prompt token's top logprobs are those the model gives after the tokens before it.
  for (size_t k = 1; k < P; k += 3) {
    json one = f.ok("/v1/completions", {{"prompt", std::vector<TokenId>(ids.begin(), ids.begin() + k)},
                                        {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 3}});
    EXPECT_EQ(lp["top_logprobs"][k], one["choices"][0]["logprobs"]["top_logprobs"][0]) << k;
  }
  // Streamed: the echo chunk carries the prompt's logprobs; the whole equals the answer above.
  bool done = false;
  json tokens = json::array(), offsets = json::array(), values = json::array();
  std::string text;
  for (const json& e : f.stream("/v1/completions", body, &done)) {
    if (e["choices"].empty()) continue;
    text += e["choices"][0]["text"].get<std::string>();
    const json& l = e["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (size_t i = 0; i < l["tokens"].size(); ++i) {
      tokens.push_back(l["tokens"][i]);
      offsets.push_back(l["text_offset"][i]);
      values.push_back(l["token_logprobs"][i]);
    }
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(text, ch["text"]);
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(offsets, lp["text_offset"]);
  EXPECT_EQ(values, lp["token_logprobs"]);
  // Without echo the offsets count from the start of the completion.
  body["echo"] = false;
  json ne = f.ok("/v1/completions", body);
  EXPECT_EQ(ne["choices"][0]["logprobs"]["text_offset"][0], 0);
  EXPECT_EQ(ne["choices"][0]["logprobs"]["tokens"].size(), j["usage"]["completion_tokens"]);
}

TEST(HttpApi, StreamedChatLogprobsRideWithTheirText) {
  Fixture f;
  json b = chat(40);
  b["logprobs"] = true;
  b["top_logprobs"] = 1;
  b["ignore_eos"] = true;
  json plain = f.ok("/v1/chat/completions", b);
  b["stream_options"] = {{"include_usage", true}};
  bool done = false;
  json all = json::array();
  std::string content;
  int usage_tokens = -1;
  for (const json& e : f.stream("/v1/chat/completions", b, &done)) {
    if (e.contains("usage") && e["usage"].is_object()) usage_tokens = e["usage"]["completion_tokens"];
    if (e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    const json& d = c["delta"];
    const bool has_text = (d.contains("content") && !d["content"].get<std::string>().empty()) ||
                          d.contains("reasoning_content") || d.contains("tool_calls");
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (c["logprobs"].is_null()) continue;
    EXPECT_TRUE(has_text || !c["finish_reason"].is_null()) << "logprobs without text: " << e.dump();
    for (const json& x : c["logprobs"]["content"]) all.push_back(x);
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(int(all.size()), usage_tokens);
  EXPECT_EQ(all, plain["choices"][0]["logprobs"]["content"]);
  EXPECT_EQ(content, plain["choices"][0]["message"]["content"]);

  // The same for completions, whose text the engine holds back at a cut UTF-8 character.
  json cb = {{"prompt", {1, 2, 3}}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 1}, {"ignore_eos", true}};
  json cplain = f.ok("/v1/completions", cb);
  json ctokens = json::array();
  for (const json& e : f.stream("/v1/completions", cb, &done)) {
    if (e["choices"].empty() || e["choices"][0]["logprobs"].is_null()) continue;
    const json& c = e["choices"][0];
    EXPECT_TRUE(!c["text"].get<std::string>().empty() || !c["finish_reason"].is_null()) << "logprobs without text: " << e.dump();
    for (const json& t : c["logprobs"]["tokens"]) ctokens.push_back(t);
  }
  EXPECT_EQ(ctokens, cplain["choices"][0]["logprobs"]["tokens"]);
}

// Output that is not harmony (the fake model's, like the built-in random model's) streams from
// its first tokens instead of after a 48-token header.
TEST(HttpApi, UnformattedChatStreamsAtOnce) {
  Fixture f;
  json b = chat(60);
  b["ignore_eos"] = true;
  b["stream_options"] = {{"continuous_usage_stats", true}};
  bool done = false;
  int first_text_after = -1;
  for (const json& e : f.stream("/v1/chat/completions", b, &done)) {
    if (e["choices"].empty()) continue;
    const json& d = e["choices"][0]["delta"];
    if (first_text_after < 0 && d.contains("content") && !d["content"].get<std::string>().empty() && e.contains("usage"))
      first_text_after = e["usage"]["completion_tokens"];
  }
  EXPECT_TRUE(done);
  EXPECT_GE(first_text_after, 1);
  EXPECT_LE(first_text_after, 4);
}

TEST(HttpApi, TokenizeAndDetokenizeAsVllm) {
  Fixture f;
  json t = f.ok("/tokenize", {{"prompt", "Hello world"}});
  EXPECT_EQ(t["count"], 2);
  EXPECT_EQ(t["max_model_len"], 512);
  EXPECT_TRUE(t["token_strs"].is_null());
  json s = f.ok("/tokenize", {{"prompt", "Hello world"}, {"return_token_strs", true}, {"add_special_tokens", true}});
  EXPECT_EQ(s["token_strs"], json({"Hello", "\xC4\xA0world"}));  // "Ġworld", as convert_ids_to_tokens spells it
  json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
  json gen = f.ok("/tokenize", {{"model", "test-model"}, {"messages", msgs}});
  json nogen = f.ok("/tokenize", {{"messages", msgs}, {"add_generation_prompt", false}});
  std::vector<TokenId> g = gen["tokens"], n = nogen["tokens"];
  ASSERT_EQ(g.size(), n.size() + 2);
  EXPECT_EQ(std::vector<TokenId>(g.begin(), g.begin() + n.size()), n);
  EXPECT_EQ(tok().decode(std::vector<TokenId>(g.end() - 2, g.end())), "<|start|>assistant");
  json d = f.ok("/detokenize", {{"model", "test-model"}, {"tokens", t["tokens"]}});
  EXPECT_EQ(d["prompt"], "Hello world");
  expect_error(f, "/detokenize", {{"tokens", {1, 999999}}}, 400, "tokens");
  expect_error(f, "/tokenize", {{"prompt", "x"}, {"max_tokens", 3}}, 400, "max_tokens", "unsupported_value");
  int status = 0;
  f.post("/tokenize", {{"prompt", "x"}, {"model", "other"}}, &status);
  EXPECT_EQ(status, 404);
}
