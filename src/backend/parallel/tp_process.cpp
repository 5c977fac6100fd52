#include "backend/parallel/tp_process.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/parallel/tcp_communicator.h"
#include "backend/parallel/tcp_star.h"
#include "common/error.h"

namespace gptoss {

namespace {

// ---- environment ----

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int lo, int hi) {
  const char* v = env(name);
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (!end || *end || x < lo || x > hi)
    throw Error(std::string(name) + "=" + v + ": expected an integer from " + std::to_string(lo) + " to " +
                std::to_string(hi));
  return int(x);
}

// ---- the control channel's frames ----

enum Kind : uint32_t {
  // 1..4: TpRemoteRanks::Call
  kHello = 100,  // rank 0 -> workers: the CommId
  kReady,        // worker -> rank 0: built; u64 kv_memory_available
  kOk,           // worker -> rank 0: the call finished
  kError,        // worker -> rank 0: the call (or the start) failed; the message
  kStop,         // rank 0 -> workers: exit
  kAbort,        // rank 0 -> workers: give up the call under way; the reason
};

struct FrameHeader {
  uint32_t kind = 0, reserved = 0;
  uint64_t bytes = 0;
};

void send_frame(TcpStar& s, int peer, uint32_t kind, const std::vector<uint8_t>& payload) {
  FrameHeader h{kind, 0, payload.size()};
  s.send(peer, &h, sizeof h);
  if (!payload.empty()) s.send(peer, payload.data(), payload.size());
}

std::vector<uint8_t> recv_frame(TcpStar& s, int peer, uint32_t& kind, double timeout_s) {
  FrameHeader h;
  s.recv(peer, &h, sizeof h, timeout_s);
  if (h.bytes > (uint64_t(1) << 34)) throw Error("tensor-parallel rank " + std::to_string(peer) + " sent a malformed frame");
  std::vector<uint8_t> p(h.bytes);
  if (h.bytes) s.recv(peer, p.data(), p.size(), s.default_timeout_s());
  kind = h.kind;
  return p;
}

std::vector<uint8_t> text_payload(const std::string& s) { return {s.begin(), s.end()}; }
std::string payload_text(const std::vector<uint8_t>& p) { return {p.begin(), p.end()}; }

// ---- ForwardBatch on the wire ----

struct Writer {
  std::vector<uint8_t> out;
  template <class T>
  void put(const T& v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  template <class T>
  void put_array(const T* v, size_t n) {
    put(uint64_t(n));
    const uint8_t* p = reinterpret_cast<const uint8_t*>(v);
    out.insert(out.end(), p, p + n * sizeof(T));
  }
};

struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  void need(size_t n) {
    if (at + n > in.size()) throw Error("tensor-parallel: a truncated call from rank 0");
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, &in[at], sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> get_array() {
    const uint64_t n = get<uint64_t>();
    need(n * sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), &in[at], n * sizeof(T));
    at += n * sizeof(T);
    return v;
  }
};

std::vector<uint8_t> encode_call(const KvCacheConfig* kv, const ForwardBatch* b, const RowSampling* rows) {
  Writer w;
  if (kv) {
    w.put(int32_t(kv->page_size));
    w.put(int32_t(kv->num_pages[0]));
    w.put(int32_t(kv->num_pages[1]));
    w.put(int32_t(kv->dtype));
  }
  if (b) {
    w.put_array(b->tokens.data(), b->tokens.size());
    w.put(uint64_t(b->seqs.size()));
    for (const SeqBatchInfo& s : b->seqs) {
      w.put(s.first_token);
      w.put(s.n_tokens);
      w.put(s.start_pos);
      for (int g = 0; g < 2; ++g) w.put_array(s.pages[g], s.pages[g] ? size_t(s.n_pages[g]) : 0);
    }
    w.put_array(b->logit_rows.data(), b->logit_rows.size());
  }
  if (rows) w.put_array(rows, b->logit_rows.size());
  return std::move(w.out);
}

// A call received by a worker, owning what the batch's page tables point to.
struct DecodedCall {
  KvCacheConfig kv;
  ForwardBatch batch;
  std::vector<std::vector<int32_t>> pages;
  std::vector<RowSampling> rows;
};

void decode_call(uint32_t kind, const std::vector<uint8_t>& p, DecodedCall& c) {
  using Call = TpRemoteRanks::Call;
  Reader r{p};
  if (kind == uint32_t(Call::kInitKv)) {
    c.kv.page_size = r.get<int32_t>();
    c.kv.num_pages[0] = r.get<int32_t>();
    c.kv.num_pages[1] = r.get<int32_t>();
    c.kv.dtype = DType(r.get<int32_t>());
    return;
  }
  c.batch.tokens = r.get_array<int32_t>();
  const uint64_t n = r.get<uint64_t>();
  if (n > (uint64_t(1) << 24)) throw Error("tensor-parallel: a malformed batch from rank 0");
  c.batch.seqs.resize(n);
  c.pages.assign(2 * n, {});
  for (uint64_t i = 0; i < n; ++i) {
    SeqBatchInfo& s = c.batch.seqs[i];
    s.first_token = r.get<int32_t>();
    s.n_tokens = r.get<int32_t>();
    s.start_pos = r.get<int32_t>();
    for (int g = 0; g < 2; ++g) {
      c.pages[2 * i + g] = r.get_array<int32_t>();
      s.pages[g] = c.pages[2 * i + g].data();
      s.n_pages[g] = int32_t(c.pages[2 * i + g].size());
    }
  }
  c.batch.logit_rows = r.get_array<int32_t>();
  if (kind == uint32_t(Call::kForwardSample)) c.rows = r.get_array<RowSampling>();
}

double connect_timeout_s() {
  if (env("GPTOSS_TP_CONNECT_TIMEOUT_S")) return env_int("GPTOSS_TP_CONNECT_TIMEOUT_S", 1, 86400);
  return 300;
}

// ---- rank 0's view of the workers ----

class TcpRemoteRanks final : public TpRemoteRanks {
 public:
  explicit TcpRemoteRanks(std::unique_ptr<TcpStar> s) : s_(std::move(s)) {}
  ~TcpRemoteRanks() override {
    for (int r = 1; r < s_->world(); ++r) try {
        send_frame(*s_, r, kStop, {});
      } catch (const std::exception&) {
      }
  }

  void wait_ready() override {
    for (int r = 1; r < s_->world(); ++r) {
      uint32_t kind = 0;
      auto p = recv_frame(*s_, r, kind, -1);  // loading a large model takes what it takes
      if (kind == kError) throw Error("tensor-parallel rank " + std::to_string(r) + " could not start: " + payload_text(p));
      if (kind != kReady || p.size() != 8) throw Error("tensor-parallel rank " + std::to_string(r) + " answered out of turn");
      uint64_t a;
      std::memcpy(&a, p.data(), 8);
      if (a) kv_avail_ = kv_avail_ ? std::min<size_t>(kv_avail_, a) : a;
    }
  }

  void send(Call call, const KvCacheConfig* kv, const ForwardBatch* batch, const RowSampling* rows) override {
    const auto payload = encode_call(kv, batch, rows);
    for (int r = 1; r < s_->world(); ++r) send_frame(*s_, r, uint32_t(call), payload);
    in_call_ = true;
  }

  // Every worker's answer, whichever comes first: a failure on any of them is seen at once.
  void wait_done() override {
    std::vector<int> waiting;
    for (int r = 1; r < s_->world(); ++r) waiting.push_back(r);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(s_->default_timeout_s());
    while (!waiting.empty()) {
      std::vector<pollfd> fds;
      for (int r : waiting) fds.push_back({s_->fd(r), POLLIN, 0});
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      int n = left.count() > 0 ? ::poll(fds.data(), fds.size(), int(left.count())) : 0;
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw Error("tensor-parallel rank " + std::to_string(waiting[0]) + " did not finish a call within " +
                    std::to_string(int(s_->default_timeout_s())) + " s (GPTOSS_TP_TIMEOUT_S)");
      for (size_t i = fds.size(); i-- > 0;) {
        if (!fds[i].revents) continue;
        const int r = waiting[i];
        uint32_t kind = 0;
        auto p = recv_frame(*s_, r, kind, s_->default_timeout_s());
        if (kind == kError) throw Error("tensor-parallel rank " + std::to_string(r) + ": " + payload_text(p));
        if (kind != kOk) throw Error("tensor-parallel rank " + std::to_string(r) + " answered out of turn");
        waiting.erase(waiting.begin() + i);
      }
    }
    in_call_ = false;
  }

  void abort(const std::string& why) override {
    for (int r = 1; r < s_->world(); ++r) try {
        send_frame(*s_, r, kAbort, text_payload(why));
      } catch (const std::exception&) {
      }
  }

  size_t kv_memory_available() const override { return kv_avail_; }

 private:
  std::unique_ptr<TcpStar> s_;
  size_t kv_avail_ = 0;
  std::atomic<bool> in_call_{false};
};

}  // namespace

std::optional<LaunchEnv> launch_env_from_environment() {
  LaunchEnv e;
  if (env("WORLD_SIZE")) {
    e.launcher = "torchrun";
    e.world = env_int("WORLD_SIZE", 1, 1 << 20);
    if (e.world <= 1) return std::nullopt;
    if (!env("RANK")) throw Error("WORLD_SIZE is set but RANK is not (torchrun sets both)");
    e.rank = env_int("RANK", 0, e.world - 1);
    e.local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK", 0, 1 << 20) : 0;
  } else if (env("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = "openmpi";
    e.world = env_int("OMPI_COMM_WORLD_SIZE", 1, 1 << 20);
    if (e.world <= 1) return std::nullopt;
    e.rank = env_int("OMPI_COMM_WORLD_RANK", 0, e.world - 1);
    e.local_rank = env("OMPI_COMM_WORLD_LOCAL_RANK") ? env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 1 << 20) : 0;
  } else if (env("SLURM_PROCID") && (env("SLURM_STEP_NUM_TASKS") || env("SLURM_NTASKS"))) {
    e.launcher = "slurm";
    e.world = env_int(env("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS", 1, 1 << 20);
    if (e.world <= 1) return std::nullopt;
    e.rank = env_int("SLURM_PROCID", 0, e.world - 1);
    e.local_rank = env("SLURM_LOCALID") ? env_int("SLURM_LOCALID", 0, 1 << 20) : 0;
  } else {
    return std::nullopt;
  }
  if (!env("MASTER_ADDR"))
    throw Error("started as rank " + std::to_string(e.rank) + " of " + std::to_string(e.world) + " (" + e.launcher +
                ") without MASTER_ADDR: set it to rank 0's host name or address (and MASTER_PORT, default 29500)");
  e.master_addr = env("MASTER_ADDR");
  if (env("MASTER_PORT")) e.master_port = env_int("MASTER_PORT", 1, 65535);
  // torchrun's agent keeps its own TCPStore listening on MASTER_PORT of rank 0's host while the
  // workers run: gptoss takes the next port there. GPTOSS_TP_PORT overrides both.
  if (env("TORCHELASTIC_RUN_ID")) e.master_port = e.master_port % 65535 + 1;
  if (env("GPTOSS_TP_PORT")) e.master_port = env_int("GPTOSS_TP_PORT", 1, 65535);
  return e;
}

std::unique_ptr<Backend> make_tp_process_rank0(const LaunchEnv& e, bool cpu_links, const CommId& id,
                                               TpProcessRankFactory make) {
  auto stars = tcp_rendezvous(e.master_addr, e.master_port, 0, e.world, cpu_links ? 2 : 1, connect_timeout_s());
  std::vector<uint8_t> hello(id.begin(), id.end());
  for (int r = 1; r < e.world; ++r) send_frame(*stars[0], r, kHello, hello);
  auto cpu_comm = std::make_shared<std::unique_ptr<Communicator>>();
  if (cpu_links) *cpu_comm = make_tcp_communicator(std::move(stars[1]));
  auto remote = std::make_unique<TcpRemoteRanks>(std::move(stars[0]));
  return make_tp_backend(
      e.world, 1, [=](int) { return make(id, std::move(*cpu_comm)); }, std::move(remote));
}

int run_tp_process_worker(const LaunchEnv& e, bool cpu_links, TpProcessRankFactory make) {
  const std::string me = "gptoss tensor-parallel rank " + std::to_string(e.rank) + "/" + std::to_string(e.world);
  std::unique_ptr<TcpStar> control;
  TpRank rank;
  try {
    auto stars = tcp_rendezvous(e.master_addr, e.master_port, e.rank, e.world, cpu_links ? 2 : 1, connect_timeout_s());
    control = std::move(stars[0]);
    uint32_t kind = 0;
    auto p = recv_frame(*control, 0, kind, control->default_timeout_s());
    if (kind != kHello || p.size() != sizeof(CommId)) throw Error("rank 0 did not send the group's id");
    CommId id;
    std::memcpy(id.data(), p.data(), id.size());
    std::unique_ptr<Communicator> cpu_comm;
    if (cpu_links) cpu_comm = make_tcp_communicator(std::move(stars[1]));
    try {
      rank = make(id, std::move(cpu_comm));
    } catch (const std::exception& ex) {
      send_frame(*control, 0, kError, text_payload(ex.what()));
      throw;
    }
    uint64_t avail = rank.backend->kv_memory_available();
    std::vector<uint8_t> ready(8);
    std::memcpy(ready.data(), &avail, 8);
    send_frame(*control, 0, kReady, ready);
    std::fprintf(stderr, "%s: ready (rank 0 at %s:%d)\n", me.c_str(), e.master_addr.c_str(), e.master_port);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s: %s\n", me.c_str(), ex.what());
    return 1;
  }
  DecodedCall call;
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  // Fault injection for the tests: this worker kills itself (SIGKILL, as an OOM killer or a
  // lost host would) when its Nth call arrives.
  const int die_at = env("GPTOSS_TP_TEST_DIE_AT_CALL") ? env_int("GPTOSS_TP_TEST_DIE_AT_CALL", 1, 1 << 30) : 0;
  int calls = 0;
  for (;;) {
    uint32_t kind = 0;
    std::vector<uint8_t> p;
    try {
      p = recv_frame(*control, 0, kind, -1);  // idle as long as rank 0 is
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "%s: stopping: %s\n", me.c_str(), ex.what());
      return 1;
    }
    if (kind == kStop) return 0;
    if (kind == kAbort) {
      std::fprintf(stderr, "%s: rank 0 gave up: %s\n", me.c_str(), payload_text(p).c_str());
      return 1;
    }
    if (++calls == die_at) ::raise(SIGKILL);
    // While the call runs, anything from rank 0 (an abort, or the connection closing) means the
    // call is off: break this rank's collectives so it never waits for a group that is gone.
    // (`done` wakes the watchdog the moment the call ends.)
    int done[2];
    if (::pipe(done) != 0) throw Error("pipe: " + std::string(std::strerror(errno)));
    std::thread watchdog([&] {
      pollfd f[2] = {{control->fd(0), POLLIN, 0}, {done[0], POLLIN, 0}};
      for (;;) {
        int n = ::poll(f, 2, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n > 0 && !f[1].revents && rank.comm) rank.comm->abort("rank 0 aborted the call or went away");
        return;
      }
    });
    std::string error;
    try {
      using Call = TpRemoteRanks::Call;
      decode_call(kind, p, call);
      Backend& b = *rank.backend;
      const size_t rows = call.batch.logit_rows.size();
      switch (Call(kind)) {
        case Call::kInitKv:
          b.init_kv_cache(call.kv);
          break;
        case Call::kForward:
          logits.resize(rows * size_t(b.config().vocab));
          b.forward(call.batch, logits.data());
          break;
        case Call::kForwardGreedy:
          tokens.resize(rows);
          b.forward_greedy(call.batch, tokens.data());
          break;
        case Call::kForwardSample:
          if (call.rows.size() != rows) throw Error("a sampling call without one rule per row");
          tokens.resize(rows);
          b.forward_sample(call.batch, call.rows.data(), tokens.data());
          break;
        default:
          throw Error("an unknown call " + std::to_string(kind) + " from rank 0");
      }
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    const char one = 1;
    (void)!::write(done[1], &one, 1);
    watchdog.join();
    ::close(done[0]);
    ::close(done[1]);
    try {
      send_frame(*control, 0, error.empty() ? kOk : kError, error.empty() ? std::vector<uint8_t>{} : text_payload(error));
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "%s: stopping: %s\n", me.c_str(), ex.what());
      return 1;
    }
    if (!error.empty()) {
      std::fprintf(stderr, "%s: %s\n", me.c_str(), error.c_str());
      return 1;
    }
  }
}

}  // namespace gptoss
