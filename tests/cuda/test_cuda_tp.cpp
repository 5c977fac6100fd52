// Tensor parallelism on CUDA (needs 2 GPUs, skips otherwise): the communicator's collectives
// (NCCL and the one-shot peer-memory all-reduce, sizes around the one-shot threshold, odd sizes,
// unaligned pointers, inside CUDA graphs). Every rank runs in its own thread, as TpBackend does.
// Needs libnccl.so.2 on LD_LIBRARY_PATH (tools/gpu/tp_round.sh sets it).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_communicator.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tp_slices.h"
#include "cuda_test_util.h"

namespace gptoss {
namespace {

using namespace gptoss::test;

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

class CudaTp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_count() < 2) GTEST_SKIP() << "fewer than 2 CUDA devices";
  }
};

// Runs fn(rank, comm) on `world` threads (GPU r for rank r); rethrows the first failure.
void run_ranks(int world, const std::function<void(int, CudaCommunicator&)>& fn) {
  const CommId id = cuda_new_comm_id();
  std::mutex mu;
  std::string err;
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        auto c = make_cuda_communicator(id, r, world, r);
        GPTOSS_CUDA_CHECK(cudaSetDevice(r));
        fn(r, dynamic_cast<CudaCommunicator&>(*c));
        GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(mu);
        err += "rank " + std::to_string(r) + ": " + e.what() + "\n";
      }
    });
  for (auto& t : ts) t.join();
  ASSERT_TRUE(err.empty()) << err;
}

std::vector<float> rank_data(size_t n, int rank) {
  FastRng g(1234 + rank);
  std::vector<float> v(n);
  for (auto& x : v) x = float(int(g.next() % 20001) - 10000) * 1e-3f * (rank + 1);
  return v;
}

// The sum in rank order, as every path must give it bit for bit.
std::vector<float> expected_sum(size_t n, int world) {
  std::vector<float> s = rank_data(n, 0);
  for (int r = 1; r < world; ++r) {
    auto v = rank_data(n, r);
    for (size_t i = 0; i < n; ++i) s[i] += v[i];
  }
  return s;
}

enum class Which { kAuto, kNccl, kOneShot, kLL, kTwoShot };

// A graph of what body() queues on st (thread-local capture), instantiated; destroyed with it.
struct CapturedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedGraph(cudaStream_t st, const std::function<void()>& body) {
    GPTOSS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    body();
    GPTOSS_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    GPTOSS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }
  void launch(cudaStream_t st) { GPTOSS_CUDA_CHECK(cudaGraphLaunch(exec, st)); }
  ~CapturedGraph() {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
};

// The x -> 2x chains: every rank starts from ones, and element i doubles in each of `rounds`
// passes over `sizes` whose size exceeds i.
void expect_doubled(const std::vector<std::vector<float>>& got, const std::vector<size_t>& sizes, int rounds) {
  for (size_t r = 0; r < got.size(); ++r)
    for (size_t i = 0; i < got[r].size(); ++i) {
      int calls = 0;
      for (size_t n : sizes) calls += i < n;
      ASSERT_EQ(got[r][i], std::ldexp(1.f, rounds * calls)) << "rank " << r << " i=" << i;
    }
}

void check_all_reduce(int world, const std::vector<size_t>& sizes, Which which, size_t offset_floats,
                      bool in_graph) {
  std::vector<std::vector<std::vector<float>>> got(world);  // [rank][size]
  run_ranks(world, [&](int rank, CudaCommunicator& c) {
    cudaStream_t st;
    GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t n : sizes) {
      const bool oneshot = which == Which::kOneShot, ll = which == Which::kLL, two = which == Which::kTwoShot;
      if (((oneshot || ll) && n * 4 > c.peer_capacity_bytes()) || (two && n * 4 > c.twoshot_max_bytes())) {
        got[rank].push_back({});
        continue;
      }
      auto host = rank_data(n, rank);
      Dev<float> d(n + offset_floats);
      float* p = d.p() + offset_floats;
      auto call = [&] {
        if (which == Which::kNccl) c.nccl_all_reduce(p, n, st);
        else if (oneshot) c.oneshot_all_reduce(p, n, st);
        else if (ll) c.ll_all_reduce(p, n, st);
        else if (two) c.twoshot_all_reduce(p, n, st);
        else c.all_reduce_sum(p, n, st);
      };
      if (in_graph) {
        // Capture once, replay twice from fresh inputs: the epoch flags must carry over.
        CapturedGraph graph(st, call);
        for (int rep = 0; rep < 2; ++rep) {
          GPTOSS_CUDA_CHECK(cudaMemcpyAsync(p, host.data(), n * 4, cudaMemcpyHostToDevice, st));
          graph.launch(st);
        }
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(st));
      } else {
        GPTOSS_CUDA_CHECK(cudaMemcpyAsync(p, host.data(), n * 4, cudaMemcpyHostToDevice, st));
        call();
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(st));
      }
      std::vector<float> out(n);
      GPTOSS_CUDA_CHECK(cudaMemcpy(out.data(), p, n * 4, cudaMemcpyDeviceToHost));
      got[rank].push_back(std::move(out));
    }
    GPTOSS_CUDA_CHECK(cudaStreamDestroy(st));
  });
  for (size_t s = 0; s < sizes.size(); ++s) {
    if (got[0][s].empty()) continue;
    const auto want = expected_sum(sizes[s], world);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(got[r][s].size(), want.size());
      size_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i) bad += std::memcmp(&got[r][s][i], &want[i], 4) != 0;
      // World 2: a + b is the same float whatever the algorithm; beyond, NCCL's order may
      // differ from rank order but every rank still holds the same bits.
      if (world == 2 || which == Which::kOneShot || which == Which::kLL || which == Which::kTwoShot)
        EXPECT_EQ(bad, 0u) << "rank " << r << " n=" << sizes[s];
      else
        EXPECT_EQ(std::memcmp(got[r][s].data(), got[0][s].data(), want.size() * 4), 0) << "n=" << sizes[s];
    }
  }
}

std::vector<size_t> sizes_around_threshold() {
  const size_t t = 512 * 1024 / 4;  // default GPTOSS_ALLREDUCE_ONESHOT_MAX in floats
  return {1, 3, 5, 7, 2880, 2880 * 4 + 1, 2880 * 33, t - 3, t, t + 1, 1000003};
}

TEST_F(CudaTp, AllReduceAutoPathMatchesRankOrderSum) {
  check_all_reduce(2, sizes_around_threshold(), Which::kAuto, 0, false);
}
TEST_F(CudaTp, AllReduceNccl) { check_all_reduce(2, sizes_around_threshold(), Which::kNccl, 0, false); }
TEST_F(CudaTp, AllReduceOneShot) { check_all_reduce(2, sizes_around_threshold(), Which::kOneShot, 0, false); }
TEST_F(CudaTp, AllReduceLL) { check_all_reduce(2, sizes_around_threshold(), Which::kLL, 0, false); }
TEST_F(CudaTp, AllReduceLLUnalignedPointer) { check_all_reduce(2, {1, 5, 2881, 100001}, Which::kLL, 1, false); }
TEST_F(CudaTp, AllReduceLLInCudaGraph) { check_all_reduce(2, {1, 2880, 2880 * 7 + 3, 200000}, Which::kLL, 0, true); }
// The experimental two-shot kernel (GPTOSS_ALLREDUCE_TWOSHOT_MAX): odd sizes (shards that end
// mid-float4, a last shard shorter or empty), unaligned, in graphs, and chained calls of
// changing sizes; then all_reduce_sum's choice of it between the LL kernel and NCCL.
TEST_F(CudaTp, AllReduceTwoShot) {
  setenv("GPTOSS_ALLREDUCE_TWOSHOT_MAX", "33554432", 1);
  setenv("GPTOSS_ALLREDUCE_ONESHOT_MAX", "65536", 1);
  auto restore = [] {
    unsetenv("GPTOSS_ALLREDUCE_TWOSHOT_MAX");
    unsetenv("GPTOSS_ALLREDUCE_ONESHOT_MAX");
  };
  try {
    const std::vector<size_t> sizes = {1, 3, 5, 7, 9, 2880, 1000003, 5898240, 8388608};
    check_all_reduce(2, sizes, Which::kTwoShot, 0, false);
    check_all_reduce(2, {1, 7, 100001, 1000003}, Which::kTwoShot, 1, false);
    check_all_reduce(2, {5, 2880 * 7 + 3, 5898240}, Which::kTwoShot, 0, true);
    check_all_reduce(2, {100, 16384, 16385, 1000003, 8388608, 8388609}, Which::kAuto, 0, false);
    if (gpu_count() >= 4) check_all_reduce(4, {1, 5, 2881, 1000003}, Which::kTwoShot, 0, false);
    // x -> 2x per call, sizes changing.
    const std::vector<size_t> chain = {1000003, 5, 5898240, 64, 300001, 2};
    const size_t n_max = 5898240;
    std::vector<std::vector<float>> got(2);
    run_ranks(2, [&](int rank, CudaCommunicator& c) {
      Dev<float> d(n_max);
      d.upload(std::vector<float>(n_max, 1.f));
      for (int round = 0; round < 3; ++round)
        for (size_t n : chain) c.twoshot_all_reduce(d.p(), n, nullptr);
      got[rank] = d.download();
    });
    expect_doubled(got, chain, 3);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

TEST_F(CudaTp, AllReduceOneShotUnalignedPointer) {
  check_all_reduce(2, {1, 5, 2881, 100001}, Which::kOneShot, 1, false);
}
TEST_F(CudaTp, AllReduceInCudaGraph) {
  check_all_reduce(2, {2880, 2880 * 7 + 3, 300000}, Which::kOneShot, 0, true);
  check_all_reduce(2, {2880, 300000}, Which::kNccl, 0, true);
}
TEST_F(CudaTp, AllReduceFourRanks) {
  if (gpu_count() < 4) GTEST_SKIP() << "fewer than 4 CUDA devices";
  check_all_reduce(4, {3, 2880, 100001}, Which::kOneShot, 0, false);
  check_all_reduce(4, {3, 2880, 1000003}, Which::kAuto, 0, false);
  check_all_reduce(4, {1, 3, 2880, 100001}, Which::kLL, 0, false);
}

// Back-to-back LL calls of changing sizes (so changing grids) on one stream, eager and from a
// graph: x -> 2x per call (every rank holds x), so each element ends exactly 2^calls. A call that
// read a slot of an earlier call (epoch or parity wrong), or a rank that overwrote a slot its
// peer had not read yet, breaks the chain.
TEST_F(CudaTp, LLManyCallsOfChangingSizes) {
  const std::vector<size_t> sizes = {1, 2880, 100001, 3, 5760, 262144, 2, 2881, 11520 * 8, 7};
  const size_t n_max = 262144;
  std::vector<std::vector<float>> got(2);
  run_ranks(2, [&](int rank, CudaCommunicator& c) {
    cudaStream_t st;
    GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Dev<float> d(n_max);
    d.upload(std::vector<float>(n_max, 1.f));
    auto step = [&] {
      for (size_t n : sizes) c.ll_all_reduce(d.p(), n, st);
    };
    for (int i = 0; i < 3; ++i) step();
    {
      CapturedGraph graph(st, step);
      for (int i = 0; i < 2; ++i) graph.launch(st);
      step();
      GPTOSS_CUDA_CHECK(cudaStreamSynchronize(st));
    }
    GPTOSS_CUDA_CHECK(cudaStreamDestroy(st));
    got[rank] = d.download();
  });
  // Element i took part in every call whose size exceeds i, 6 rounds of the sizes.
  expect_doubled(got, sizes, 6);
}

// The residual all-reduce of TP decode (combine + all-reduce + the next RMSNorm in one LL
// kernel) against the same steps one by one as the backend runs them without it: residual
// zeroed off rank 0, moe_combine, the NCCL all-reduce, rmsnorm. The residual rows must be the
// same bits on every rank and equal the unfused ones; the normalized rows (sum of squares in
// another order) within one bf16 step. Rows of 2880 (gpt-oss) and 64 (the tiny fixture), 1 to 64
// rows, with and without the combine and the norm, eager and from a graph.
TEST_F(CudaTp, ResidualAllReduceEqualsUnfusedSteps) {
  setenv("GPTOSS_ALLREDUCE_ONESHOT_MAX", "1048576", 1);  // every row count below takes the LL path
  const int k = 4;
  struct Case {
    int n, H;
    bool combine, norm, graph;
  };
  const std::vector<Case> cases = {{1, 2880, true, true, false},  {3, 2880, true, true, true},
                                   {64, 2880, true, true, false}, {17, 2880, false, true, false},
                                   {5, 2880, true, false, true},  {9, 64, true, true, false},
                                   {2, 64, false, false, true}};
  struct Out {
    std::vector<float> x, x_ref;
    std::vector<uint16_t> xn, xn_ref;
  };
  std::vector<std::vector<Out>> got(2, std::vector<Out>(cases.size()));
  try {
    run_ranks(2, [&](int rank, CudaCommunicator& c) {
      cudaStream_t st;
      GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& cs = cases[ci];
        const int n = cs.n, H = cs.H, P = n * k;
        FastRng g(777 + ci * 10 + rank);  // the residual is the same on both ranks; the parts differ
        FastRng gx(555 + ci);
        const auto x0 = rand_f32(size_t(n) * H, gx);
        const auto w_norm = rand_f32(H, gx, 0.2f, 1.f);
        const auto y = rand_f32(size_t(P) * H, g);
        std::vector<int32_t> slot(P);
        std::vector<float> topw(P);
        for (int i = 0; i < P; ++i) {
          slot[i] = int((i * 7 + rank * 3) % P);
          topw[i] = g.uniform();
        }
        Dev<float> dx(x0), dref(x0), dy(y), dw(w_norm), dtw(topw);
        Dev<int32_t> dslot(slot);
        Dev<uint16_t> xn(size_t(n) * H), xn_ref(size_t(n) * H);
        cuda::MoeRouting routing;
        routing.slot_pair = dslot.p();
        routing.topk_w = dtw.p();
        cuda::ResidualAllReduce op{dx.p(), n, H, cs.combine ? rank == 0 : true, cs.combine ? dy.p() : nullptr,
                                   routing, cs.combine ? k : 0, cs.norm ? dw.p() : nullptr, 1e-5f,
                                   reinterpret_cast<cuda::bf16_t*>(xn.p())};
        bool took = false;
        if (cs.graph) {
          CapturedGraph graph(st, [&] { took = c.residual_all_reduce(op, st); });
          graph.launch(st);
          GPTOSS_CUDA_CHECK(cudaStreamSynchronize(st));
          dx.upload(x0);  // replay from fresh inputs: the epoch must carry over
          graph.launch(st);
          GPTOSS_CUDA_CHECK(cudaStreamSynchronize(st));
        } else {
          took = c.residual_all_reduce(op, st);
        }
        if (!took) throw Error("residual_all_reduce declined n=" + std::to_string(n) + " H=" + std::to_string(H));
        // The unfused steps.
        if (cs.combine) {
          if (rank != 0) GPTOSS_CUDA_CHECK(cudaMemsetAsync(dref.p(), 0, size_t(n) * H * 4, st));
          cuda::moe_combine(dy.p(), routing, n, k, H, dref.p(), nullptr, 1e-5f, nullptr, st);
        }
        c.nccl_all_reduce(dref.p(), size_t(n) * H, st);
        if (cs.norm)
          cuda::rmsnorm(dref.p(), dw.p(), n, H, 1e-5f, nullptr, reinterpret_cast<cuda::bf16_t*>(xn_ref.p()), st);
        GPTOSS_CUDA_CHECK(cudaStreamSynchronize(st));
        got[rank][ci] = Out{dx.download(), dref.download(), cs.norm ? xn.download() : std::vector<uint16_t>{},
                            cs.norm ? xn_ref.download() : std::vector<uint16_t>{}};
      }
      GPTOSS_CUDA_CHECK(cudaStreamDestroy(st));
    });
  } catch (...) {
    unsetenv("GPTOSS_ALLREDUCE_ONESHOT_MAX");
    throw;
  }
  unsetenv("GPTOSS_ALLREDUCE_ONESHOT_MAX");
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& cs = cases[ci];
    const std::string what = "case " + std::to_string(ci) + " (n=" + std::to_string(cs.n) + " H=" +
                             std::to_string(cs.H) + ")";
    for (int r = 0; r < 2; ++r) {
      const Out& o = got[r][ci];
      ASSERT_EQ(o.x.size(), o.x_ref.size()) << what;
      EXPECT_EQ(std::memcmp(o.x.data(), got[0][ci].x.data(), o.x.size() * 4), 0) << what << ": ranks differ";
      size_t bad = 0;
      for (size_t i = 0; i < o.x.size(); ++i) bad += std::memcmp(&o.x[i], &o.x_ref[i], 4) != 0;
      EXPECT_EQ(bad, 0u) << what << " rank " << r << ": residual differs from combine + all-reduce";
      if (!cs.norm) continue;
      EXPECT_EQ(o.xn, got[0][ci].xn) << what << ": ranks' normalized rows differ";
      size_t far = 0;
      for (size_t i = 0; i < o.xn.size(); ++i) {
        const float a = bf16_to_f32(o.xn[i]), b = bf16_to_f32(o.xn_ref[i]);
        far += !(std::fabs(a - b) <= std::fabs(b) * (1.f / 128) + 1e-30f);
      }
      EXPECT_EQ(far, 0u) << what << " rank " << r << ": normalized rows beyond one bf16 step of rmsnorm's";
    }
  }
}

// Back-to-back one-shot calls on one stream: x -> 2x per call (both ranks hold x), so after 20
// calls every element is exactly 2^20; a rank that refilled its staging buffer before a peer had
// read it, or a barrier that let a block run ahead, breaks the chain.
TEST_F(CudaTp, OneShotManyCallsBackToBack) {
  const size_t n = 2880 * 40 + 1;  // several blocks
  std::vector<std::vector<std::vector<float>>> got(2);
  run_ranks(2, [&](int rank, CudaCommunicator& c) {
    std::vector<float> ones(n, 1.f);
    Dev<float> d(n);
    for (int round = 0; round < 10; ++round) {
      d.upload(ones);
      for (int i = 0; i < 20; ++i) c.all_reduce_sum(d.p(), n, nullptr);
      got[rank].push_back(d.download());
    }
  });
  for (int r = 0; r < 2; ++r)
    for (const auto& v : got[r])
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], 1048576.f) << "rank " << r << " i=" << i;
}

TEST_F(CudaTp, AllGatherAndBroadcast) {
  std::vector<std::vector<uint8_t>> gathered(2), bcast(2);
  const size_t bytes = 12345;
  run_ranks(2, [&](int rank, CudaCommunicator& c) {
    std::vector<uint8_t> mine(bytes);
    for (size_t i = 0; i < bytes; ++i) mine[i] = uint8_t(i * 7 + rank * 101);
    Dev<uint8_t> send(mine), recv(2 * bytes);
    c.all_gather(send.p(), recv.p(), bytes, nullptr);
    Dev<uint8_t> b(mine);
    c.broadcast(b.p(), bytes, 1, nullptr);
    GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
    gathered[rank] = recv.download();
    bcast[rank] = b.download();
  });
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(gathered[r][i], uint8_t(i * 7)) << r;
      ASSERT_EQ(gathered[r][bytes + i], uint8_t(i * 7 + 101)) << r;
      ASSERT_EQ(bcast[r][i], uint8_t(i * 7 + 101)) << r;
    }
  }
}

// Small all-gathers (multiples of 8 bytes up to 16 KiB) take the LL kernel, the others NCCL: both
// must lay every rank's part out in rank order, from aligned and unaligned buffers, with send
// aliasing the rank's own part of recv, eager and from a graph replayed twice.
TEST_F(CudaTp, AllGatherSmallAndLarge) {
  const std::vector<size_t> sizes = {8, 16, 512, 4096, 16384, 16392, 12345, 100000};
  const int world = 2;
  for (size_t offset : {0, 3})
    for (bool graph : {false, true}) {
      std::vector<std::vector<std::vector<uint8_t>>> got(world);
      run_ranks(world, [&](int rank, CudaCommunicator& c) {
        cudaStream_t st;
        GPTOSS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        for (size_t bytes : sizes) {
          std::vector<uint8_t> mine(bytes);
          for (size_t i = 0; i < bytes; ++i) mine[i] = uint8_t(i * 13 + rank * 71 + bytes);
          Dev<uint8_t> recv(world * bytes + offset);
          uint8_t* r = recv.p() + offset;
          uint8_t* send = r + rank * bytes;  // in place, as vocab_parallel_argmax calls it
          auto call = [&] { c.all_gather(send, r, bytes, st); };
          GPTOSS_CUDA_CHECK(cudaMemcpyAsync(send, mine.data(), bytes, cudaMemcpyHostToDevice, st));
          if (graph) {
            CapturedGraph graph(st, call);
            graph.launch(st);
            graph.launch(st);
            GPTOSS_CUDA_CHECK(cudaStreamSynchronize(st));
          } else {
            call();
          }
          GPTOSS_CUDA_CHECK(cudaStreamSynchronize(st));
          std::vector<uint8_t> all = recv.download();
          got[rank].emplace_back(all.begin() + offset, all.end());
        }
        GPTOSS_CUDA_CHECK(cudaStreamDestroy(st));
      });
      for (int rank = 0; rank < world; ++rank)
        for (size_t s = 0; s < sizes.size(); ++s) {
          const size_t bytes = sizes[s];
          size_t bad = 0;
          for (int from = 0; from < world; ++from)
            for (size_t i = 0; i < bytes; ++i) bad += got[rank][s][from * bytes + i] != uint8_t(i * 13 + from * 71 + bytes);
          EXPECT_EQ(bad, 0u) << "rank " << rank << " bytes " << bytes << " offset " << offset << (graph ? " graph" : "");
        }
    }
}

// A rank waiting in a peer-memory kernel for a peer that never comes is released as soon as the
// group is aborted (another rank failed: Communicator::abort raises the flag the kernel polls),
// not after GPTOSS_TP_TIMEOUT_S: its stream reports an error. In a child process (the trap ends
// the CUDA context): exit code 3 = released within 60 s of a 600 s timeout.
[[noreturn]] void wait_for_a_peer_then_abort() {
  setenv("GPTOSS_TP_TIMEOUT_S", "600", 1);
  const CommId id = cuda_new_comm_id();
  std::unique_ptr<Communicator> c0, c1;
  std::thread t1([&] { c1 = make_cuda_communicator(id, 1, 2, 1); });
  c0 = make_cuda_communicator(id, 0, 2, 0);
  t1.join();
  auto& cc = dynamic_cast<CudaCommunicator&>(*c0);
  if (cc.peer_capacity_bytes() == 0) std::_Exit(6);  // no peer memory: nothing to test
  GPTOSS_CUDA_CHECK(cudaSetDevice(0));
  Dev<float> d(2880);
  const auto t0 = std::chrono::steady_clock::now();
  cc.ll_all_reduce(d.p(), 2880, nullptr);  // rank 1 never joins
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    c0->abort("test: a peer failed");
  });
  const cudaError_t e = cudaDeviceSynchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Out at once: the aborter may still be inside NCCL's abort on a context the trap has ended.
  std::_Exit(e == cudaSuccess ? 4 : s < 60 ? 3 : 5);
}

TEST_F(CudaTp, AbortReleasesAWaitingPeerMemoryKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(wait_for_a_peer_then_abort(), ::testing::ExitedWithCode(3), "");
}

// Vocab-parallel greedy (vocab_parallel_argmax): each rank holds its slice of the rows (uneven
// split, odd row stride so the rows are unaligned), only (value, id) pairs cross; the ids must be
// argmax_rows' over the whole rows, tie rule included: a tie across the slice boundary, a tie
// inside one slice, a slice of NaNs, rows of -inf and of NaNs, the max on the boundary, and
// random rows.
TEST_F(CudaTp, VocabParallelArgmaxEqualsWholeRowArgmax) {
  const int V = 1001, world = 2, n = 12;
  GptOssConfig cfg;
  cfg.vocab = V;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  FastRng g(fresh_seed());
  std::vector<float> rows(size_t(n) * V);
  for (auto& v : rows) v = g.normalish();
  auto row = [&](int i) { return rows.data() + size_t(i) * V; };
  const int boundary = TpShard{1, world}.vocab(cfg).begin;
  row(0)[boundary + 100] = 9.f; row(0)[boundary - 100] = 9.f;                 // tie across ranks: rank 0's id
  row(1)[boundary + 10] = 9.f; row(1)[boundary + 300] = 9.f;                  // tie inside rank 1
  std::fill(row(2), row(2) + boundary, nan); row(2)[boundary + 7] = 9.f;       // rank 0 all NaN
  std::fill(row(3), row(3) + V, -inf);                                        // all -inf: id 0
  std::fill(row(4), row(4) + V, nan);                                         // all NaN: id 0
  row(5)[boundary] = 9.f;                                                     // first id of rank 1
  row(6)[boundary - 1] = 9.f;                                                 // last id of rank 0
  std::fill(row(7), row(7) + V, nan); row(7)[V - 1] = -inf;                   // one -inf among NaNs
  row(8)[0] = 9.f; row(8)[V - 1] = 9.f;
  std::vector<int32_t> want(n);
  for (int i = 0; i < n; ++i) {
    float best = -inf;
    int bi = -1;
    for (int j = 0; j < V; ++j)
      if (row(i)[j] > best || (row(i)[j] == best && bi < 0)) { best = row(i)[j]; bi = j; }
    want[i] = bi < 0 ? 0 : bi;
  }
  EXPECT_EQ(want[0], boundary - 100);
  EXPECT_EQ(want[1], boundary + 10);
  EXPECT_EQ(want[3], 0);
  EXPECT_EQ(want[4], 0);
  EXPECT_EQ(want[7], V - 1);
  std::vector<std::vector<int32_t>> got(world), whole(world), got_s(world), whole_s(world);
  run_ranks(world, [&](int rank, CudaCommunicator& c) {
    const TpShard shard{rank, world};
    const int ld = cuda::tp_max_vocab_slice(cfg, shard) + 3;
    const IndexRange v = shard.vocab(cfg);
    std::vector<float> gather(size_t(world) * n * ld, 0.f);
    for (int i = 0; i < n; ++i)
      std::copy(row(i) + v.begin, row(i) + v.end, gather.begin() + (size_t(rank) * n + i) * ld);
    Dev<float> dg(gather), dfull(rows);
    Dev<cuda::RowMax> pairs(size_t(world) * n);
    Dev<int32_t> ids(n), ids_whole(n);
    cuda::vocab_parallel_argmax(c, cfg, shard, dg.p(), ld, n, pairs.p(), ids.p(), nullptr);
    cuda::argmax_rows(dfull.p(), n, V, ids_whole.p(), nullptr);
    got[rank] = ids.download();
    whole[rank] = ids_whole.download();
    // The sampler's rule at temperature 0 (what forward_sample of greedy rows must pick).
    cuda::vocab_parallel_argmax(c, cfg, shard, dg.p(), ld, n, pairs.p(), ids.p(), nullptr, true);
    RowSampling greedy;
    greedy.temperature = 0.f;
    Dev<RowSampling> how(std::vector<RowSampling>(n, greedy));
    cuda::sample_rows(dfull.p(), n, V, how.p(), ids_whole.p(), nullptr);
    got_s[rank] = ids.download();
    whole_s[rank] = ids_whole.download();
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(whole[r], want) << "argmax_rows, rank " << r;
    EXPECT_EQ(got[r], want) << "vocab_parallel_argmax, rank " << r;
    EXPECT_EQ(got_s[r], whole_s[r]) << "vocab_parallel_argmax (sampler rule) vs sample_rows, rank " << r;
    EXPECT_EQ(got_s[r][7], 0) << "a row whose largest logit is -inf: the sampler takes id 0";
  }
}

// Expert-parallel routing (one GPU): moe_route over all experts but with groups only for the
// held range [eb, ee), numbered from eb, at the same sorted slots as the full routing.
class TpRouting : public CudaTest {};

TEST_F(TpRouting, ExpertRangeKeepsHeldGroupsAtTheirSlots) {
  for (int n : {1, 7, 64, 300}) {
    const int E = 128, k = 4, P = n * k;
    FastRng g(fresh_seed());
    std::vector<float> logits(size_t(n) * E);
    for (auto& v : logits) v = float(int(g.next() % 100000)) * 1e-4f;  // distinct enough
    Dev<float> dl(logits);
    struct Groups {
      std::vector<int32_t> expert, start, end, topk, slot, token;
      int n_groups, n_tiles;
    };
    auto route = [&](int eb, int ee) {
      Dev<uint8_t> mem(cuda::moe_routing_bytes(P, E));
      auto r = cuda::moe_routing_carve(mem.p(), P, E);
      cuda::moe_route(dl.p(), n, E, k, r, 0, eb, ee);
      GPTOSS_CUDA_CHECK(cudaDeviceSynchronize());
      Groups out;
      int32_t counts[2];
      GPTOSS_CUDA_CHECK(cudaMemcpy(counts, r.counts, 8, cudaMemcpyDeviceToHost));
      out.n_groups = counts[0];
      out.n_tiles = counts[1];
      auto get = [&](const int32_t* p, int cnt) {
        std::vector<int32_t> v(cnt);
        if (cnt) GPTOSS_CUDA_CHECK(cudaMemcpy(v.data(), p, cnt * 4, cudaMemcpyDeviceToHost));
        return v;
      };
      out.expert = get(r.group_expert, out.n_groups);
      out.start = get(r.group_start, out.n_groups);
      out.end = get(r.group_end, out.n_groups);
      out.topk = get(r.topk_idx, P);
      out.slot = get(r.slot_pair, P);
      out.token = get(r.pair_token, P);
      return out;
    };
    const Groups full = route(0, E);
    for (auto [eb, ee] : {std::pair{0, 64}, std::pair{64, 128}, std::pair{32, 64}}) {
      const Groups part = route(eb, ee);
      EXPECT_EQ(part.topk, full.topk);
      std::vector<int32_t> want_e, want_s, want_t;
      int tiles = 0;
      for (int i = 0; i < full.n_groups; ++i)
        if (full.expert[i] >= eb && full.expert[i] < ee) {
          want_e.push_back(full.expert[i] - eb);
          want_s.push_back(full.start[i]);
          want_t.push_back(full.end[i]);
          tiles += (full.end[i] - full.start[i] + cuda::kGemmBM - 1) / cuda::kGemmBM;
        }
      EXPECT_EQ(part.expert, want_e) << "n=" << n << " range " << eb << ".." << ee;
      EXPECT_EQ(part.start, want_s);
      EXPECT_EQ(part.end, want_t);
      EXPECT_EQ(part.n_tiles, tiles);
      // Every pair keeps a slot of its own (a permutation) inside its expert's full range.
      std::vector<int> seen(P, 0);
      for (int p = 0; p < P; ++p) {
        const int sl = part.slot[p];
        ASSERT_TRUE(sl >= 0 && sl < P);
        ++seen[sl];
        EXPECT_EQ(part.token[sl], p / k);
        for (int i = 0; i < full.n_groups; ++i)
          if (full.expert[i] == part.topk[p]) { EXPECT_TRUE(sl >= full.start[i] && sl < full.end[i]); }
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), P);
    }
  }
}

}  // namespace
}  // namespace gptoss
