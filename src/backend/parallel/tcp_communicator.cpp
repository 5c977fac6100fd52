#include "backend/parallel/tcp_communicator.h"

#include <atomic>
#include <mutex>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"

namespace gptoss {

namespace {

class TcpCommunicator final : public Communicator {
 public:
  explicit TcpCommunicator(std::unique_ptr<TcpStar> s) : s_(std::move(s)) {}
  int rank() const override { return s_->rank(); }
  int world() const override { return s_->world(); }

  void all_reduce_sum(float* data, size_t n, void*) override {
    guard([&] {
      const size_t bytes = n * sizeof(float);
      if (rank() != 0) {
        s_->send(0, data, bytes);
        s_->recv(0, data, bytes, s_->default_timeout_s());
        return;
      }
      tmp_.resize(n);
      for (int r = 1; r < world(); ++r) {  // rank order: ((d0 + d1) + d2) + ...
        s_->recv(r, tmp_.data(), bytes, s_->default_timeout_s());
        for (size_t i = 0; i < n; ++i) data[i] += tmp_[i];
      }
      for (int r = 1; r < world(); ++r) s_->send(r, data, bytes);
    });
  }

  void all_gather(const void* send, void* recv, size_t bytes, void*) override {
    guard([&] {
      char* out = static_cast<char*>(recv);
      if (rank() != 0) {
        s_->send(0, send, bytes);
        s_->recv(0, out, bytes * world(), s_->default_timeout_s());
        return;
      }
      if (out != send) std::memmove(out, send, bytes);
      for (int r = 1; r < world(); ++r) s_->recv(r, out + size_t(r) * bytes, bytes, s_->default_timeout_s());
      for (int r = 1; r < world(); ++r) s_->send(r, out, bytes * world());
    });
  }

  void broadcast(void* data, size_t bytes, int root, void*) override {
    if (root < 0 || root >= world()) throw Error("broadcast: root outside the group");
    guard([&] {
      if (rank() == 0) {
        if (root != 0) s_->recv(root, data, bytes, s_->default_timeout_s());
        for (int r = 1; r < world(); ++r)
          if (r != root) s_->send(r, data, bytes);
      } else if (rank() == root) {
        s_->send(0, data, bytes);
      } else {
        s_->recv(0, data, bytes, s_->default_timeout_s());
      }
    });
  }

  void abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (!aborted_) why_ = why;
      aborted_ = true;
    }
    s_->shutdown_all();
  }

 private:
  template <class F>
  void guard(F&& f) {
    if (aborted_) throw aborted_error();
    try {
      f();
    } catch (const Error& e) {
      if (aborted_) throw aborted_error();
      // A broken link breaks the group: close ours too, so no peer waits on this rank.
      abort(e.what());
      throw;
    }
  }

  Error aborted_error() {
    std::lock_guard<std::mutex> lk(m_);
    return Error("tensor-parallel group aborted: " + why_);
  }

  std::unique_ptr<TcpStar> s_;
  std::vector<float> tmp_;
  std::mutex m_;
  std::atomic<bool> aborted_{false};
  std::string why_;
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(std::unique_ptr<TcpStar> links) {
  return std::make_unique<TcpCommunicator>(std::move(links));
}

}  // namespace gptoss
