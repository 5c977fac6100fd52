// Tokenizer tests: ids against the reference (tiktoken, stored as test data), tokenizer.json vs
// .tiktoken agreement, round trips, streaming decode, specials, UTF-8 replacement rules.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

using gptoss::TokenId;
using gptoss::Tokenizer;
using gptoss::test::o200k;
using gptoss::test::read_text;

namespace {

struct Case {
  std::string text;
  std::vector<TokenId> ids;
};

const std::vector<Case>& corpus() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> c;
    std::ifstream ft(std::string(GPTOSS_TEST_DATA) + "/tokenizer/corpus.jsonl");
    std::ifstream fi(std::string(GPTOSS_TEST_DATA) + "/tokenizer/corpus.ids.jsonl");
    std::string lt, li;
    while (std::getline(ft, lt)) {
      if (!std::getline(fi, li)) throw std::runtime_error("corpus.ids.jsonl is shorter");
      c.push_back({nlohmann::json::parse(lt).at("text").get<std::string>(),
                   nlohmann::json::parse(li).get<std::vector<TokenId>>()});
    }
    return c;
  }();
  return cases;
}

// tokenizer.json written from the ranks (as make-model does), loaded once.
const Tokenizer& o200k_json() {
  static const Tokenizer tok = [] {
    auto dir = std::filesystem::path(GPTOSS_BINARY_DIR) / "test_tokenizer_data";
    std::filesystem::create_directories(dir);
    auto path = (dir / "tokenizer.json").string();
    gptoss::write_harmony_tokenizer_json(gptoss::default_tiktoken_path(), path);
    return Tokenizer::from_file(dir.string());  // a model directory
  }();
  return tok;
}

bool valid_utf8(const std::string& s) {
  std::string out;
  return gptoss::utf8_decode_lossy(s, out, true) == 0 && out == s;
}

}  // namespace

TEST(Tokenizer, CorpusIsBig) {
  ASSERT_GE(corpus().size(), 250u);
}

TEST(Tokenizer, TiktokenMatchesReference) {
  const auto& tok = o200k();
  for (size_t i = 0; i < corpus().size(); ++i) {
    const auto& c = corpus()[i];
    EXPECT_EQ(tok.encode(c.text, true), c.ids) << "corpus line " << i + 1 << ": " << c.text;
  }
}

TEST(Tokenizer, TokenizerJsonMatchesReference) {
  const auto& tok = o200k_json();
  EXPECT_EQ(tok.vocab_size(), o200k().vocab_size());
  EXPECT_EQ(tok.special_tokens(), o200k().special_tokens());
  for (size_t i = 0; i < corpus().size(); ++i) {
    const auto& c = corpus()[i];
    EXPECT_EQ(tok.encode(c.text, true), c.ids) << "corpus line " << i + 1 << ": " << c.text;
    EXPECT_EQ(tok.encode(c.text, false), o200k().encode(c.text, false)) << "line " << i + 1;
  }
}

TEST(Tokenizer, RoundTrip) {
  const auto& tok = o200k();
  for (const auto& c : corpus()) {
    // The alias <|reserved_200018|> encodes to <|endofprompt|>: its text cannot come back.
    if (c.text.find("<|reserved_200018|>") != std::string::npos) continue;
    EXPECT_EQ(tok.decode(tok.encode(c.text, true)), c.text);
    EXPECT_EQ(tok.decode(tok.encode(c.text, false)), c.text);
    EXPECT_EQ(tok.decode_bytes(tok.encode(c.text, false)), c.text);
  }
}

TEST(Tokenizer, StreamingDecodeEqualsWholeDecode) {
  const auto& tok = o200k();
  gptoss::StreamingDecoder dec(tok);
  for (const auto& c : corpus()) {
    std::string s;
    for (TokenId id : c.ids) {
      std::string part = dec.push(id);
      EXPECT_TRUE(valid_utf8(part));
      s += part;
    }
    s += dec.flush();
    EXPECT_EQ(s, tok.decode(c.ids));
  }
}

TEST(Tokenizer, StreamingDecodeOfRandomTokensNeverBreaksUtf8) {
  const auto& tok = o200k();
  // Tokens that are pieces of multi-byte characters (the bytes 0x80..0xFF and tokens ending in
  // the middle of a character) mixed with ordinary ones.
  std::vector<TokenId> partial;
  for (TokenId id = 0; id < 199998 && partial.size() < 3000; ++id) {
    std::string out;
    std::string_view b = tok.token_bytes(id);
    if (!valid_utf8(std::string(b))) partial.push_back(id);
  }
  ASSERT_GT(partial.size(), 256u);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<TokenId> ids;
    int n = 1 + int(rng() % 40);
    for (int i = 0; i < n; ++i)
      ids.push_back(rng() % 3 ? partial[rng() % partial.size()] : TokenId(rng() % 199998));
    gptoss::StreamingDecoder dec(tok);
    std::string s;
    for (TokenId id : ids) {
      std::string part = dec.push(id);
      ASSERT_TRUE(valid_utf8(part));
      s += part;
    }
    s += dec.flush();
    EXPECT_FALSE(dec.has_pending());
    EXPECT_EQ(s, tok.decode(ids));
    EXPECT_TRUE(valid_utf8(s));
  }
}

TEST(Tokenizer, StreamingDecoderHoldsBackSplitCharacter) {
  const auto& tok = o200k();
  // "💖" is F0 9F 92 96: feed its bytes as single-byte tokens.
  std::string heart = "\xF0\x9F\x92\x96";
  std::vector<TokenId> ids;
  for (char ch : heart) ids.push_back(tok.require_token_id(std::string(1, ch)));
  gptoss::StreamingDecoder dec(tok);
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "");
  EXPECT_EQ(dec.push(ids[2]), "");
  EXPECT_TRUE(dec.has_pending());
  EXPECT_EQ(dec.push(ids[3]), heart);
  EXPECT_EQ(dec.flush(), "");
  // An incomplete character at the end becomes one U+FFFD.
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, Utf8ReplacementFollowsWhatwg) {
  auto dec = [](std::string s) {
    std::string out;
    gptoss::utf8_decode_lossy(s, out, true);
    return out;
  };
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(dec("abc"), "abc");
  EXPECT_EQ(dec("\x80"), R);
  EXPECT_EQ(dec("\xC0\xAF"), R + R);          // overlong lead bytes are invalid
  EXPECT_EQ(dec("\xE0\x80\x80"), R + R + R);  // overlong
  EXPECT_EQ(dec("\xED\xA0\x80"), R + R + R);  // surrogate
  EXPECT_EQ(dec("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(dec("\xF0\x9F\x92"), R);          // truncated: one replacement
  EXPECT_EQ(dec("\xF0\x9F\x92x"), R + "x");
  EXPECT_EQ(dec("\xE2\x82\xAC"), "\xE2\x82\xAC");
  std::string out;
  EXPECT_EQ(gptoss::utf8_decode_lossy("a\xF0\x9F", out, false), 2u);
  EXPECT_EQ(out, "a");
}

TEST(Tokenizer, SpecialTokensByName) {
  const auto& tok = o200k();
  EXPECT_EQ(tok.vocab_size(), 201088u);
  for (const char* name : {"<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                           "<|return|>", "<|call|>", "<|endoftext|>", "<|startoftext|>",
                           "<|endofprompt|>", "<|reserved_201087|>"}) {
    auto id = tok.token_id(name);
    ASSERT_TRUE(id) << name;
    EXPECT_TRUE(tok.is_special(*id)) << name;
    EXPECT_EQ(tok.token_bytes(*id), name);
    EXPECT_EQ(tok.encode(name, true), std::vector<TokenId>{*id});
    auto plain = tok.encode(name, false);
    EXPECT_GT(plain.size(), 1u);
    for (TokenId t : plain) EXPECT_FALSE(tok.is_special(t));
  }
  EXPECT_EQ(tok.special_tokens().size(), 201088u - 199998u);
  EXPECT_FALSE(tok.token_id("<|nonexistent|>"));
  EXPECT_THROW(tok.require_token_id("<|nonexistent|>"), gptoss::Error);
  // Ordinary tokens are found by their bytes.
  auto hello = tok.token_id("hello");
  ASSERT_TRUE(hello);
  EXPECT_FALSE(tok.is_special(*hello));
  EXPECT_EQ(tok.encode("hello"), std::vector<TokenId>{*hello});
  EXPECT_THROW(tok.token_bytes(-1), gptoss::Error);
  EXPECT_THROW(tok.token_bytes(201088), gptoss::Error);
}

TEST(Tokenizer, LongRunsAndOddInput) {
  const auto& tok = o200k();
  for (std::string s : {std::string(20000, ' '), std::string(5000, 'a'), std::string(3000, '\n'),
                        std::string(4000, '7'), std::string(3000, '!') + "\r\n\r\n"}) {
    auto ids = tok.encode(s);
    EXPECT_EQ(tok.decode(ids), s);
  }
  // A huge piece (no pre-tokenizer break) takes the O(n log n) path: this must not hang.
  std::string huge;
  for (int i = 0; i < 200000; ++i) huge += char('a' + (i * 7919) % 26);
  EXPECT_EQ(tok.decode(tok.encode(huge)), huge);
  // Invalid UTF-8 still encodes (byte tokens) and decodes to its bytes.
  std::string bad = "ok \xFF\xFE bytes \xC3 end\xE2\x82";
  auto ids = tok.encode(bad);
  EXPECT_EQ(tok.decode_bytes(ids), bad);
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(Tokenizer, LoadErrorsAreClear) {
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), gptoss::Error);
  auto dir = std::filesystem::path(GPTOSS_BINARY_DIR) / "test_tokenizer_data";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  EXPECT_THROW(Tokenizer::from_file(write("bad.tiktoken", "not base64!! x\n")), gptoss::Error);
  EXPECT_THROW(Tokenizer::from_file(write("bad2.tiktoken", "YQ== notanumber\n")), gptoss::Error);
  EXPECT_THROW(Tokenizer::from_file(write("bad.json", "{\"model\": ")), gptoss::Error);
  EXPECT_THROW(Tokenizer::from_file(write("bad2.json", "{\"model\": {\"type\": \"WordPiece\"}}")),
               gptoss::Error);
  EXPECT_THROW(Tokenizer::from_file(write("bad3.json", R"({"model": {"vocab": {"a": 0, "b": 1},
      "merges": ["a b"]}})")), gptoss::Error);  // merge result "ab" is not in the vocab
}

// What a fuzzing pass found (fortieth session): each loaded, asked for gigabytes, or hung.
TEST(Tokenizer, LoadErrorsNameTheFileAndTheProblem) {
  auto dir = std::filesystem::path(GPTOSS_BINARY_DIR) / "test_tokenizer_data";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  auto error_of = [](const std::string& path) -> std::string {
    try {
      Tokenizer::from_file(path);
    } catch (const gptoss::Error& e) {
      return e.what();
    }
    ADD_FAILURE() << path << " loaded";
    return "";
  };
  // A rank of 10^9 sized the tables for 10^9 tokens (~32 GB); two tokens of one rank loaded.
  EXPECT_NE(error_of(write("huge.tiktoken", "aGk= 999999999\n")).find("bad rank"), std::string::npos);
  EXPECT_NE(error_of(write("dup.tiktoken", "YQ== 0\nYg== 0\n")).find("given twice"), std::string::npos);
  // An id written as a string was dropped silently (the error then blamed a merge).
  const std::string sid = error_of(write("strid.json", R"({"model": {"type": "BPE", "vocab": {"a": "0", "b": 1}, "merges": []}})"));
  EXPECT_NE(sid.find("not an integer"), std::string::npos) << sid;
  EXPECT_NE(sid.find("strid.json"), std::string::npos) << sid;
  const std::string big = error_of(write("bigid.json", R"({"model": {"type": "BPE", "vocab": {"a": 100000000}, "merges": []}})"));
  EXPECT_NE(big.find("bad id"), std::string::npos) << big;
  // A directory or a FIFO named as the file: an error naming it, not bad_alloc or a hang.
  auto model = dir / "model_with_dir";  // (a directory named as the tokenizer is a model directory)
  std::filesystem::create_directories(model / "tokenizer.json");
  EXPECT_NE(error_of(model.string()).find("is a directory"), std::string::npos);
  auto fifo = (dir / "fifo.tiktoken").string();
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of(fifo).find("not a regular file"), std::string::npos);
}

// A tiny hand-made tokenizer.json: merges decide, not vocab order.
TEST(Tokenizer, TokenizerJsonUsesMergePriority) {
  auto dir = std::filesystem::path(GPTOSS_BINARY_DIR) / "test_tokenizer_data";
  std::filesystem::create_directories(dir);
  auto path = (dir / "tiny.json").string();
  // "abc": merges say (b c) before (a b): so a + bc, not ab + c. "Ġ" is the space byte.
  std::ofstream(path) << R"({
    "added_tokens": [{"id": 9, "content": "<|end|>", "special": true}],
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": " ?[a-z]+|\\s+"}, "behavior": "Isolated"},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "bc": 5,
              "abc": 6, "Ġa": 7},
              "merges": [["b", "c"], ["a", "b"], ["Ġ", "a"]]}})";
  auto tok = Tokenizer::from_file(path);
  EXPECT_EQ(tok.vocab_size(), 10u);
  EXPECT_EQ(tok.encode("abc"), (std::vector<TokenId>{0, 5}));  // "abc" (6) is not reachable
  EXPECT_EQ(tok.encode("ab"), (std::vector<TokenId>{4}));
  // (a b) outranks (Ġ a): " ab" is " " + "ab"; " ac" is " a" + "c".
  EXPECT_EQ(tok.encode(" ab<|end|>", true), (std::vector<TokenId>{3, 4, 9}));
  EXPECT_EQ(tok.encode(" ac"), (std::vector<TokenId>{7, 2}));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{7, 1, 9}), " ab<|end|>");
  EXPECT_EQ(tok.token_id("<|end|>"), 9);
  EXPECT_TRUE(tok.is_special(9));
  EXPECT_FALSE(tok.is_special(6));

  // With ignore_merges, a piece that is a vocab entry is that token ("abc" = 6).
  std::string text = read_text(path);
  text.replace(text.find("\"type\": \"BPE\""), 13, "\"type\": \"BPE\", \"ignore_merges\": true");
  std::ofstream((dir / "tiny_ignore.json").string()) << text;
  auto tok2 = Tokenizer::from_file((dir / "tiny_ignore.json").string());
  EXPECT_EQ(tok2.encode("abc"), (std::vector<TokenId>{6}));
  EXPECT_EQ(tok2.encode("abca"), (std::vector<TokenId>{0, 5, 0}));
}
