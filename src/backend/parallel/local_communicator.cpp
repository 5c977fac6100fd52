#include "backend/parallel/local_communicator.h"

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "common/error.h"

namespace gptoss {

namespace {

// What the ranks of one group share: a generation-counting barrier that abort() breaks, and
// one published pointer per rank for the collective under way.
struct LocalGroup {
  explicit LocalGroup(int world) : world(world), slots(world, nullptr) {}
  const int world;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string why;
  std::vector<const void*> slots;

  void throw_aborted() { throw Error("tensor-parallel group aborted: " + why); }

  void barrier() {
    std::unique_lock<std::mutex> lk(m);
    if (aborted) throw_aborted();
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return generation != gen || aborted; });
    if (generation == gen) throw_aborted();  // broken before everyone arrived
  }

  void abort(const std::string& w) {
    std::lock_guard<std::mutex> lk(m);
    if (!aborted) why = w;
    aborted = true;
    cv.notify_all();
  }
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return g_->world; }

  void all_reduce_sum(float* data, size_t n, void*) override {
    g_->slots[rank_] = data;
    g_->barrier();  // every rank's input is published
    sum_.resize(n);
    const float* d0 = static_cast<const float*>(g_->slots[0]);
    std::memcpy(sum_.data(), d0, n * sizeof(float));
    for (int r = 1; r < g_->world; ++r) {
      const float* dr = static_cast<const float*>(g_->slots[r]);
      for (size_t i = 0; i < n; ++i) sum_[i] += dr[i];
    }
    g_->barrier();  // every rank has read every input: now each may overwrite its own
    std::memcpy(data, sum_.data(), n * sizeof(float));
  }

  void all_gather(const void* send, void* recv, size_t bytes, void*) override {
    g_->slots[rank_] = send;
    g_->barrier();
    for (int r = 0; r < g_->world; ++r) {
      void* dst = static_cast<char*>(recv) + size_t(r) * bytes;
      if (dst != g_->slots[r]) std::memmove(dst, g_->slots[r], bytes);
    }
    g_->barrier();  // the senders' buffers stay valid until everyone has copied
  }

  void broadcast(void* data, size_t bytes, int root, void*) override {
    if (root < 0 || root >= g_->world) throw Error("broadcast: root outside the group");
    if (rank_ == root) g_->slots[rank_] = data;
    g_->barrier();
    if (rank_ != root) std::memcpy(data, g_->slots[root], bytes);
    g_->barrier();
  }

  void abort(const std::string& why) override { g_->abort(why); }

 private:
  std::shared_ptr<LocalGroup> g_;
  int rank_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_communicators(int world) {
  if (world < 1) throw Error("a tensor-parallel group needs at least one rank");
  auto g = std::make_shared<LocalGroup>(world);
  std::vector<std::unique_ptr<Communicator>> v;
  for (int r = 0; r < world; ++r) v.push_back(std::make_unique<LocalCommunicator>(g, r));
  return v;
}

}  // namespace gptoss
