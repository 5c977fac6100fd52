#pragma once
// The tensor-parallel group of the CUDA tests: `world` CudaBackends (rank r on GPU r) in this
// process behind one Backend, each call run on every rank at once (a thread per rank, as the
// collectives need), rank 0's outputs returned. Every rank's outputs are compared with rank 0's
// bit for bit (the vocab gather must leave the same logits everywhere): rank_mismatches() counts
// the calls where they differed. A stand-in for the TP factory, so these tests need nothing but
// the CUDA backend and its communicator.
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend_factory.h"
#include "backend/cuda/cuda_communicator.h"
#include "common/error.h"

namespace gptoss::test {

class TpRanks final : public Backend {
 public:
  TpRanks(const BackendOptions& base, int world, ExpertSharding experts = ExpertSharding::kIntermediate)
      : ranks_(world) {
    const CommId id = cuda_new_comm_id();
    each([&](int r) {
      BackendOptions o = base;
      o.device = "cuda";
      o.device_index = r;
      o.tp_shard = TpShard{r, world, experts};
      o.comm = std::shared_ptr<Communicator>(make_cuda_communicator(id, r, world, r));
      ranks_[r] = create_backend(o);
    });
  }
  ~TpRanks() override {
    // Communicators are torn down together (NCCL's may wait for the peers).
    try {
      each([&](int r) { ranks_[r].reset(); });
    } catch (...) {
    }
  }

  std::string name() const override { return "cuda-tp" + std::to_string(ranks_.size()); }
  const GptOssConfig& config() const override { return ranks_[0]->config(); }
  const KvCacheConfig& kv_config() const override { return ranks_[0]->kv_config(); }
  size_t kv_memory_available() const override { return ranks_[0]->kv_memory_available(); }
  void init_kv_cache(const KvCacheConfig& kv) override {
    each([&](int r) { ranks_[r]->init_kv_cache(kv); });
  }
  void forward(const ForwardBatch& b, float* logits) override {
    const size_t n = b.logit_rows.size() * size_t(config().vocab);
    run<float>(n, logits, [&](int r, float* out) { ranks_[r]->forward(b, out); });
  }
  void forward_greedy(const ForwardBatch& b, int32_t* ids) override {
    run<int32_t>(b.logit_rows.size(), ids, [&](int r, int32_t* out) { ranks_[r]->forward_greedy(b, out); });
  }
  bool samples_logprobs() const override { return false; }  // as the tensor-parallel backend
  bool keeps_logits() const override { return false; }
  bool applies_logit_changes() const override { return false; }
  void forward_sample(const ForwardBatch& b, const RowSampling* how, int32_t* ids, float* = nullptr,
                      float* = nullptr, const LogitChanges& = {}, TopLogprobs* = nullptr) override {
    run<int32_t>(b.logit_rows.size(), ids, [&](int r, int32_t* out) { ranks_[r]->forward_sample(b, how, out); });
  }
  int rank_mismatches() const { return mismatches_; }

 private:
  void each(const std::function<void(int)>& fn) {
    std::mutex mu;
    std::string err;
    std::vector<std::thread> ts;
    for (int r = 0; r < int(ranks_.size()); ++r)
      ts.emplace_back([&, r] {
        try {
          fn(r);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> l(mu);
          err += "rank " + std::to_string(r) + ": " + e.what() + "\n";
        }
      });
    for (auto& t : ts) t.join();
    if (!err.empty()) throw Error(err);
  }
  template <class T>
  void run(size_t n, T* out0, const std::function<void(int, T*)>& fn) {
    std::vector<std::vector<T>> others(ranks_.size(), std::vector<T>(n));
    each([&](int r) { fn(r, r == 0 ? out0 : others[r].data()); });
    for (size_t r = 1; r < ranks_.size(); ++r)
      if (n && std::memcmp(out0, others[r].data(), n * sizeof(T)) != 0) ++mismatches_;
  }

  std::vector<std::unique_ptr<Backend>> ranks_;
  int mismatches_ = 0;
};

}  // namespace gptoss::test
