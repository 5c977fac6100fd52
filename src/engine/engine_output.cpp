// The engine's output side: a sequence's new token appended and checked (stop tokens, stop
// strings, max_tokens, max_model_len, the structured-output constraint), its text released up to
// what can no longer change (a possible stop string's prefix and a cut UTF-8 character held back),
// and the events queued by a step pushed to their request streams (on the delivery thread when
// the loop overlaps steps). RequestStream, the consumer's end, is here too.
#include <algorithm>
#include <string>

#include "engine/engine.h"

namespace gptoss {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    default: return "";
  }
}

std::optional<EngineEvent> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, timeout, [&] { return !q_.empty(); })) return std::nullopt;
  EngineEvent ev = std::move(q_.front());
  q_.pop_front();
  return ev;
}

void RequestStream::cancel() {
  if (cancelled_.exchange(true)) return;
  sig_->notify();
}

void RequestStream::set_listener(std::function<void()> fn) {
  std::shared_ptr<const std::function<void()>> l;
  if (fn) l = std::make_shared<const std::function<void()>>(std::move(fn));
  bool ready;
  {
    std::lock_guard<std::mutex> g(mu_);
    listener_ = l;
    ready = !q_.empty();
  }
  if (l && ready) (*l)();
}

void RequestStream::push(EngineEvent ev) {
  if (ev.finished) finished_ = true;
  std::shared_ptr<const std::function<void()>> l;
  {
    std::lock_guard<std::mutex> g(mu_);
    q_.push_back(std::move(ev));
    l = listener_;
  }
  cv_.notify_all();
  if (l) (*l)();  // outside the lock: the listener may call next() on another thread at once
}

size_t Engine::safe_text_end(const Sequence& s) const {
  size_t end = s.text.size();
  // hold back a suffix that may begin a stop string
  size_t hold = 0;
  for (const auto& st : s.sp.stop) {
    for (size_t k = std::min(st.size() - 1, s.text.size()); k > hold; --k)
      if (s.text.compare(s.text.size() - k, k, st, 0, k) == 0) {
        hold = k;
        break;
      }
  }
  end -= hold;
  // hold back an incomplete UTF-8 sequence
  size_t i = end, back = 0;
  while (i > s.text_sent && back < 4) {
    unsigned char c = s.text[i - 1];
    ++back;
    --i;
    if ((c & 0xC0) != 0x80) {  // lead byte or ASCII
      int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      if (int(back) < len) end = i;
      break;
    }
  }
  return std::max(end, s.text_sent);
}

bool Engine::at_length_limit(const Sequence& s) const {
  return s.output_len() >= s.sp.max_tokens || int(s.tokens.size()) >= max_model_len_;
}

bool Engine::is_stop_token(const Sequence& s, int32_t tok) const {
  if (std::find(s.sp.stop_token_ids.begin(), s.sp.stop_token_ids.end(), tok) != s.sp.stop_token_ids.end()) return true;
  return !s.sp.ignore_eos && std::find(cfg_.stop_token_ids.begin(), cfg_.stop_token_ids.end(), tok) != cfg_.stop_token_ids.end();
}

void Engine::append_token(Sequence& s, int32_t tok, TokenLogprob* lp, EngineEvent& ev, bool appended) {
  auto now = Clock::now();
  if (!s.got_first) {
    s.got_first = true;
    metrics_.ttft_s.observe(std::chrono::duration<double>(now - s.arrival).count());
  } else {
    metrics_.itl_s.observe(std::chrono::duration<double>(now - s.last_token).count());
  }
  s.last_token = now;
  if (!appended) {  // take_tokens_early appended and counted it, and gave it to the constraint
    s.tokens.push_back(tok);
    ++s.counts[tok];
  }
  ++metrics_.generation_tokens;
  ev.tokens.push_back(tok);
  if (lp) ev.logprobs.push_back(std::move(*lp));
  if (!s.prompt_lps.empty()) {
    ev.prompt_logprobs = std::move(s.prompt_lps);
    s.prompt_lps.clear();
  }
  if (appended ? s.constraint_broken : s.sp.constraint && !s.sp.constraint->accept(tok)) {
    // Only possible when a token was drawn without the mask (a bug): do not stream broken output.
    ev.error = "token " + std::to_string(tok) + " breaks the structured output constraint";
    finish(s, ev, FinishReason::kError);
    return;
  }

  if (is_stop_token(s, tok)) {
    ev.stop_token = tok;
    finish(s, ev, FinishReason::kStop);
    return;
  }
  if (cfg_.token_text) {
    size_t before = s.text.size();
    s.text += cfg_.token_text(tok);
    for (const auto& st : s.sp.stop) {
      if (st.empty()) continue;
      size_t from = before >= st.size() ? before - st.size() + 1 : 0;
      size_t pos = s.text.find(st, from);
      if (pos != std::string::npos) {
        s.text.resize(std::max(pos, s.text_sent));
        ev.stop_string = st;
        finish(s, ev, FinishReason::kStop);
        return;
      }
    }
  }
  if (at_length_limit(s)) {
    finish(s, ev, FinishReason::kLength);
    return;
  }
  size_t end = safe_text_end(s);
  ev.text = s.text.substr(s.text_sent, end - s.text_sent);
  s.text_sent = end;
  ev.prompt_tokens = s.prompt_len;
  ev.completion_tokens = s.output_len();
  ev.cached_tokens = std::max(0, s.cached_tokens);
  outbox_.push_back({s.stream, std::move(ev)});
}

void Engine::finish(Sequence& s, EngineEvent& ev, FinishReason r) {
  s.done = true;
  kv_->free(s.id);
  if (s.text_sent < s.text.size()) ev.text += s.text.substr(s.text_sent);
  s.text_sent = s.text.size();
  ev.finished = true;
  ev.finish_reason = r;
  ev.prompt_tokens = s.prompt_len;
  ev.completion_tokens = s.output_len();
  ev.cached_tokens = std::max(0, s.cached_tokens);
  if (r == FinishReason::kAbort) ++metrics_.requests_aborted;
  ++metrics_.requests_finished;
  metrics_.e2e_s.observe(std::chrono::duration<double>(Clock::now() - s.arrival).count());
  outbox_.push_back({s.stream, std::move(ev)});
}

void Engine::flush_outbox() {
  if (outbox_.empty()) return;
  if (!deliver_async_) {
    push_events(outbox_);
    outbox_.clear();
    return;
  }
  {
    std::lock_guard<std::mutex> l(deliver_mu_);
    if (deliver_q_.empty()) {
      deliver_q_.swap(outbox_);
    } else {
      for (auto& e : outbox_) deliver_q_.push_back(std::move(e));
    }
  }
  deliver_cv_.notify_one();
  outbox_.clear();
}

void Engine::push_events(std::vector<std::pair<std::shared_ptr<RequestStream>, EngineEvent>>& evs) {
  for (auto& [stream, ev] : evs) {
    if (ev.finished) --active_;  // before the push: whoever sees the end also sees the count
    stream->push(std::move(ev));
  }
}

void Engine::deliver_main() {
  std::vector<std::pair<std::shared_ptr<RequestStream>, EngineEvent>> batch;
  std::unique_lock<std::mutex> l(deliver_mu_);
  while (true) {
    deliver_cv_.wait(l, [&] { return deliver_quit_ || !deliver_q_.empty(); });
    if (deliver_q_.empty()) return;  // quit, and nothing left to push
    batch.swap(deliver_q_);
    l.unlock();
    push_events(batch);
    batch.clear();
    l.lock();
  }
}

}  // namespace gptoss
