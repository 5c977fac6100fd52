#include "backend/parallel/tp_backend.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/parallel/tp_shard.h"
#include "common/error.h"

namespace gptoss {

void validate_forward_batch(const ForwardBatch& b, const GptOssConfig& c, const KvCacheConfig& kv) {
  const int n = int(b.tokens.size());
  for (int32_t t : b.tokens)
    if (t < 0 || t >= c.vocab) throw Error("forward: token id " + std::to_string(t) + " outside the vocabulary");
  for (int32_t r : b.logit_rows)
    if (r < 0 || r >= n) throw Error("forward: logit row outside the batch");
  if (n == 0) return;
  if (kv.page_size <= 0) throw Error("forward: the KV cache is not initialized");
  const bool has[2] = {c.num_full_layers() > 0, c.num_sliding_layers() > 0};
  for (const SeqBatchInfo& s : b.seqs) {
    if (s.first_token < 0 || s.n_tokens < 0 || s.first_token + s.n_tokens > n || s.start_pos < 0)
      throw Error("forward: sequence token range outside the batch");
    if (s.n_tokens == 0) continue;
    const int end = s.start_pos + s.n_tokens;
    for (int g = 0; g < 2; ++g) {
      if (!has[g]) continue;
      // Positions read: the whole context (full layers) or the window of the first new token.
      const int first = g == kKvSliding && c.sliding_window > 0 ? std::max(0, s.start_pos - c.sliding_window + 1) : 0;
      for (int pi = first / kv.page_size; pi <= (end - 1) / kv.page_size; ++pi)
        if (pi >= s.n_pages[g] || s.pages[g][pi] < 0 || s.pages[g][pi] >= kv.num_pages[g])
          throw Error("forward: no KV page for position " + std::to_string(std::max(first, pi * kv.page_size)));
    }
  }
}

namespace {

class TpBackend final : public Backend {
 public:
  TpBackend(int world, int n_local, TpRankFactory make, std::unique_ptr<TpRemoteRanks> remote)
      : world_(world), remote_(std::move(remote)), ranks_(n_local) {
    if (n_local < 1 || n_local > world) throw Error("tensor parallel: 1 to world local ranks");
    if ((n_local < world) != bool(remote_)) throw Error("tensor parallel: remote ranks without their link (or the reverse)");
    make_ = std::move(make);
    for (int r = 0; r < n_local; ++r) ranks_[r].thread = std::thread([this, r] { rank_main(r); });
    // Every rank builds at once (a CUDA communicator's creation waits for all of them).
    std::string remote_error;
    if (remote_) try {
        remote_->wait_ready();
      } catch (const std::exception& e) {
        remote_error = e.what();
        fail(remote_error);
      }
    {
      std::unique_lock<std::mutex> lk(m_);
      done_cv_.wait(lk, [&] { return built_ == n_local; });
    }
    if (!error_.empty()) {
      shutdown();
      throw Error(error_);
    }
    config_ = ranks_[0].parts.backend->config();
    for (int r = 0; r < n_local; ++r) {
      size_t a = ranks_[r].parts.backend->kv_memory_available();
      if (a) kv_avail_ = kv_avail_ ? std::min(kv_avail_, full_model_bytes(a, r)) : full_model_bytes(a, r);
    }
    if (remote_)
      if (size_t a = remote_->kv_memory_available()) {
        // The remote ranks' heads: the fewest kv heads any rank holds (the smallest multiplier).
        size_t worst = a;
        for (int r = n_local; r < world_; ++r) worst = std::min(worst, full_model_bytes(a, r));
        kv_avail_ = kv_avail_ ? std::min(kv_avail_, worst) : worst;
      }
  }

  ~TpBackend() override { shutdown(); }

  std::string name() const override { return ranks_[0].parts.backend->name(); }
  bool computes_on_host() const override { return ranks_[0].parts.backend->computes_on_host(); }
  std::vector<int> decode_batch_buckets() const override { return ranks_[0].parts.backend->decode_batch_buckets(); }
  const GptOssConfig& config() const override { return config_; }
  const KvCacheConfig& kv_config() const override { return ranks_[0].parts.backend->kv_config(); }
  size_t kv_memory_available() const override { return kv_avail_; }

  void init_kv_cache(const KvCacheConfig& kv) override {
    if (kv.page_size <= 0) throw Error("KV cache page size must be positive");
    run(TpRemoteRanks::Call::kInitKv, &kv, nullptr, nullptr, [&](int, Backend& b) { b.init_kv_cache(kv); });
  }

  void forward(const ForwardBatch& batch, float* logits) override {
    validate_forward_batch(batch, config_, kv_config());
    const size_t out = batch.logit_rows.size() * size_t(config_.vocab);
    run(TpRemoteRanks::Call::kForward, nullptr, &batch, nullptr, [&](int r, Backend& b) {
      if (r == 0) return b.forward(batch, logits);
      ranks_[r].logits.resize(out);
      b.forward(batch, ranks_[r].logits.data());
    });
  }

  void forward_greedy(const ForwardBatch& batch, int32_t* tokens_out) override {
    validate_forward_batch(batch, config_, kv_config());
    run(TpRemoteRanks::Call::kForwardGreedy, nullptr, &batch, nullptr, [&](int r, Backend& b) {
      if (r == 0) return b.forward_greedy(batch, tokens_out);
      ranks_[r].tokens.resize(batch.logit_rows.size());
      b.forward_greedy(batch, ranks_[r].tokens.data());
    });
  }

  // The vocabulary is split over the ranks: the drawn tokens' logprobs need the host logits.
  bool samples_logprobs() const override { return false; }
  // Nor keeps chosen rows' logits (the ranks draw every row together).
  bool keeps_logits() const override { return false; }
  // Nor applies logit changes (every rank would need them; the host draws those rows).
  bool applies_logit_changes() const override { return false; }
  void forward_sample(const ForwardBatch& batch, const RowSampling* rows, int32_t* tokens_out,
                      float* logprobs_out = nullptr, float* kept_logits = nullptr,
                      const LogitChanges& changes = {}, TopLogprobs* top_out = nullptr) override {
    if (logprobs_out || top_out) throw Error("tensor parallel: forward_sample gives no logprobs (samples_logprobs() is false)");
    if (kept_logits) throw Error("tensor parallel: forward_sample keeps no logits (keeps_logits() is false)");
    if (changes.adds || changes.allowed)
      throw Error("tensor parallel: forward_sample applies no logit changes (applies_logit_changes() is false)");
    validate_forward_batch(batch, config_, kv_config());
    run(TpRemoteRanks::Call::kForwardSample, nullptr, &batch, rows, [&](int r, Backend& b) {
      if (r == 0) return b.forward_sample(batch, rows, tokens_out);
      ranks_[r].tokens.resize(batch.logit_rows.size());
      b.forward_sample(batch, rows, ranks_[r].tokens.data());
    });
  }

 private:
  struct Rank {
    TpRank parts;
    std::thread thread;
    std::vector<float> logits;    // outputs of ranks > 0 (rank 0 writes the caller's)
    std::vector<int32_t> tokens;
  };

  // Bytes of the whole model's KV cache that `bytes` of rank r's hold (r holds kv_heads(r) of
  // the model's kv heads of every page).
  size_t full_model_bytes(size_t bytes, int r) const {
    const int held = TpShard{r, world_}.kv_heads(config_).size();
    return bytes / size_t(held) * size_t(config_.num_kv_heads);
  }

  void rank_main(int r) {
    TpRank parts;
    try {
      parts = make_(r);
      if (!parts.backend) throw Error("no backend");
    } catch (const std::exception& e) {
      fail("tensor-parallel rank " + std::to_string(r) + " could not start: " + e.what());
    }
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(m_);
    ranks_[r].parts = std::move(parts);
    ++built_;
    done_cv_.notify_all();
    for (;;) {
      cv_.wait(lk, [&] { return quit_ || job_id_ != seen; });
      if (quit_) break;
      seen = job_id_;
      auto job = job_;
      lk.unlock();
      try {
        if (ranks_[r].parts.backend) job(r, *ranks_[r].parts.backend);
      } catch (const std::exception& e) {
        fail("tensor-parallel rank " + std::to_string(r) + ": " + e.what());
      }
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
    lk.unlock();
    // The backend goes on the thread that made it (a CUDA rank frees on its device).
    std::unique_ptr<Backend> gone;
    {
      std::lock_guard<std::mutex> g(m_);
      gone = std::move(ranks_[r].parts.backend);
    }
    gone.reset();
  }

  // Records the first failure and releases every rank blocked in a collective.
  void fail(const std::string& what) {
    std::vector<Communicator*> comms;
    {
      std::lock_guard<std::mutex> lk(m_);
      if (!error_.empty()) return;
      error_ = what;
      for (auto& rk : ranks_)
        if (rk.parts.comm) comms.push_back(rk.parts.comm.get());
    }
    for (Communicator* c : comms) c->abort(what);
    if (remote_) remote_->abort(what);
  }

  void run(TpRemoteRanks::Call call, const KvCacheConfig* kv, const ForwardBatch* batch, const RowSampling* rows,
           std::function<void(int, Backend&)> job) {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (!error_.empty()) throw Error("the tensor-parallel group is down: " + error_);
    }
    if (remote_) try {
        remote_->send(call, kv, batch, rows);
      } catch (const std::exception& e) {
        fail(e.what());
        throw Error(std::string(e.what()));
      }
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = std::move(job);
      pending_ = int(ranks_.size());
      ++job_id_;
    }
    cv_.notify_all();
    if (remote_) try {
        remote_->wait_done();
      } catch (const std::exception& e) {
        fail(e.what());
      }
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (!error_.empty()) throw Error(error_);
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(m_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& rk : ranks_)
      if (rk.thread.joinable()) rk.thread.join();
    remote_.reset();  // tells the worker processes to stop
    for (auto& rk : ranks_) rk.parts.comm.reset();
  }

  const int world_;
  std::unique_ptr<TpRemoteRanks> remote_;
  std::vector<Rank> ranks_;
  TpRankFactory make_;
  GptOssConfig config_;
  size_t kv_avail_ = 0;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  uint64_t job_id_ = 0;
  int pending_ = 0, built_ = 0;
  bool quit_ = false;
  std::function<void(int, Backend&)> job_;
  std::string error_;
};

}  // namespace

std::unique_ptr<Backend> make_tp_backend(int world, int n_local, TpRankFactory make,
                                         std::unique_ptr<TpRemoteRanks> remote) {
  return std::make_unique<TpBackend>(world, n_local, std::move(make), std::move(remote));
}

}  // namespace gptoss
