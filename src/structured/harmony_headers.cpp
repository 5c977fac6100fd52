#include "structured/harmony_headers.h"

namespace gptoss::structured {

namespace {
// A special token inside a spelled form: 0xFF then a letter. Form text never holds 0xFF (channel
// words and function names are ASCII), and text tokens holding it are refused, so a code is
// never confused with text.
constexpr char kCode = '\xFF';
const std::string kStart = "\xFF" "s", kChannel = "\xFF" "c", kMessage = "\xFF" "m", kConstrain = "\xFF" "k";

bool has_prefix(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
}  // namespace

HarmonyHeaders::HarmonyHeaders(const HeaderRules& rules, const HarmonyTokenIds& ids,
                               std::shared_ptr<const TokenVocabulary> vocab)
    : ids_(ids), vocab_(std::move(vocab)) {
  auto add = [&](const std::string& body, Meaning m) {
    first_.emplace(body, m);
    later_.emplace(kStart + "assistant" + body, std::move(m));
  };
  add(kChannel + "analysis" + kMessage, {Kind::kAnalysis, {}});
  if (rules.final_channel) add(kChannel + "final" + kMessage, {Kind::kFinal, {}});
  if (rules.preambles) add(kChannel + "commentary" + kMessage, {Kind::kPreamble, {}});
  for (const std::string& name : rules.functions) {
    const std::string to = " to=functions." + name;
    for (const std::string& type : {" " + kConstrain + "json", kConstrain + "json", std::string(" json"), std::string()}) {
      add(kChannel + "commentary" + to + type + kMessage, {Kind::kCall, name});
      add(to + kChannel + "commentary" + type + kMessage, {Kind::kCall, name});
    }
  }
}

std::optional<std::string> HarmonyHeaders::spell(int32_t t) const {
  if (t == ids_.start) return kStart;
  if (t == ids_.channel) return kChannel;
  if (t == ids_.message) return kMessage;
  if (t == ids_.constrain) return kConstrain;
  if (t < 0 || size_t(t) >= vocab_->size() || vocab_->special(t)) return std::nullopt;
  std::string_view b = vocab_->bytes(t);
  if (b.empty() || b.find(kCode) != std::string_view::npos) return std::nullopt;
  return std::string(b);
}

void HarmonyHeaders::allowed(const Cursor& c, TokenBitset& bits) const {
  const auto& f = forms(c);
  std::vector<int32_t> ids;
  std::string_view last_run;
  for (auto it = f.lower_bound(c.spelled); it != f.end() && has_prefix(it->first, c.spelled); ++it) {
    const std::string_view rest = std::string_view(it->first).substr(c.spelled.size());
    if (rest.empty()) continue;
    if (rest[0] == kCode) {
      const char which = rest.size() > 1 ? rest[1] : 0;
      const int32_t id = which == 's' ? ids_.start : which == 'c' ? ids_.channel : which == 'm' ? ids_.message : ids_.constrain;
      if (id >= 0 && size_t(id) < bits.words.size() * 64) bits.set(size_t(id));
      continue;
    }
    // Text up to the form's next special token: every token spelling a prefix of it.
    const std::string_view run = rest.substr(0, rest.find(kCode));
    if (run == last_run) continue;
    last_run = run;
    ids.clear();
    vocab_->tokens_prefixing(run, ids);
    for (int32_t id : ids)
      if (size_t(id) < bits.words.size() * 64) bits.set(size_t(id));
  }
}

bool HarmonyHeaders::advance(Cursor& c, int32_t t, std::optional<Meaning>* done) const {
  const auto piece = spell(t);
  if (!piece) return false;
  std::string next = c.spelled + *piece;
  const auto& f = forms(c);
  auto it = f.lower_bound(next);
  if (it == f.end() || !has_prefix(it->first, next)) return false;
  c.spelled = std::move(next);
  // <|message|> ends every form and appears nowhere else in one, so here the form is whole.
  if (t == ids_.message && it->first == c.spelled && done) *done = it->second;
  return true;
}

std::string HarmonyHeaders::readable(const Cursor& c) const {
  std::string out;
  for (size_t i = 0; i < c.spelled.size(); ++i) {
    if (c.spelled[i] != kCode || i + 1 >= c.spelled.size()) {
      out += c.spelled[i];
      continue;
    }
    const char which = c.spelled[++i];
    out += which == 's' ? "<|start|>" : which == 'c' ? "<|channel|>" : which == 'm' ? "<|message|>" : "<|constrain|>";
  }
  return out;
}

}  // namespace gptoss::structured
