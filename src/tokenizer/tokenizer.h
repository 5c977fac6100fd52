#pragma once
// o200k_harmony byte-level BPE tokenizer.
//
// Loads a Hugging Face `tokenizer.json` (byte-level BPE: vocab + merges, Split pre-tokenizer with
// the o200k regex, added/special tokens) or a tiktoken ranks file (`o200k_base.tiktoken`, one
// base64 token and its rank per line; the o200k_harmony specials are added by name). Both give
// the same ids. Pre-tokenization uses PCRE2 (Unicode classes, lookahead).
//
// Special tokens are looked up by name (`token_id("<|end|>")`); no id is hard-coded in callers.
// A Tokenizer is cheap to copy (shared immutable state) and safe to use from many threads.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gptoss {

using TokenId = int32_t;

class Tokenizer {
 public:
  // `path` is a tokenizer.json, a *.tiktoken ranks file, or a model directory holding
  // tokenizer.json. Throws gptoss::Error on a missing or malformed file.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_tokenizer_json(const std::string& path);
  // A tiktoken ranks file plus the o200k_harmony special tokens.
  static Tokenizer from_tiktoken(const std::string& path);
  // The o200k_harmony tokenizer from default_tiktoken_path().
  static Tokenizer o200k_harmony();

  // Encodes UTF-8 text. With allow_special, the text of any special token (e.g. "<|start|>")
  // anywhere in `text` becomes that token; otherwise it is encoded as ordinary text.
  std::vector<TokenId> encode(std::string_view text, bool allow_special = false) const;
  // Raw bytes of the tokens concatenated (may be invalid UTF-8 when cut mid-character).
  std::string decode_bytes(std::span<const TokenId> ids) const;
  // Valid UTF-8: invalid sequences become U+FFFD (as the WHATWG TextDecoder does).
  std::string decode(std::span<const TokenId> ids) const;
  // Bytes of one token (a special token's bytes are its name). Throws on an unknown id.
  std::string_view token_bytes(TokenId id) const;
  // One token as Hugging Face's convert_ids_to_tokens spells it: its bytes in the GPT-2
  // byte-level alphabet ("Ġhello" for " hello"); a special token's name. Throws on an unknown id.
  std::string token_piece(TokenId id) const;

  // Id of a special token by name (e.g. "<|return|>"), or of an ordinary token whose bytes are
  // exactly `name`; nullopt when none.
  std::optional<TokenId> token_id(std::string_view name) const;
  // Like token_id but throws gptoss::Error naming the token when absent.
  TokenId require_token_id(std::string_view name) const;
  bool is_special(TokenId id) const;
  // True when `id` is a token of this vocabulary (ordinary or special).
  bool has_token(TokenId id) const;
  // One past the largest id (201088 for o200k_harmony).
  size_t vocab_size() const;
  // All special tokens, (name, id), in id order.
  const std::vector<std::pair<std::string, TokenId>>& special_tokens() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamingDecoder;
};

// Incremental decode: push ids one at a time and get back the text they complete. Never returns
// a partial UTF-8 sequence; bytes that can never become valid are emitted as U+FFFD. The
// concatenation of every push() and the final flush() equals Tokenizer::decode(all ids).
// A special token decodes to its name (callers that stream to users skip is_special ids).
// push() throws gptoss::Error on an id outside the vocabulary.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tok);
  std::string push(TokenId id);
  // Ends the stream: pending incomplete bytes become U+FFFD. The decoder can then be reused.
  std::string flush();
  // True when bytes of an incomplete character are held back.
  bool has_pending() const { return !pending_.empty(); }

 private:
  Tokenizer tok_;
  std::string pending_;
};

// The o200k_base.tiktoken file: $GPTOSS_TIKTOKEN if set, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/gptoss/o200k_base.tiktoken. Throws gptoss::Error (telling the
// user to run scripts/setup.sh) when the file is absent.
std::string default_tiktoken_path();

// The o200k_harmony special tokens (name, id), in id order.
std::vector<std::pair<std::string, TokenId>> o200k_harmony_specials();

// Writes a Hugging Face tokenizer.json for o200k_harmony (vocab and merges converted from the
// tiktoken ranks, the o200k Split pre-tokenizer, ByteLevel decoder, harmony added tokens).
void write_harmony_tokenizer_json(const std::string& tiktoken_path, const std::string& out_path);

}  // namespace gptoss
