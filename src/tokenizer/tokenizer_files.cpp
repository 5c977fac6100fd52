// The tokenizer's files: reading .tiktoken and tokenizer.json (by SAX), finding the default
// table, building the tables (Tokenizer::Impl::finish), and writing the o200k_harmony
// tokenizer.json. Encoding and decoding are tokenizer.cpp's.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace gptoss {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Loading.

namespace {

// The largest token id a tokenizer file may give (o200k's are below 2^18): the tables are sized by
// the largest id, so one id of 10^9 asked for ~32 GB.
constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;

std::string read_file(const std::string& path) {
  try {
    return read_regular_file(path);  // (a directory or a FIFO: an error naming it, not a hang)
  } catch (const Error& e) {
    throw Error(std::string("tokenizer: ") + e.what());
  }
}

int b64val(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool b64decode(std::string_view s, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : s) {
    if (ch == '=') break;
    int v = b64val(static_cast<unsigned char>(ch));
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return true;
}

}  // namespace

void Tokenizer::Impl::finish(const std::vector<ByteMap::Entry>& entries,
                             std::vector<std::pair<std::string, TokenId>> all,
                             std::vector<std::pair<std::string, TokenId>> specials_in) {
  ranks.build(entries);
  size_t n = 0;
  for (auto& [b, id] : all) n = std::max<size_t>(n, size_t(id) + 1);
  for (auto& [name, id] : specials_in) n = std::max<size_t>(n, size_t(id) + 1);
  bytes_of.assign(n, std::string());
  present.assign(n, 0);
  special.assign(n, 0);
  for (auto& [b, id] : all) {
    if (id < 0) throw Error("tokenizer: negative token id");
    present[id] = 1;
    // token_id() looks in `ranks` first: only tokens BPE cannot produce need another entry.
    if (ranks.id(b) != uint32_t(id)) id_of_bytes.emplace(b, id);
    bytes_of[id] = std::move(b);
  }
  std::sort(specials_in.begin(), specials_in.end(),
            [](auto& a, auto& b) { return a.second < b.second; });
  for (auto& [name, id] : specials_in) {
    if (id < 0) throw Error("tokenizer: negative token id");
    if (name.empty()) throw Error("tokenizer: empty special token");
    bytes_of[id] = name;
    present[id] = 1;
    special[id] = 1;
    specials_by_name[name] = id;
    if (std::find(special_lengths.begin(), special_lengths.end(), name.size()) ==
        special_lengths.end())
      special_lengths.push_back(name.size());
  }
  // The references (openai/harmony, tiktoken with the o200k_harmony table) also accept
  // "<|reserved_ID|>" for the named specials from 200013 up (i.e. <|reserved_200018|> is
  // <|endofprompt|>). Accept the same aliases when no token has that name.
  for (auto& [name, id] : specials_in) {
    if (id < 200013 || id >= 201088) continue;
    std::string alias = "<|reserved_" + std::to_string(id) + "|>";
    if (specials_by_name.emplace(alias, id).second &&
        std::find(special_lengths.begin(), special_lengths.end(), alias.size()) ==
            special_lengths.end())
      special_lengths.push_back(alias.size());
  }
  std::sort(special_lengths.begin(), special_lengths.end());
  specials = std::move(specials_in);
  // Common prefix of every special name ("<|"): the scan looks for it first.
  special_prefix.clear();
  if (!specials.empty()) {
    special_prefix = specials[0].first;
    for (auto& [name, id] : specials) {
      size_t k = 0;
      while (k < special_prefix.size() && k < name.size() && special_prefix[k] == name[k]) ++k;
      special_prefix.resize(k);
    }
  }
}

std::vector<std::pair<std::string, TokenId>> o200k_harmony_specials() {
  std::vector<std::pair<std::string, TokenId>> s;
  const std::pair<const char*, TokenId> named[] = {
      {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999}, {"<|return|>", 200002},
      {"<|constrain|>", 200003},   {"<|channel|>", 200005},   {"<|start|>", 200006},
      {"<|end|>", 200007},         {"<|message|>", 200008},   {"<|call|>", 200012},
      {"<|endofprompt|>", 200018}};
  for (TokenId id = 199998; id < 201088; ++id) {
    std::string name;
    for (auto& [n, i] : named)
      if (i == id) name = n;
    if (name.empty()) name = "<|reserved_" + std::to_string(id) + "|>";
    s.emplace_back(name, id);
  }
  return s;
}

namespace {
// Parses a tiktoken ranks file into (bytes, rank).
std::vector<std::pair<std::string, uint32_t>> read_tiktoken(const std::string& path) {
  std::string data = read_file(path);
  std::vector<std::pair<std::string, uint32_t>> out;
  out.reserve(200000);
  size_t pos = 0, line_no = 0;
  std::string bytes;
  std::unordered_set<uint32_t> ranks_seen;
  while (pos < data.size()) {
    size_t eol = data.find('\n', pos);
    if (eol == std::string::npos) eol = data.size();
    std::string_view line(data.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    auto where = [&] { return "tokenizer: " + path + ":" + std::to_string(line_no) + ": "; };
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos || !b64decode(line.substr(0, sp), bytes) || bytes.empty())
      throw Error(where() + "expected '<base64 token> <rank>'");
    std::string_view rs = line.substr(sp + 1);
    uint64_t rank = 0;
    if (rs.empty()) throw Error(where() + "no rank");
    for (char c : rs) {
      if (c < '0' || c > '9' || rank > uint64_t(kMaxTokenId)) throw Error(where() + "bad rank");
      rank = rank * 10 + uint64_t(c - '0');
    }
    if (rank > uint64_t(kMaxTokenId)) throw Error(where() + "rank " + std::to_string(rank) + " is beyond 2^24 - 1");
    if (!ranks_seen.insert(uint32_t(rank)).second) throw Error(where() + "rank " + std::to_string(rank) + " given twice");
    out.emplace_back(bytes, uint32_t(rank));
  }
  if (out.empty()) throw Error("tokenizer: " + path + " holds no tokens");
  return out;
}
}  // namespace

Tokenizer Tokenizer::from_tiktoken(const std::string& path) {
  auto ranks = read_tiktoken(path);
  auto impl = std::make_shared<Impl>();
  std::vector<ByteMap::Entry> entries;
  std::vector<std::pair<std::string, TokenId>> all;
  entries.reserve(ranks.size());
  all.reserve(ranks.size());
  uint32_t max_rank = 0;
  for (auto& [b, r] : ranks) {
    entries.push_back({b, r, r});
    all.emplace_back(b, TokenId(r));
    max_rank = std::max(max_rank, r);
  }
  impl->regex = std::make_shared<Regex>(kO200kPattern);
  // The o200k_harmony specials sit above the ranks (another ranks file keeps those above its own).
  std::vector<std::pair<std::string, TokenId>> keep;
  for (auto& s : o200k_harmony_specials())
    if (uint32_t(s.second) > max_rank) keep.push_back(s);
  impl->finish(entries, std::move(all), std::move(keep));
  return Tokenizer(std::move(impl));
}

namespace {

// What the loader needs from a tokenizer.json, read with nlohmann's SAX interface (no DOM: the
// o200k file has 200k vocab entries and 450k merges).
struct TokenizerJsonSax : nlohmann::json_sax<nlohmann::json> {
  struct Frame {
    bool obj;
    std::string key;
    size_t items = 0;
  };
  std::vector<Frame> st;
  bool have_model = false, have_vocab = false, ignore_merges = false;
  std::string model_type = "BPE";
  std::vector<std::pair<std::string, int64_t>> vocab;  // byte-level strings
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::pair<std::string, int64_t>> added;
  std::optional<std::string> regex;
  std::string problem;  // first structural problem
  std::vector<std::string> pair;  // a merge given as ["a", "b"]
  std::string added_content;
  int64_t added_id = -1;
  bool added_has_content = false;
  std::string error;

  bool at(size_t depth, const char* k0, const char* k1 = nullptr) const {
    if (st.size() != depth) return false;
    if (st[0].key != k0) return false;
    return !k1 || (st.size() > 1 && st[1].key == k1);
  }
  // The value in hand is a vocab entry's id, or an added token's.
  bool at_vocab_id() const { return at(3, "model", "vocab") && st[2].obj; }
  bool at_added_id() const { return at(3, "added_tokens") && st[2].obj && st[2].key == "id"; }
  bool value_number(int64_t v) {
    if (at_vocab_id()) vocab.emplace_back(st[2].key, v);
    else if (at_added_id()) added_id = v;
    return true;
  }
  bool value_string(std::string& v) {
    if (at_vocab_id()) {  // ("104" where 104 belongs: once dropped silently)
      if (problem.empty()) problem = "vocab entry " + st[2].key + " has an id that is not an integer";
    } else if (at_added_id()) {
      if (problem.empty()) problem = "added token id that is not an integer";
    } else if (at(2, "model", "type")) {
      model_type = v;
    } else if (at(3, "model", "merges") && !st[2].obj) {
      size_t sp = v.find(' ');
      if (sp == std::string::npos) {
        if (problem.empty()) problem = "bad merge '" + v + "'";
      } else {
        merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      }
    } else if (at(4, "model", "merges") && !st[3].obj) {
      pair.push_back(std::move(v));
    } else if (at(3, "added_tokens") && st[2].obj && st[2].key == "content") {
      added_content = v;
      added_has_content = true;
    } else if (!st.empty() && st[0].key == "pre_tokenizer" && st.back().obj &&
               st.back().key == "Regex" && !regex) {
      regex = v;
    }
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool v) override {
    if (at(2, "model", "ignore_merges")) ignore_merges = v;
    return true;
  }
  bool number_integer(number_integer_t v) override { return value_number(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return value_number(v > uint64_t(INT64_MAX) ? -1 : int64_t(v));
  }
  bool number_float(number_float_t, const string_t& text) override {
    if ((at_vocab_id() || at_added_id()) && problem.empty()) problem = "token id " + text + " is not an integer";
    return true;
  }
  bool string(string_t& v) override { return value_string(v); }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    if (at(1, "model")) have_model = true;
    if (at(2, "model", "vocab")) have_vocab = true;
    if (at(2, "added_tokens")) added_id = -1, added_has_content = false;
    st.push_back({true, ""});
    return true;
  }
  bool key(string_t& k) override {
    st.back().key = k;
    return true;
  }
  bool end_object() override {
    st.pop_back();
    if (at(2, "added_tokens")) {
      if (added_id < 0 || !added_has_content) {
        if (problem.empty()) problem = "added token without id or content";
      } else {
        added.emplace_back(added_content, added_id);
      }
    }
    return true;
  }
  bool start_array(std::size_t) override {
    if (at(3, "model", "merges")) pair.clear();
    st.push_back({false, ""});
    return true;
  }
  bool end_array() override {
    st.pop_back();
    if (at(3, "model", "merges")) {
      if (pair.size() != 2) {
        if (problem.empty()) problem = "bad merge entry";
      } else {
        merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
      }
    }
    return true;
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
    error = std::string(e.what()) + " (byte " + std::to_string(pos) + ")";
    return false;
  }
};

}  // namespace

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path) {
  auto bad = [&](const std::string& what) { return Error("tokenizer: " + path + ": " + what); };
  TokenizerJsonSax sax;
  {
    std::string text = read_file(path);
    if (!nlohmann::json::sax_parse(text, &sax) || !sax.error.empty())
      throw bad("invalid JSON: " + sax.error);
  }
  if (!sax.have_model) throw bad("no model");
  if (sax.model_type != "BPE") throw bad("model.type must be BPE");
  if (!sax.have_vocab) throw bad("model.vocab missing");
  if (!sax.problem.empty()) throw bad(sax.problem);
  auto impl = std::make_shared<Impl>();
  std::string bytes;
  std::vector<std::pair<std::string, TokenId>> all;
  all.reserve(sax.vocab.size());
  std::unordered_map<std::string, TokenId> vocab;  // bytes -> id
  vocab.reserve(sax.vocab.size() * 2);
  for (auto& [key, id] : sax.vocab) {
    if (!bl_to_bytes(key, bytes) || bytes.empty())
      throw bad("vocab entry outside the byte-level alphabet: " + key);
    if (id < 0 || id > kMaxTokenId) throw bad("bad id " + std::to_string(id) + " for vocab entry " + key + " (ids run 0 to 2^24 - 1)");
    vocab.emplace(bytes, TokenId(id));
    all.emplace_back(bytes, TokenId(id));
  }
  sax.vocab.clear();
  // Merge priority: a byte string's rank is the index of the first merge producing it (merges
  // rank after the 256 single bytes). BPE then only produces single bytes and merge results.
  std::vector<ByteMap::Entry> entries;
  std::unordered_map<std::string, uint32_t> merged;
  merged.reserve(sax.merges.size() * 2);
  std::string a, b;
  uint32_t idx = 0;
  for (auto& [left, right] : sax.merges) {
    if (!bl_to_bytes(left, a) || !bl_to_bytes(right, b))
      throw bad("merge outside the byte-level alphabet: " + left + " " + right);
    if (!vocab.count(a) || !vocab.count(b)) throw bad("merge of unknown tokens: " + left + " " + right);
    std::string ab = a + b;
    if (!vocab.count(ab)) throw bad("merge result not in vocab: " + left + " " + right);
    merged.emplace(std::move(ab), 256 + idx++);
  }
  sax.merges.clear();
  entries.reserve(vocab.size());
  std::vector<ByteMap::Entry> whole;  // with ignore_merges: tokens no merge produces
  for (auto& [bs, id] : vocab) {
    if (auto it = merged.find(bs); it != merged.end())
      entries.push_back({bs, it->second, uint32_t(id)});
    else if (bs.size() == 1)
      entries.push_back({bs, uint32_t(uint8_t(bs[0])), uint32_t(id)});
    else if (sax.ignore_merges)
      whole.push_back({bs, ByteMap::kMissing, uint32_t(id)});
  }
  // ignore_merges: a pre-tokenized piece that is a vocab entry is that token, merges or not.
  if (!whole.empty()) impl->whole.build(whole);
  std::vector<std::pair<std::string, TokenId>> specials;
  for (auto& [content, id] : sax.added) {
    if (id > kMaxTokenId) throw bad("bad id " + std::to_string(id) + " for added token " + content + " (ids run 0 to 2^24 - 1)");
    specials.emplace_back(content, TokenId(id));
  }
  try {  // (their errors name the file too)
    // Pre-tokenizer: the Split regex if there is one, else o200k's.
    impl->regex = std::make_shared<Regex>(sax.regex ? *sax.regex : std::string(kO200kPattern));
    impl->finish(entries, std::move(all), std::move(specials));
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.rfind("tokenizer: ", 0) == 0) what = what.substr(11);
    throw bad(what);
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    fs::path p = fs::path(path) / "tokenizer.json";
    if (!fs::exists(p))
      throw Error("tokenizer: model directory " + path + " has no tokenizer.json");
    return from_tokenizer_json(p.string());
  }
  if (!fs::exists(path, ec)) throw Error("tokenizer: no such file: " + path);
  if (path.size() >= 9 && path.compare(path.size() - 9, 9, ".tiktoken") == 0)
    return from_tiktoken(path);
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0)
    return from_tokenizer_json(path);
  // Sniff: JSON starts with '{'.
  const std::string text = read_file(path);
  const size_t first = text.find_first_not_of(" \t\r\n");
  return first != std::string::npos && text[first] == '{' ? from_tokenizer_json(path) : from_tiktoken(path);
}

std::string default_tiktoken_path() {
  if (const char* e = std::getenv("GPTOSS_TIKTOKEN"); e && *e) {
    if (!fs::exists(e))
      throw Error(std::string("tokenizer: GPTOSS_TIKTOKEN=") + e + " does not exist");
    return e;
  }
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    base = x;
  else if (const char* h = std::getenv("HOME"); h && *h)
    base = std::string(h) + "/.cache";
  else
    base = ".cache";
  std::string p = base + "/gptoss/o200k_base.tiktoken";
  if (!fs::exists(p))
    throw Error("tokenizer: the o200k vocabulary " + p +
                " is missing; run scripts/setup.sh (or set GPTOSS_TIKTOKEN)");
  return p;
}

Tokenizer Tokenizer::o200k_harmony() { return from_tiktoken(default_tiktoken_path()); }

// ---------------------------------------------------------------------------------------------
// tokenizer.json writer.

void write_harmony_tokenizer_json(const std::string& tiktoken_path, const std::string& out_path) {
  auto ranks = read_tiktoken(tiktoken_path);
  std::vector<std::string> tokens;  // by rank
  std::unordered_map<std::string, uint32_t> rank;
  for (auto& [b, r] : ranks) {
    if (tokens.size() <= r) tokens.resize(r + 1);
    tokens[r] = b;
    rank.emplace(b, r);
  }
  // Merges, as Hugging Face's tiktoken converter makes them: every split (l, r) of a token
  // whose halves are both tokens, ordered by the token's rank, then by the halves' ranks.
  struct M {
    uint32_t r, lr, rr;
    uint32_t split;
  };
  std::vector<M> merges;
  for (uint32_t r = 0; r < tokens.size(); ++r) {
    const std::string& t = tokens[r];
    if (t.size() < 2) continue;
    size_t first = merges.size();
    for (size_t i = 1; i < t.size(); ++i) {
      auto l = rank.find(t.substr(0, i));
      if (l == rank.end()) continue;
      auto rr = rank.find(t.substr(i));
      if (rr == rank.end()) continue;
      merges.push_back({r, l->second, rr->second, uint32_t(i)});
    }
    std::sort(merges.begin() + first, merges.end(),
              [](const M& a, const M& b) { return std::tie(a.lr, a.rr) < std::tie(b.lr, b.rr); });
  }
  std::ofstream f(out_path, std::ios::binary);
  if (!f) throw Error("tokenizer: cannot write " + out_path);
  auto q = [](const std::string& s) { return nlohmann::json(s).dump(); };
  f << "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  f << "  \"added_tokens\": [";
  bool first = true;
  for (auto& [name, id] : o200k_harmony_specials()) {
    f << (first ? "\n" : ",\n") << "    {\"id\": " << id << ", \"content\": " << q(name)
      << ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false,"
         " \"special\": true}";
    first = false;
  }
  f << "\n  ],\n  \"normalizer\": null,\n";
  f << "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n"
       "    {\"type\": \"Split\", \"pattern\": {\"Regex\": "
    << q(kO200kPattern)
    << "}, \"behavior\": \"Isolated\", \"invert\": false},\n"
       "    {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true,"
       " \"use_regex\": false}]},\n";
  f << "  \"post_processor\": null,\n";
  f << "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true,"
       " \"use_regex\": true},\n";
  f << "  \"model\": {\n    \"type\": \"BPE\", \"dropout\": null, \"unk_token\": null,"
       " \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null,"
       " \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n";
  f << "    \"vocab\": {";
  for (uint32_t r = 0; r < tokens.size(); ++r)
    f << (r ? ",\n      " : "\n      ") << q(bytes_to_bl(tokens[r])) << ": " << r;
  f << "\n    },\n    \"merges\": [";
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& t = tokens[merges[i].r];
    f << (i ? ",\n      " : "\n      ") << "[" << q(bytes_to_bl(t.substr(0, merges[i].split)))
      << ", " << q(bytes_to_bl(t.substr(merges[i].split))) << "]";
  }
  f << "\n    ]\n  }\n}\n";
  if (!f) throw Error("tokenizer: failed writing " + out_path);
}

}  // namespace gptoss
