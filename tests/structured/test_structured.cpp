// Structured output: schema compilation, the byte-level JSON matcher (checked against an
// independent validator on random documents it generates), token masks (checked against
// running every token through the matcher), the harmony placement of the constraint, and the
// per-token mask cost over the o200k vocabulary (printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <regex>

#include "json_schema_oracle.h"
#include "structured/json_constraint.h"
#include "structured/json_grammar.h"
#include "structured/json_matcher.h"
#include "structured/token_masker.h"
#include "tokenizer/tokenizer.h"

using namespace gptoss::structured;
using json = nlohmann::json;

namespace {

bool matches(const Grammar& g, const std::string& text) {
  JsonMatcher m(g);
  MatchState s = m.start();
  return m.advance(s, text) && m.can_end(s);
}

const std::vector<json>& test_schemas() {
  static const std::vector<json> v = {
      json::parse(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
                     "tags":{"type":"array","items":{"type":"string","enum":["a","b","c"]},"maxItems":3}},
                     "required":["name","age"],"additionalProperties":false})"),
      json::parse(R"({"type":"object","properties":{"when":{"type":"string","format":"date-time"},
                     "day":{"type":"string","format":"date"},"id":{"type":"string","format":"uuid"},
                     "t":{"type":"string","format":"time"}},"required":["when","day","id","t"],"additionalProperties":false})"),
      json::parse(R"({"type":"object","properties":{"x":{"type":["number","null"]},"ok":{"type":"boolean"},
                     "kind":{"const":"point"},"nested":{"type":"object","properties":{"deep":{"type":"array",
                     "items":{"type":"integer"},"minItems":1,"maxItems":4}},"required":["deep"],"additionalProperties":false}},
                     "required":["x","ok","kind","nested"],"additionalProperties":false})"),
      json::parse(R"({"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":{"type":"integer"}})"),
      json::parse(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
                     "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"],
                     "additionalProperties":false}},"$ref":"#/$defs/node"})"),
      json::parse(R"({"type":"array","items":{"anyOf":[{"type":"string"},{"type":"number"},{"type":"boolean"}]},
                     "minItems":2,"maxItems":5})"),
      json::parse(R"({"enum":[1,12,"x",[1,2],{"a":null}]})"),
      json::parse(R"({"type":"number"})"),
      json::parse(R"({})"),
      json::parse(R"({"type":"object","properties":{"code":{"type":"string","minLength":3,"maxLength":5},
                     "note":{"type":"string","maxLength":40},"tag":{"type":["string","null"],"minLength":2}},
                     "required":["code","note","tag"],"additionalProperties":false})"),
  };
  return v;
}

// A random document from the matcher, one random allowed byte at a time (ends with some
// probability once it may end). Fails the test on a dead end.
std::optional<std::string> random_document(const Grammar& g, std::mt19937_64& rng, size_t max_len = 4000) {
  JsonMatcher m(g);
  MatchState s = m.start();
  std::string out;
  while (out.size() < max_len) {
    bool end_ok = m.can_end(s);
    std::vector<uint8_t> next;
    for (int b = 0; b < 256; ++b) {
      MatchState t = s;
      if (m.advance(t, uint8_t(b))) next.push_back(uint8_t(b));
    }
    if (end_ok && (next.empty() || rng() % 4 == 0)) return out;
    if (next.empty()) {
      ADD_FAILURE() << "dead end after: " << out;
      return std::nullopt;
    }
    // Prefer structure now and then so documents stay short.
    uint8_t b = next[rng() % next.size()];
    if (rng() % 3 == 0) {
      for (uint8_t c : next)
        if (c == '"' || c == '}' || c == ']' || c == ',') b = c;
    }
    out.push_back(char(b));
    EXPECT_TRUE(m.advance(s, b));
  }
  return std::nullopt;
}

}  // namespace

TEST(StructuredSchema, MatcherAcceptsAndRefuses) {
  auto g = compile_json_schema(test_schemas()[0], true);
  EXPECT_TRUE(matches(*g, R"({"name":"Ann","age":31})"));
  EXPECT_TRUE(matches(*g, R"({ "age": -4, "name": "x\"\u00e9y", "tags": ["a","c"] })"));
  EXPECT_FALSE(matches(*g, R"({"name":"Ann"})")) << "required age";
  EXPECT_FALSE(matches(*g, R"({"name":"Ann","age":1.5})")) << "integer";
  EXPECT_FALSE(matches(*g, R"({"name":"Ann","age":1,"x":1})")) << "additionalProperties false";
  EXPECT_FALSE(matches(*g, R"({"name":"Ann","name":"B","age":1})")) << "duplicate key";
  EXPECT_FALSE(matches(*g, R"({"name":"Ann","age":1,"tags":["d"]})")) << "enum";
  EXPECT_FALSE(matches(*g, R"({"name":"Ann","age":1,"tags":["a","a","a","a"]})")) << "maxItems";
  EXPECT_FALSE(matches(*g, " {\"name\":\"A\",\"age\":1}")) << "no leading whitespace";
  EXPECT_FALSE(matches(*g, "{\"name\":\"A\x01\",\"age\":1}")) << "control byte in a string";
  EXPECT_FALSE(matches(*g, "{\"name\":\"A\xC3\",\"age\":1}")) << "broken UTF-8";
  auto f = compile_json_schema(test_schemas()[1], true);
  EXPECT_TRUE(matches(*f, R"({"when":"2024-02-29T23:59:07.5+01:00","day":"1999-12-31",)"
                          R"("id":"123e4567-e89b-12d3-a456-426614174000","t":"00:00:00Z"})"));
  EXPECT_FALSE(matches(*f, R"({"when":"2024-13-01T00:00:00Z","day":"1999-12-31",)"
                           R"("id":"123e4567-e89b-12d3-a456-426614174000","t":"00:00:00Z"})"));
  EXPECT_FALSE(matches(*f, R"({"when":"2024-12-01T24:00:00Z","day":"1999-12-32",)"
                           R"("id":"123e4567-e89b-12d3-a456-426614174000","t":"00:00:00Z"})"));
  auto e = compile_json_schema(test_schemas()[6], true);
  for (const char* ok : {"1", "12", "\"x\"", "[1,2]", "{\"a\":null}"}) EXPECT_TRUE(matches(*e, ok)) << ok;
  for (const char* bad : {"2", "123", "\"y\"", "[1, 2]", "{}"}) EXPECT_FALSE(matches(*e, bad)) << bad;
  auto n = compile_json_schema(test_schemas()[7], true);
  for (const char* ok : {"0", "-1.5e+3", "12.25", "1E9"}) EXPECT_TRUE(matches(*n, ok)) << ok;
  for (const char* bad : {"01", "-", "1.", ".5", "1e", "+1", "1.5e1000"}) EXPECT_FALSE(matches(*n, bad)) << bad;
  // Lengths in characters: an escape or a multi-byte character is one.
  auto l = compile_json_schema(json::parse(R"({"type":"string","minLength":2,"maxLength":4})"), true);
  for (const char* ok : {"\"ab\"", "\"abcd\"", "\"\\n\u00e9\"", "\"\\u00e9x\\\"y\""}) EXPECT_TRUE(matches(*l, ok)) << ok;
  for (const char* bad : {"\"a\"", "\"\"", "\"abcde\"", "\"\u00e9\u00e9\u00e9\u00e9\u00e9\""}) EXPECT_FALSE(matches(*l, bad)) << bad;
  auto any = any_json_object_grammar();
  EXPECT_TRUE(matches(*any, R"({"a":[1,{"b":null},"c",true,false,-0.5]})"));
  EXPECT_FALSE(matches(*any, "[1]")) << "json_object is an object";
  EXPECT_FALSE(matches(*any, R"({"a":})"));
}

// A recursive schema at the matcher's depth limit: a walk that always nests deeper when it may
// (the way a model once wrote {"kids":[{"kids":[... until nothing was allowed) ends with a valid
// document, never a state that allows nothing; and a schema every document of which nests deeper
// than the limit is refused when compiled.
TEST(StructuredSchema, RecursionNeverStrandsTheMatcherAtTheDepthLimit) {
  const std::vector<json> trees = {
      json::parse(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array",
                     "items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v","kids"],"additionalProperties":false}},
                     "type":"object","properties":{"root":{"$ref":"#/$defs/node"}},"required":["root"],"additionalProperties":false})"),
      json::parse(R"({"$defs":{"n":{"anyOf":[{"type":"null"},{"type":"array","items":{"$ref":"#/$defs/n"},"minItems":1}]}},
                     "$ref":"#/$defs/n"})"),
      json::parse(R"({"type":"object","properties":{"a":{"$ref":"#"},"b":{"type":"array","items":{"$ref":"#"}}},
                     "additionalProperties":false})"),
  };
  for (size_t i = 0; i < trees.size(); ++i) {
    auto g = compile_json_schema(trees[i], true);
    JsonMatcher m(*g);
    MatchState s = m.start();
    std::string out;
    int max_depth = 0;
    // Deeper while it may (open a container first, then start a key or an item), then close.
    const std::string deeper = "{[\"akids", closing = "0]}";
    bool closing_now = false;
    while (!(s.depth == 0 || (closing_now && m.can_end(s))) && out.size() < 20000) {
      std::string allowed;
      for (int b = 0; b < 256; ++b) {
        MatchState t = s;
        if (m.advance(t, uint8_t(b))) allowed.push_back(char(b));
      }
      ASSERT_FALSE(allowed.empty()) << "schema " << i << ": nothing allowed after ..." << out.substr(out.size() > 120 ? out.size() - 120 : 0);
      max_depth = std::max(max_depth, int(s.depth));
      if (s.depth >= kMaxDepth - 1) closing_now = true;
      char pick = allowed[0];
      for (char c : closing_now ? closing : deeper)
        if (allowed.find(c) != std::string::npos) {
          pick = c;
          break;
        }
      out.push_back(pick);
      ASSERT_TRUE(m.advance(s, uint8_t(pick)));
    }
    EXPECT_TRUE(m.can_end(s)) << "schema " << i << ": " << out.size() << " bytes";
    EXPECT_GE(max_depth, kMaxDepth - 2) << "schema " << i << " reached the limit";
    json parsed;
    EXPECT_NO_THROW(parsed = json::parse(out)) << out;
  }
  // Every document of this one nests 40 deep.
  json deep = json::parse(R"({"type":"integer"})");
  for (int d = 0; d < 40; ++d) deep = json{{"type", "array"}, {"items", deep}, {"minItems", 1}};
  EXPECT_THROW(compile_json_schema(deep, true), SchemaError);
}

TEST(StructuredSchema, ErrorsNameTheProblem) {
  auto err = [](const char* text, bool strict) -> std::string {
    try {
      compile_json_schema(json::parse(text), strict);
    } catch (const SchemaError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(err(R"({"type":"strin"})", false).find("unknown type 'strin'"), std::string::npos);
  EXPECT_NE(err(R"({"type":"object","properties":[]})", false).find("/properties"), std::string::npos);
  EXPECT_NE(err(R"({"type":"array","minItems":3,"maxItems":2})", false).find("minItems"), std::string::npos);
  EXPECT_NE(err(R"({"$ref":"#/$defs/missing"})", false).find("cannot resolve"), std::string::npos);
  EXPECT_NE(err(R"({"type":"object","properties":{"a":{}},"required":["b"],"additionalProperties":false})", false)
                .find("'b' is required"),
            std::string::npos);
  EXPECT_NE(err("false", false).find("allows no value"), std::string::npos);
  std::string u = err(R"({"type":"object","properties":{"s":{"type":"string","pattern":"^a"},"n":{"minimum":2}}})", true);
  EXPECT_NE(u.find("pattern at /properties/s"), std::string::npos) << u;
  EXPECT_NE(u.find("minimum at /properties/n"), std::string::npos) << u;
  EXPECT_NE(err(R"({"type":"string","minLength":5,"maxLength":2})", false).find("minLength is larger"), std::string::npos);
  EXPECT_NE(err(R"({"type":"string","format":"date","maxLength":4})", true).find("beside a format"), std::string::npos);
  EXPECT_EQ(err(R"({"type":"string","minLength":1,"maxLength":12})", true), "") << "lengths are supported";
  EXPECT_EQ(err(R"({"type":"object","properties":{"s":{"type":"string","pattern":"^a"}}})", false), "")
      << "not strict: ignored";
  // Ignored, yet not taken on trust: a malformed pattern, length or bound is refused either way.
  for (bool strict : {false, true}) {
    std::string e = err(R"({"type":"string","pattern":"(("})", strict);
    EXPECT_NE(e.find("/pattern"), std::string::npos) << e;
    EXPECT_NE(e.find("regular expression"), std::string::npos) << e;
    EXPECT_NE(err(R"({"type":"string","maxLength":"3"})", strict).find("maxLength"), std::string::npos);
    EXPECT_NE(err(R"({"type":"integer","minimum":"low"})", strict).find("minimum"), std::string::npos);
  }
  EXPECT_EQ(err(R"({"type":"string","pattern":"^[a-z]+(-[a-z]+)*$","maxLength":8})", false), "");
  EXPECT_EQ(err(R"({"type":"integer","minimum":1,"maximum":9.5})", false), "");
  EXPECT_NE(err(R"({"anyOf":[{"type":"object"},{"type":"object","properties":{"a":{}}}]})", true).find("anyOf"),
            std::string::npos);
  EXPECT_EQ(err(R"({"title":"t","description":"d","type":"string","default":"x"})", true), "") << "annotations";
}

TEST(StructuredSchema, RandomDocumentsValidate) {
  std::mt19937_64 rng(12345);
  for (size_t i = 0; i < test_schemas().size(); ++i) {
    const json& schema = test_schemas()[i];
    auto g = compile_json_schema(schema, false);
    int done = 0;
    for (int k = 0; k < 150; ++k) {
      auto doc = random_document(*g, rng);
      if (!doc) continue;
      json v;
      ASSERT_NO_THROW(v = json::parse(*doc)) << "schema " << i << ": " << *doc;
      ASSERT_TRUE(gptoss::testing::schema_valid(schema, v)) << "schema " << i << ": " << *doc;
      ++done;
    }
    EXPECT_GT(done, 50) << "schema " << i;
  }
  auto object = any_json_object_grammar();
  for (int k = 0; k < 100; ++k)
    if (auto doc = random_document(*object, rng)) {
      json v;
      ASSERT_NO_THROW(v = json::parse(*doc)) << *doc;
      EXPECT_TRUE(v.is_object()) << *doc;
    }
}

namespace {

// A small vocabulary with the token shapes that matter: every single byte, JSON punctuation
// pairs, words, whitespace runs, partial UTF-8, escapes; plus two "special" tokens.
std::shared_ptr<TokenVocabulary> small_vocab() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
  for (const char* s : {"{\"", "\":", "\",", "\"}", "},", "}}", "]}", "],", "\"]", "true", "false", "null", "nu",
                        "123", "0.", "e+", " \"", "\n  ", "  ", "\"name", "name\":", "age", "\":\"", "\\n", "\\u00e9",
                        "\\ud83d", "\xC3\xA9", "\xC3", "\xA9x", "é\"", "\"a\",\"", "1,", "12", "-0", "\"x\"}",
                        "2024-", "01-", "T12:", "ab\"c", "\"\"", "{}", "[]", "[\"", "\",\""})
    t.push_back(s);
  t.push_back("<|return|>");
  t.push_back("<|call|>");
  std::vector<bool> special(t.size(), false);
  special[t.size() - 1] = special[t.size() - 2] = true;
  return std::make_shared<TokenVocabulary>(t, special);
}

TokenBitset brute_force(const JsonMatcher& m, const TokenVocabulary& v, const MatchState& s) {
  TokenBitset out(v.size());
  for (size_t id = 0; id < v.size(); ++id) {
    if (v.special(int32_t(id)) || v.bytes(int32_t(id)).empty()) continue;
    MatchState t = s;
    if (m.advance(t, v.bytes(int32_t(id)))) out.set(id);
  }
  return out;
}

// Walks random allowed tokens from the start and checks every state's mask against brute force.
void check_masks(const JsonTokenMasker& masker, std::mt19937_64& rng, int steps) {
  const TokenVocabulary& v = masker.vocab();
  const JsonMatcher& m = masker.matcher();
  MatchState s = m.start();
  for (int i = 0; i < steps && s.depth > 0; ++i) {
    TokenBitset got = masker.compute(s), want = brute_force(m, v, s);
    ASSERT_EQ(got.words, want.words) << "state " << i;
    std::vector<int32_t> ids;
    for (size_t id = 0; id < v.size(); ++id)
      if (got.test(id)) ids.push_back(int32_t(id));
    ASSERT_FALSE(ids.empty() && !m.can_end(s)) << "no token allowed at step " << i;
    if (ids.empty()) break;
    int32_t pick = ids[rng() % ids.size()];
    ASSERT_TRUE(m.advance(s, v.bytes(pick)));
  }
}

}  // namespace

TEST(StructuredMask, SmallVocabularyMatchesBruteForce) {
  auto vocab = small_vocab();
  std::mt19937_64 rng(7);
  for (const auto& schema : test_schemas()) {
    JsonTokenMasker masker(compile_json_schema(schema, false), vocab);
    for (int r = 0; r < 20; ++r) check_masks(masker, rng, 60);
  }
}

namespace {
const gptoss::Tokenizer& o200k() {
  static const gptoss::Tokenizer t = gptoss::Tokenizer::o200k_harmony();
  return t;
}
std::shared_ptr<const TokenVocabulary> o200k_vocab() {
  static const auto v = [] {
    const auto& tok = o200k();
    std::vector<std::string> bytes(tok.vocab_size());
    std::vector<bool> special(tok.vocab_size(), true);
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (!tok.has_token(int32_t(i)) || tok.is_special(int32_t(i))) continue;
      bytes[i] = std::string(tok.token_bytes(int32_t(i)));
      special[i] = false;
    }
    return std::make_shared<const TokenVocabulary>(std::move(bytes), special);
  }();
  return v;
}
}  // namespace

TEST(StructuredMask, O200kMatchesBruteForce) {
  std::mt19937_64 rng(11);
  for (size_t i : {size_t(0), size_t(2), size_t(3), size_t(9)}) {
    JsonTokenMasker masker(compile_json_schema(test_schemas()[i], false), o200k_vocab());
    check_masks(masker, rng, 25);
  }
}

namespace {
HarmonyTokenIds harmony_ids() {
  const auto& tok = o200k();
  HarmonyTokenIds ids;
  ids.start = tok.require_token_id("<|start|>");
  ids.channel = tok.require_token_id("<|channel|>");
  ids.message = tok.require_token_id("<|message|>");
  ids.end = tok.require_token_id("<|end|>");
  ids.return_ = tok.require_token_id("<|return|>");
  ids.call = tok.require_token_id("<|call|>");
  ids.constrain = tok.require_token_id("<|constrain|>");
  return ids;
}
std::shared_ptr<const JsonTokenMasker> weather_params() {
  static const auto m = std::make_shared<const JsonTokenMasker>(
      compile_json_schema(json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],
                                          "additionalProperties":false})"),
                          true),
      o200k_vocab());
  return m;
}
// A harmony constraint: the final channel's format (test schema 0) when `format`, and the tools.
JsonConstraintSpec harmony_spec(bool format, const std::vector<std::string>& tools) {
  JsonConstraintSpec spec;
  spec.ids = harmony_ids();
  spec.vocab = o200k_vocab();
  if (format) spec.final_format = std::make_shared<JsonTokenMasker>(compile_json_schema(test_schemas()[0], true), o200k_vocab());
  for (const auto& name : tools) spec.tools[name] = weather_params();
  return spec;
}
// Feeds text's tokens (special tokens by name); false at the first one refused.
bool feed(JsonConstraint& c, const std::string& text) {
  for (int32_t t : o200k().encode(text, true))
    if (!c.accept(t)) return false;
  return true;
}
// The tokens mask_logits() leaves, checked against trying every token on a copy of the constraint.
std::vector<int32_t> expect_mask_is_accept(JsonConstraint& c) {
  const int V = int(o200k().vocab_size());
  std::vector<float> logits(size_t(V), 0.0f);
  JsonConstraint masking = c;
  masking.mask_logits(logits.data(), V);
  std::vector<int32_t> allowed;
  for (int t = 0; t < V; ++t) {
    JsonConstraint copy = c;
    const bool accepted = copy.accept(t);
    EXPECT_EQ(!std::isinf(logits[size_t(t)]), accepted) << "token " << t << " after " << c.header();
    if (accepted) allowed.push_back(t);
  }
  return allowed;
}
bool allows(const std::vector<int32_t>& allowed, int32_t t) { return std::find(allowed.begin(), allowed.end(), t) != allowed.end(); }
int32_t token_of(const std::string& text) {
  auto ids = o200k().encode(text, true);
  EXPECT_EQ(ids.size(), 1u) << text;
  return ids.empty() ? -1 : ids[0];
}
}  // namespace

TEST(StructuredConstraint, OnlyTheFinalChannelAndToolArgumentsAreConstrained) {
  const HarmonyTokenIds ids = harmony_ids();
  const int V = int(o200k().vocab_size());
  std::vector<float> logits(size_t(V), 0.0f);
  JsonConstraint c(harmony_spec(true, {"get_weather"}));
  EXPECT_TRUE(c.active()) << "headers are masked";
  ASSERT_TRUE(feed(c, "<|channel|>analysis<|message|>Let me think { not json"));
  EXPECT_FALSE(c.active()) << "analysis is free";
  ASSERT_TRUE(feed(c, "<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"));
  ASSERT_TRUE(c.active()) << c.header();
  {
    JsonConstraint copy = c;
    EXPECT_FALSE(feed(copy, "[1]")) << "tool arguments follow the parameters";
  }
  ASSERT_TRUE(feed(c, R"({"city": "Paris"})"));
  ASSERT_TRUE(c.mask_logits(logits.data(), V));
  for (int i = 0; i < V; ++i) ASSERT_EQ(std::isinf(logits[size_t(i)]), i != ids.call) << i;
  ASSERT_TRUE(c.accept(ids.call));
  EXPECT_TRUE(c.finished_json());
  // The call ends the turn; a request that ignores end tokens (ignore_eos) goes on unconstrained.
  EXPECT_FALSE(c.active());
  EXPECT_FALSE(c.rejects(ids.start));
  EXPECT_TRUE(feed(c, "<|start|>anything [1"));

  JsonConstraint f(harmony_spec(true, {"get_weather"}));
  ASSERT_TRUE(feed(f, "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final<|message|>"));
  ASSERT_TRUE(f.active());
  std::fill(logits.begin(), logits.end(), 0.0f);
  ASSERT_TRUE(f.mask_logits(logits.data(), V));
  EXPECT_FALSE(std::isinf(logits[size_t(o200k().encode("{\"")[0])]));
  EXPECT_TRUE(std::isinf(logits[size_t(o200k().encode("Sure")[0])]));
  EXPECT_TRUE(std::isinf(logits[size_t(ids.return_)])) << "not before the JSON is complete";
  ASSERT_TRUE(feed(f, R"({"name":"Ann","age":3})"));
  std::fill(logits.begin(), logits.end(), 0.0f);
  ASSERT_TRUE(f.mask_logits(logits.data(), V));
  EXPECT_FALSE(std::isinf(logits[size_t(ids.return_)]));
  EXPECT_EQ(std::count_if(logits.begin(), logits.end(), [](float x) { return !std::isinf(x); }), 1);
  EXPECT_TRUE(f.accept(ids.return_));
  EXPECT_TRUE(f.finished_json());

  JsonConstraintSpec whole = harmony_spec(true, {});
  whole.whole_output = true;
  JsonConstraint w(whole);
  EXPECT_TRUE(w.active()) << "not harmony: constrained from the first token";
  JsonConstraint w2(whole);
  EXPECT_FALSE(w2.accept(ids.channel));
}

// Headers: the mask is exactly the tokens the constraint accepts (every o200k token tried), and
// those are the channels allowed and calls to declared functions only, in every form gpt-oss
// writes them.
TEST(StructuredConstraint, HeadersNameOnlyAllowedChannelsAndDeclaredFunctions) {
  const HarmonyTokenIds ids = harmony_ids();
  JsonConstraint c(harmony_spec(false, {"get_weather", "get_time"}));
  auto first = expect_mask_is_accept(c);
  EXPECT_TRUE(allows(first, ids.channel));
  EXPECT_TRUE(allows(first, token_of(" to"))) << "the recipient may come before the channel";
  EXPECT_FALSE(allows(first, ids.message));
  EXPECT_FALSE(allows(first, ids.start)) << "the prompt wrote this header's <|start|>assistant";
  EXPECT_FALSE(allows(first, token_of("Sure")));
  {
    JsonConstraint h = c;
    ASSERT_TRUE(feed(h, "<|channel|>"));
    auto after_channel = expect_mask_is_accept(h);
    for (const char* w : {"analysis", "final", "comment"}) EXPECT_TRUE(allows(after_channel, token_of(w))) << w;
    EXPECT_FALSE(allows(after_channel, token_of("python")));
    JsonConstraint a = h;
    ASSERT_TRUE(feed(a, "analysis"));
    EXPECT_EQ(expect_mask_is_accept(a), std::vector<int32_t>{ids.message});
    JsonConstraint p = h;
    ASSERT_TRUE(feed(p, "commentary"));
    auto after_commentary = expect_mask_is_accept(p);
    EXPECT_TRUE(allows(after_commentary, ids.message)) << "a preamble";
    EXPECT_TRUE(allows(after_commentary, token_of(" to")));
    EXPECT_FALSE(allows(after_commentary, token_of(" json"))) << "a content type needs a recipient";
    ASSERT_TRUE(feed(h, "commentary to=functions."));
    auto after_functions = expect_mask_is_accept(h);
    EXPECT_TRUE(allows(after_functions, token_of("get")));
    EXPECT_FALSE(allows(after_functions, token_of("send")));
    EXPECT_FALSE(allows(after_functions, ids.message)) << "a recipient needs a name";
    JsonConstraint bad = h;
    EXPECT_FALSE(feed(bad, "send_email"));
  }
  for (const char* bad : {"<|channel|>commentary to=browser.search<|message|>", "<|channel|>analysis to=python<|message|>",
                          "<|channel|>commentary to=functions.get_weathers<|message|>", "<|channel|>final json<|message|>",
                          "<|channel|>reasoning<|message|>", "assistant<|channel|>final<|message|>", "<|message|>"}) {
    JsonConstraint h = c;
    EXPECT_FALSE(feed(h, bad)) << bad;
  }
  // The forms of a call: recipient after or before the channel, content type or none.
  for (const char* call : {"<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>",
                           "<|channel|>commentary to=functions.get_time<|constrain|>json<|message|>",
                           "<|channel|>commentary to=functions.get_time json<|message|>",
                           "<|channel|>commentary to=functions.get_time<|message|>",
                           " to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>",
                           " to=functions.get_time<|channel|>commentary<|constrain|>json<|message|>",
                           " to=functions.get_time<|channel|>commentary json<|message|>",
                           " to=functions.get_time<|channel|>commentary<|message|>"}) {
    for (bool later : {false, true}) {
      JsonConstraint h = c;
      if (later) {
        ASSERT_TRUE(feed(h, "<|channel|>analysis<|message|>x<|end|><|start|>assistant"));
      }
      ASSERT_TRUE(feed(h, call)) << call;
      EXPECT_TRUE(h.active()) << call << ": the arguments are JSON";
      EXPECT_TRUE(feed(h, R"({"city":"Oslo"}<|call|>)")) << call;
    }
  }
  // A later header starts with <|start|>assistant, and nothing else may follow <|end|>.
  JsonConstraint later = c;
  ASSERT_TRUE(feed(later, "<|channel|>analysis<|message|>x<|end|>"));
  EXPECT_TRUE(later.active());
  auto after_end = expect_mask_is_accept(later);
  ASSERT_EQ(after_end.size(), 1u);
  EXPECT_EQ(after_end[0], ids.start);
  ASSERT_TRUE(feed(later, "<|start|>"));
  auto role = expect_mask_is_accept(later);
  EXPECT_TRUE(allows(role, token_of("assistant")));
  EXPECT_FALSE(allows(role, token_of("user")));
}

TEST(StructuredConstraint, ToolChoiceRequiredNamedAndNone) {
  // required (and named): no final channel and no preamble; the turn ends in a call.
  JsonConstraintSpec required = harmony_spec(true, {"get_weather", "get_time"});
  required.final_channel = required.preambles = false;
  JsonConstraint r(required);
  {
    JsonConstraint h = r;
    EXPECT_FALSE(feed(h, "<|channel|>final<|message|>"));
    JsonConstraint p = r;
    EXPECT_FALSE(feed(p, "<|channel|>commentary<|message|>"));
    JsonConstraint a = r;
    EXPECT_TRUE(feed(a, "<|channel|>analysis<|message|>Let me call.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>"));
  }
  JsonConstraintSpec named = harmony_spec(false, {"get_time"});  // the server passes only the named function
  named.final_channel = named.preambles = false;
  JsonConstraint n(named);
  {
    JsonConstraint h = n;
    EXPECT_FALSE(feed(h, "<|channel|>commentary to=functions.get_weather<|message|>"));
    JsonConstraint ok = n;
    EXPECT_TRUE(feed(ok, "<|channel|>commentary to=functions.get_time<|message|>{\"city\":\"Rome\"}<|call|>"));
  }
  // none: no function at all; the final channel and preambles are free text.
  JsonConstraint none(harmony_spec(false, {}));
  {
    JsonConstraint h = none;
    EXPECT_FALSE(feed(h, "<|channel|>commentary to=functions.get_weather<|message|>"));
    JsonConstraint ok = none;
    ASSERT_TRUE(feed(ok, "<|channel|>commentary<|message|>One moment.<|end|><|start|>assistant<|channel|>final<|message|>Done."));
    EXPECT_FALSE(ok.active()) << "a final message without a format is free";
    EXPECT_TRUE(ok.accept(harmony_ids().return_));
  }
}

// Free text is drawn unmasked: rejects() refuses special tokens other than the message's end, and
// after mask_next() the mask removes exactly those (the engine's redraw).
TEST(StructuredConstraint, FreeTextRefusesSpecialTokensButItsEnd) {
  const HarmonyTokenIds ids = harmony_ids();
  const int32_t text = token_of("Sure");
  JsonConstraint c(harmony_spec(true, {"get_weather"}));
  ASSERT_TRUE(feed(c, "<|channel|>analysis<|message|>Thinking"));
  ASSERT_FALSE(c.active());
  EXPECT_FALSE(c.rejects(text));
  EXPECT_FALSE(c.rejects(ids.end));
  for (int32_t t : {ids.return_, ids.call, ids.start, ids.channel, ids.message, ids.constrain,
                    o200k().require_token_id("<|endoftext|>"), int32_t(o200k().vocab_size())})
    EXPECT_TRUE(c.rejects(t)) << t;
  EXPECT_TRUE(c.stays_inactive(text));
  EXPECT_FALSE(c.stays_inactive(ids.end)) << "<|end|> starts a masked header";
  EXPECT_FALSE(c.stays_inactive(ids.return_));
  c.mask_next();
  EXPECT_TRUE(c.active());
  EXPECT_FALSE(c.stays_inactive(text));
  auto allowed = expect_mask_is_accept(c);
  EXPECT_TRUE(allows(allowed, ids.end));
  EXPECT_FALSE(allows(allowed, ids.return_));
  size_t specials_allowed = 0;
  for (int32_t t : allowed) specials_allowed += o200k_vocab()->special(t);
  EXPECT_EQ(specials_allowed, 1u);
  EXPECT_EQ(allowed.size(), o200k_vocab()->size() - o200k_vocab()->special_ids().size() + 1);
  ASSERT_TRUE(c.accept(text));
  EXPECT_FALSE(c.active()) << "the redraw masks one draw";
  // A free final message (no format) ends with <|return|> only.
  JsonConstraint f(harmony_spec(false, {"get_weather"}));
  ASSERT_TRUE(feed(f, "<|channel|>final<|message|>It is sunny."));
  EXPECT_FALSE(f.rejects(ids.return_));
  EXPECT_TRUE(f.rejects(ids.end));
  EXPECT_TRUE(f.rejects(ids.call));
}

// A chat request with nothing to constrain gets harmony's text guard alone: headers free, never
// active, a message's text refusing special tokens but the ones that end a message.
TEST(StructuredConstraint, TextGuardAloneRefusesSpecialTokensInText) {
  const HarmonyTokenIds ids = harmony_ids();
  JsonConstraintSpec spec = harmony_spec(false, {});
  spec.text_guard_only = true;
  JsonConstraint g(spec);
  EXPECT_FALSE(g.active());
  EXPECT_FALSE(g.rejects(ids.start)) << "headers are free";
  ASSERT_TRUE(feed(g, "<|channel|>analysis to=python<|message|>Think."));  // any header
  EXPECT_FALSE(g.active());
  for (int32_t t : {ids.start, ids.channel, ids.message, ids.constrain}) {
    EXPECT_TRUE(g.rejects(t)) << t;
    EXPECT_FALSE(g.stays_inactive(t)) << t;
  }
  for (int32_t t : {ids.end, ids.return_, ids.call}) EXPECT_FALSE(g.rejects(t)) << t;
  EXPECT_TRUE(g.stays_inactive(token_of("Sure")));
  EXPECT_TRUE(g.stays_inactive(ids.end)) << "the next header is not masked either";
  g.mask_next();
  EXPECT_TRUE(g.active()) << "a refused token's redraw is masked";
  auto allowed = expect_mask_is_accept(g);
  EXPECT_TRUE(allows(allowed, ids.end));
  EXPECT_TRUE(allows(allowed, ids.return_));
  EXPECT_FALSE(allows(allowed, ids.message));
  ASSERT_TRUE(feed(g, " More.<|end|><|start|>assistant<|channel|>final<|message|>Done."));
  EXPECT_FALSE(g.active());
  EXPECT_TRUE(g.accept(ids.return_));
  // Past the turn's end (ignore_eos) nothing is refused, so no redraw can repeat unmasked.
  for (int32_t t : {ids.message, ids.start, ids.return_, token_of("Sure")}) {
    EXPECT_FALSE(g.rejects(t)) << t;
    EXPECT_TRUE(g.stays_inactive(t)) << t;
    EXPECT_TRUE(g.accept(t)) << t;
  }
}

// Prints the per-token cost of masks: 32 streams each writing a document by picking random
// allowed tokens of o200k, timing allowed() + apply_mask() for every token.
TEST(StructuredMask, BenchPerTokenCost) {
  auto vocab = o200k_vocab();
  const int V = int(vocab->size());
  std::mt19937_64 rng(3);
  std::vector<float> fresh(vocab->size()), logits(vocab->size());
  for (auto& x : fresh) x = float(rng() % 1000) / 100.0f;
  for (size_t si : {size_t(0), size_t(2), size_t(8)}) {
    auto masker = std::make_shared<JsonTokenMasker>(compile_json_schema(test_schemas()[si], false), vocab);
    const JsonMatcher& m = masker->matcher();
    double mask_s = 0, apply_s = 0, worst = 0;
    std::vector<double> per_token;
    long tokens = 0;
    for (int stream = 0; stream < 32; ++stream) {
      MatchState s = m.start();
      for (int step = 0; step < 64 && s.depth > 0; ++step) {
        std::copy(fresh.begin(), fresh.end(), logits.begin());
        auto t0 = std::chrono::steady_clock::now();
        auto bits = masker->allowed(s);
        auto t1 = std::chrono::steady_clock::now();
        apply_mask(*bits, logits.data(), V);
        auto t2 = std::chrono::steady_clock::now();
        double a = std::chrono::duration<double>(t1 - t0).count();
        mask_s += a;
        worst = std::max(worst, a);
        apply_s += std::chrono::duration<double>(t2 - t1).count();
        per_token.push_back(std::chrono::duration<double>(t2 - t0).count());
        ++tokens;
        std::vector<int32_t> ids;
        for (size_t w = 0; w < bits->words.size(); ++w)
          for (uint64_t x = bits->words[w]; x; x &= x - 1) ids.push_back(int32_t(w * 64 + size_t(std::countr_zero(x))));
        if (ids.empty()) break;
        ASSERT_TRUE(m.advance(s, vocab->bytes(ids[rng() % ids.size()])));
      }
    }
    std::sort(per_token.begin(), per_token.end());
    std::printf("structured mask, schema %zu: %ld tokens over 32 streams: mask %.1f us/token (worst %.0f us, "
                "%zu misses / %zu hits), apply %.1f us/token; mask+apply median %.1f us, mean %.1f us "
                "(x32 streams: %.2f ms a step on one core)\n",
                si, tokens, 1e6 * mask_s / double(tokens), 1e6 * worst, masker->cache_misses(), masker->cache_hits(),
                1e6 * apply_s / double(tokens), 1e6 * per_token[per_token.size() / 2],
                1e6 * (mask_s + apply_s) / double(tokens), 32e3 * (mask_s + apply_s) / double(tokens));
  }
}
