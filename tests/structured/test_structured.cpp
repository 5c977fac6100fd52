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
  auto any = any_json_object_grammar();
  EXPECT_TRUE(matches(*any, R"({"a":[1,{"b":null},"c",true,false,-0.5]})"));
  EXPECT_FALSE(matches(*any, "[1]")) << "json_object is an object";
  EXPECT_FALSE(matches(*any, R"({"a":})"));
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
  std::string u = err(R"({"type":"object","properties":{"s":{"type":"string","pattern":"^a","minLength":2}}})", true);
  EXPECT_NE(u.find("pattern at /properties/s"), std::string::npos) << u;
  EXPECT_NE(u.find("minLength"), std::string::npos) << u;
  EXPECT_EQ(err(R"({"type":"object","properties":{"s":{"type":"string","pattern":"^a"}}})", false), "")
      << "not strict: ignored";
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
  for (size_t i : {size_t(0), size_t(2), size_t(3)}) {
    JsonTokenMasker masker(compile_json_schema(test_schemas()[i], false), o200k_vocab());
    check_masks(masker, rng, 25);
  }
}

TEST(StructuredConstraint, OnlyTheFinalChannelAndToolArgumentsAreConstrained) {
  const auto& tok = o200k();
  HarmonyTokenIds ids;
  ids.start = tok.require_token_id("<|start|>");
  ids.channel = tok.require_token_id("<|channel|>");
  ids.message = tok.require_token_id("<|message|>");
  ids.end = tok.require_token_id("<|end|>");
  ids.return_ = tok.require_token_id("<|return|>");
  ids.call = tok.require_token_id("<|call|>");
  ids.constrain = tok.require_token_id("<|constrain|>");
  JsonConstraintSpec spec;
  spec.ids = ids;
  spec.vocab = o200k_vocab();
  spec.final_format = std::make_shared<JsonTokenMasker>(compile_json_schema(test_schemas()[0], true), o200k_vocab());
  spec.tools["get_weather"] = std::make_shared<JsonTokenMasker>(
      compile_json_schema(json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],
                                          "additionalProperties":false})"),
                          true),
      o200k_vocab());
  auto feed = [&](JsonConstraint& c, const std::string& text) {
    for (int32_t t : tok.encode(text, true)) {
      if (!c.accept(t)) return false;
    }
    return true;
  };
  const int V = int(tok.vocab_size());
  std::vector<float> logits(size_t(V), 0.0f);
  JsonConstraint c(spec);
  EXPECT_FALSE(c.active()) << "the header is free";
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
  EXPECT_FALSE(c.active());
  ASSERT_TRUE(feed(c, "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"sunny\": true}<|end|>"));
  EXPECT_FALSE(c.active()) << "tool results are not the model's";
  ASSERT_TRUE(feed(c, "<|start|>assistant<|channel|>final<|message|>"));
  ASSERT_TRUE(c.active());
  std::fill(logits.begin(), logits.end(), 0.0f);
  ASSERT_TRUE(c.mask_logits(logits.data(), V));
  EXPECT_FALSE(std::isinf(logits[size_t(tok.encode("{\"")[0])]));
  EXPECT_TRUE(std::isinf(logits[size_t(tok.encode("Sure")[0])]));
  EXPECT_TRUE(std::isinf(logits[size_t(ids.return_)])) << "not before the JSON is complete";
  ASSERT_TRUE(feed(c, R"({"name":"Ann","age":3})"));
  std::fill(logits.begin(), logits.end(), 0.0f);
  ASSERT_TRUE(c.mask_logits(logits.data(), V));
  EXPECT_FALSE(std::isinf(logits[size_t(ids.return_)]));
  EXPECT_EQ(std::count_if(logits.begin(), logits.end(), [](float x) { return !std::isinf(x); }), 1);
  EXPECT_TRUE(c.accept(ids.return_));
  EXPECT_TRUE(c.finished_json());

  JsonConstraintSpec whole = spec;
  whole.whole_output = true;
  JsonConstraint w(whole);
  EXPECT_TRUE(w.active()) << "not harmony: constrained from the first token";
  JsonConstraint w2(whole);
  EXPECT_FALSE(w2.accept(ids.channel));
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
