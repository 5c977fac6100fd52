#pragma once
// The byte-level matcher of a compiled JSON grammar: a pushdown automaton whose state is a small
// stack of frames (one per open value). advance() takes one byte of output; it refuses any byte
// that could not continue a value matching the grammar, and it never accepts a byte after
// which no completion exists (no dead ends), so a token mask built from it never strands the
// model. Whitespace between tokens is allowed but bounded (kMaxWhitespace bytes a run), numbers
// are bounded (kMaxDigits digits a part), so a constrained model cannot ramble forever inside
// structure.
#include <cstdint>
#include <string>

#include "structured/json_grammar.h"

namespace gptoss::structured {

constexpr int kMaxDepth = 32;
constexpr int kMaxWhitespace = 16;
constexpr int kMaxDigits = 16;

struct Frame {
  int32_t node = 0;
  uint32_t pos = 0;    // literal/key trie node, number digits, string UTF-8 or format state
  uint64_t seen = 0;   // object: properties given so far
  uint16_t count = 0;  // array: items so far; object: the property whose value comes next; string: characters (with length limits)
  uint8_t mode = 0;    // phase within the value (per kind)
  uint8_t aux = 0;     // whitespace run; string: \u digits or the format's previous byte
};

struct MatchState {
  int depth = 0;  // 0: the value is complete
  Frame f[kMaxDepth];
  MatchState& operator=(const MatchState& o) {
    depth = o.depth;
    for (int i = 0; i < depth; ++i) f[i] = o.f[i];
    return *this;
  }
  MatchState() = default;
  MatchState(const MatchState& o) { *this = o; }
  // Bytes that identify the state (the mask cache key).
  std::string key() const;
};

class JsonMatcher {
 public:
  explicit JsonMatcher(const Grammar& g) : g_(g) {}
  MatchState start() const;
  // Takes one byte; false (state unspecified) when the byte cannot continue a valid value.
  bool advance(MatchState& s, uint8_t byte) const;
  bool advance(MatchState& s, std::string_view bytes) const {
    for (unsigned char c : bytes)
      if (!advance(s, c)) return false;
    return true;
  }
  // True when the output may end here (the value is complete).
  bool can_end(const MatchState& s) const;
  // True when the top value is a free string in its body: every byte but '"', '\\' and control
  // bytes only moves its UTF-8 state (the mask's fast path).
  bool in_free_string(const MatchState& s) const;
  // In a string: the characters it may still take (maxLength less those so far; UINT32_MAX: no
  // limit). The mask's fast path holds only where every token fits.
  uint32_t string_room(const MatchState& s) const;
  const Grammar& grammar() const { return g_; }

 private:
  enum Step { kReject, kConsumed, kConsumedPop, kPopRetry, kRetry };
  Step step(MatchState& s, uint8_t b) const;
  Step step_string(Frame& f, const GrammarNode& n, uint8_t b) const;
  Step step_number(Frame& f, bool integer, uint8_t b) const;
  Step step_object(MatchState& s, Frame& f, const GrammarNode& n, uint8_t b) const;
  Step step_array(MatchState& s, Frame& f, const GrammarNode& n, uint8_t b) const;
  bool push(MatchState& s, int32_t node) const;
  void pop(MatchState& s) const;
  const Grammar& g_;
};

// UTF-8 validation state inside a string: 0 at a character boundary, else what the next byte
// must be (range) and how many continuation bytes are still due.
uint32_t utf8_next(uint32_t state, uint8_t b, bool* ok);

}  // namespace gptoss::structured
