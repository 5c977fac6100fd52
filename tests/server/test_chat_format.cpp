// The harmony output parser mapped to content / reasoning / tool_calls, on canned token streams.
#include <gtest/gtest.h>

#include "server/chat_format.h"

using namespace gptoss;
using namespace gptoss::server;

namespace {
const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::o200k_harmony();
  return t;
}

struct Mapped {
  ChatDelta streamed;
  std::string content, reasoning;
  std::vector<ToolCall> calls;
};

Mapped run(const std::string& text_with_specials) {
  std::vector<TokenId> ids = tok().encode(text_with_specials, true);
  ChatOutputMapper m(tok());
  Mapped out;
  for (TokenId t : ids) out.streamed.append(m.push(t));
  out.streamed.append(m.finish());
  out.content = m.content();
  out.reasoning = m.reasoning();
  out.calls = m.tool_calls();
  return out;
}
}  // namespace

TEST(ChatFormat, ReasoningThenFinal) {
  auto r = run("<|channel|>analysis<|message|>User says hi. Reply politely.<|end|>"
               "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>");
  EXPECT_EQ(r.reasoning, "User says hi. Reply politely.");
  EXPECT_EQ(r.content, "Hello! How can I help?");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.streamed.reasoning, r.reasoning);
  EXPECT_EQ(r.streamed.content, r.content);
}

TEST(ChatFormat, ToolCall) {
  auto r = run("<|channel|>analysis<|message|>Need weather.<|end|>"
               "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
               "{\"city\":\"Paris\"}<|call|>");
  EXPECT_EQ(r.reasoning, "Need weather.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(r.calls[0].id.rfind("call_", 0), 0u);
  ASSERT_EQ(r.streamed.tool_calls.size(), 1u);
  EXPECT_EQ(r.streamed.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.streamed.tool_calls[0].id, r.calls[0].id);
  EXPECT_EQ(r.streamed.tool_calls[0].arguments, r.calls[0].arguments);
}

TEST(ChatFormat, RecipientBeforeChannel) {
  auto r = run(" to=functions.lookup<|channel|>commentary <|constrain|>json<|message|>{\"q\":1}<|call|>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "lookup");
  EXPECT_EQ(r.calls[0].arguments, "{\"q\":1}");
}

TEST(ChatFormat, TwoToolCallsAndPreamble) {
  auto r = run("<|channel|>commentary<|message|>Checking both.<|end|>"
               "<|start|>assistant<|channel|>commentary to=functions.a <|constrain|>json<|message|>{}<|call|>"
               "<|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"x\":2}<|call|>");
  EXPECT_EQ(r.content, "Checking both.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, "{\"x\":2}");
  ASSERT_EQ(r.streamed.tool_calls.size(), 2u);
  EXPECT_EQ(r.streamed.tool_calls[1].index, 1);
}

TEST(ChatFormat, TruncatedByLength) {
  auto r = run("<|channel|>final<|message|>Partial answ");
  EXPECT_EQ(r.content, "Partial answ");
  // A model that writes no harmony at all still answers its words, even ones a header could hold.
  for (const char* plain : {"analysis", "final answer", "commentary"}) EXPECT_EQ(run(plain).content, plain) << plain;
  // Cut inside or right after a header (max_tokens 2 or 3): nothing said, not the header's words
  // as content.
  for (const char* cut : {"<|channel|>analysis<|message|>", "<|channel|>final<|message|>", "<|channel|>analysis",
                          "<|channel|>commentary to=functions.get"}) {
    auto h = run(cut);
    EXPECT_EQ(h.content, "") << cut;
    EXPECT_EQ(h.reasoning, "") << cut;
    EXPECT_EQ(h.streamed.content, "") << cut;
  }
}

TEST(ChatFormat, GarbageNeverThrows) {
  // Random ids, specials in odd places, ids the tokenizer has never heard of.
  uint64_t s = 99;
  for (int trial = 0; trial < 30; ++trial) {
    ChatOutputMapper m(tok());
    for (int i = 0; i < 60; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      int32_t t = int32_t((s >> 33) % 201100);
      if (i % 7 == 3) t = tok().require_token_id(i % 2 ? "<|start|>" : "<|message|>");
      if (i == 50) t = 250000;
      EXPECT_NO_THROW(m.push(t));
    }
    EXPECT_NO_THROW(m.finish());
  }
  // Plain text without any header still comes back as content.
  auto r = run("Hello world, no header here.");
  EXPECT_FALSE(r.content.empty());
}

TEST(ChatFormat, ConversationRendering) {
  ChatRequest r = parse_chat_request(parse_body(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "reasoning_content": "Call the tool.",
       "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_9", "content": "{\"temp\": 20}"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "reasoning_effort": "low"})"));
  harmony::Conversation c = build_conversation(r);
  std::string text = harmony::render_text_for_completion(c);
  EXPECT_NE(text.find("Reasoning: low"), std::string::npos) << text;
  EXPECT_NE(text.find("Be brief."), std::string::npos);
  EXPECT_NE(text.find("get_weather"), std::string::npos);
  EXPECT_NE(text.find("to=functions.get_weather"), std::string::npos);
  EXPECT_NE(text.find("<|start|>functions.get_weather to=assistant"), std::string::npos) << text;
  EXPECT_NE(text.find("{\"temp\": 20}"), std::string::npos);
  EXPECT_EQ(text.substr(text.size() - 18), "<|start|>assistant") << text;
  harmony::Renderer ren(tok());
  auto ids = render_chat_prompt(ren, r);
  EXPECT_EQ(tok().decode_bytes(ids), text);
}

TEST(ChatFormat, UnformattedOutputStillStreams) {
  std::string text;
  for (int i = 0; i < 80; ++i) text += " word" + std::to_string(i);
  std::vector<TokenId> ids = tok().encode(text, false);
  ChatOutputMapper m(tok());
  ChatDelta before_finish;
  for (TokenId t : ids) before_finish.append(m.push(t));
  EXPECT_FALSE(before_finish.content.empty());  // streamed before the end
  ChatDelta all = before_finish;
  all.append(m.finish());
  EXPECT_EQ(all.content, text);
  EXPECT_EQ(m.content(), text);
}

TEST(ChatFormat, StopMatcher) {
  StopMatcher m({"STOP", "xyz"});
  std::string out;
  out += m.feed("hello S");
  EXPECT_EQ(out, "hello ");  // "S" held back
  out += m.feed("T");
  out += m.feed("x");  // "ST" released ("STx" cannot become STOP); "x" may begin "xyz"
  EXPECT_EQ(out, "hello ST");
  out += m.feed("y and more STO");
  EXPECT_FALSE(m.matched());
  out += m.feed("P trailing");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_stop(), "STOP");
  EXPECT_EQ(out, "hello STxy and more ");
  EXPECT_EQ(m.feed("anything"), "");
  StopMatcher n({"ab"});
  EXPECT_EQ(n.feed("xa"), "x");
  EXPECT_EQ(n.flush(), "a");
  StopMatcher none({});
  EXPECT_EQ(none.feed("abc"), "abc");
}

// The whole function-calling round trip of openai/harmony's format guide, byte for byte: what
// the server renders from a Chat Completions request.
TEST(ChatFormat, FunctionCallingRoundTripMatchesFormatGuide) {
  ChatRequest r = parse_chat_request(parse_body(R"({
    "reasoning_effort": "high",
    "messages": [
      {"role": "system", "content": "Always respond in riddles"},
      {"role": "user", "content": [{"type": "text", "text": "What is the weather like in SF?"}]},
      {"role": "assistant", "reasoning_content": "Need to use function get_weather.",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
                       "arguments": "{\"location\":\"San Francisco\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"sunny\": true, \"temperature\": 20}"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather",
      "description": "Gets the current weather in the provided location.",
      "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
        "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
        "required": ["location"]}}}]})"));
  harmony::Conversation c = build_conversation(r);
  const std::string expected =
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
      "Knowledge cutoff: 2024-06\n\nReasoning: high\n\n"
      "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
      "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
      "<|start|>developer<|message|># Instructions\n\nAlways respond in riddles\n\n# Tools\n\n"
      "## functions\n\nnamespace functions {\n\n"
      "// Gets the current weather in the provided location.\ntype get_weather = (_: {\n"
      "// The city and state, e.g. San Francisco, CA\nlocation: string,\n"
      "format?: \"celsius\" | \"fahrenheit\", // default: celsius\n}) => any;\n\n"
      "} // namespace functions<|end|>"
      "<|start|>user<|message|>What is the weather like in SF?<|end|>"
      "<|start|>assistant<|channel|>analysis<|message|>Need to use function get_weather.<|end|>"
      "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
      "<|message|>{\"location\":\"San Francisco\"}<|call|>"
      "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
      "{\"sunny\": true, \"temperature\": 20}<|end|><|start|>assistant";
  EXPECT_EQ(harmony::render_text_for_completion(c), expected);
  harmony::Renderer ren(tok());
  EXPECT_EQ(render_chat_prompt(ren, r), tok().encode(expected, true));
}

// Earlier reasoning is dropped once a final answer follows it; tool_choice "none" hides tools.
TEST(ChatFormat, SecondTurnDropsAnalysisAndHidesToolsOnNone) {
  ChatRequest r = parse_chat_request(parse_body(R"({"messages": [
      {"role": "user", "content": "What is 2 + 2?"},
      {"role": "assistant", "reasoning_content": "Simple.", "content": "4"},
      {"role": "user", "content": "And 3 + 3?"}],
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"})"));
  EXPECT_EQ(harmony::render_text_for_completion(build_conversation(r)),
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
            "OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: "
            "analysis, commentary, final. Channel must be included for every message.<|end|>"
            "<|start|>user<|message|>What is 2 + 2?<|end|>"
            "<|start|>assistant<|channel|>final<|message|>4<|end|>"
            "<|start|>user<|message|>And 3 + 3?<|end|><|start|>assistant");
}

// Issue 17 item 9: text that cannot be a harmony header (a random model's) streams from its
// first token instead of after kMaxHeaderTokens tokens.
TEST(ChatFormat, UnformattedOutputStreamsFromTheFirstTokens) {
  for (std::string text : {"Hello there, how are you today?", " word0 word1 word2 word3 word4",
                           "<|channel|>random junk that is no channel name at all", "<|start|>assistant and more words follow here"}) {
    std::vector<TokenId> ids = tok().encode(text, true);
    ASSERT_GT(ids.size(), 4u);
    ChatOutputMapper m(tok());
    std::string streamed;
    size_t first_text_at = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      streamed += m.push(ids[i]).content;
      if (streamed.empty()) first_text_at = i + 1;
    }
    EXPECT_LE(first_text_at, 4u) << text;  // within a few tokens (was 48)
    streamed += m.finish().content;
    EXPECT_FALSE(streamed.empty()) << text;
  }
}

TEST(ChatFormat, PlausibleHeaders) {
  for (const char* h : {"", "<|channel|>", "<|channel|>analysis", "<|channel|>final",
                        "<|channel|>commentary to=functions.get_weather <|constrain|>json",
                        "<|channel|>commentary to=functions.get_weather json", " to", " to=functions.x<|channel|>commentary json",
                        "<|channel|>commentary to=functions.x", "<|channel|>commentary "})
    EXPECT_TRUE(ChatOutputMapper::plausible_header(h, true)) << h;
  for (const char* h : {"Hello", " word0 word1", "<|channel|>analysis<|channel|>final", "<|channel|>final, and",
                        "\n", "<|channel|>commentary json to=functions.x extra"})
    EXPECT_FALSE(ChatOutputMapper::plausible_header(h, true)) << h;
  EXPECT_TRUE(ChatOutputMapper::plausible_header("assistant<|channel|>final", false));
  EXPECT_TRUE(ChatOutputMapper::plausible_header("assi", false));
  EXPECT_FALSE(ChatOutputMapper::plausible_header("user", false));
  // Real headers still parse after the check: a tool call with the recipient before the channel.
  ChatOutputMapper m(tok());
  for (TokenId t : tok().encode(" to=functions.get_weather<|channel|>commentary json<|message|>{\"x\":1}<|call|>", true))
    m.push(t);
  m.finish();
  ASSERT_EQ(m.tool_calls().size(), 1u);
  EXPECT_EQ(m.tool_calls()[0].name, "get_weather");
}

TEST(ChatFormat, ResponseFormatInTheDeveloperMessage) {
  ChatRequest r = parse_chat_request(parse_body(R"({
    "messages": [{"role": "user", "content": "List groceries."}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "shopping_list", "description": "entries",
      "strict": true, "schema": {"type": "object", "properties": {"items": {"type": "array"}}}}}})"));
  EXPECT_EQ(r.response_format.type, "json_schema");
  EXPECT_TRUE(r.response_format.strict);
  std::string text = harmony::render_text_for_completion(build_conversation(r));
  EXPECT_NE(text.find("<|start|>developer<|message|># Response Formats\n\n## shopping_list\n\n// entries\n"
                      "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\"}}}<|end|>"),
            std::string::npos)
      << text;
  // json_object and text add nothing to the prompt.
  ChatRequest o = parse_chat_request(parse_body(
      R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})"));
  EXPECT_EQ(harmony::render_text_for_completion(build_conversation(o)).find("developer"), std::string::npos);
}

TEST(ChatFormat, PlainTextMapperTakesEveryTokenAsContent) {
  std::string text = "{\"a\": [1, 2]}";
  ChatOutputMapper m(tok(), true);
  ChatDelta d;
  for (TokenId t : tok().encode(text, false)) d.append(m.push(t));
  d.append(m.push(tok().require_token_id("<|return|>")));
  d.append(m.finish());
  EXPECT_EQ(d.content, text);
  EXPECT_EQ(m.content(), text);
  EXPECT_TRUE(m.reasoning().empty());
}
