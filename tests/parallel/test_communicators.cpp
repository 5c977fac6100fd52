// The CPU communicators: every rank gets the rank-order sum bit for bit (threads and TCP give
// the same bits), gathers and broadcasts land where they should, and a rank that stops coming
// (abort, a closed connection) releases the others with an error instead of a hang.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "backend/parallel/local_communicator.h"
#include "backend/parallel/tcp_communicator.h"
#include "backend/parallel/tcp_star.h"
#include "common/error.h"
#include "free_port.h"

namespace gptoss {
namespace {

using test::free_port;

std::vector<std::unique_ptr<Communicator>> tcp_group(int world) {
  const int port = free_port();
  std::vector<std::unique_ptr<Communicator>> comms(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      auto stars = tcp_rendezvous("127.0.0.1", port, r, world, 1, 30);
      comms[r] = make_tcp_communicator(std::move(stars[0]));
    });
  for (auto& t : ts) t.join();
  return comms;
}

// Runs f(rank, comm) on one thread per rank; returns each rank's error ("" if none).
std::vector<std::string> on_ranks(std::vector<std::unique_ptr<Communicator>>& comms,
                                  const std::function<void(int, Communicator&)>& f) {
  std::vector<std::string> err(comms.size());
  std::vector<std::thread> ts;
  for (size_t r = 0; r < comms.size(); ++r)
    ts.emplace_back([&, r] {
      try {
        f(int(r), *comms[r]);
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return err;
}

void check_collectives(std::vector<std::unique_ptr<Communicator>>& comms) {
  const int world = int(comms.size());
  const size_t n = 1003;
  std::vector<std::vector<float>> in(world, std::vector<float>(n));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1e3);
  for (auto& v : in)
    for (auto& x : v) x = nd(rng);
  std::vector<float> want(in[0]);  // rank order, as documented
  for (int r = 1; r < world; ++r)
    for (size_t i = 0; i < n; ++i) want[i] += in[r][i];
  std::vector<std::vector<float>> sums(in), gathered(world, std::vector<float>(n * world));
  std::vector<std::vector<int>> bcast(world, std::vector<int>(7, -1));
  auto errors = on_ranks(comms, [&](int r, Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.world(), world);
    c.all_reduce_sum(sums[r].data(), n);
    c.all_gather(in[r].data(), gathered[r].data(), n * sizeof(float));
    // in place: send aliases this rank's slot of recv
    std::vector<float> inplace(n * world);
    std::memcpy(&inplace[r * n], in[r].data(), n * sizeof(float));
    c.all_gather(&inplace[r * n], inplace.data(), n * sizeof(float));
    EXPECT_EQ(inplace, gathered[r]);
    if (r == world - 1)
      for (int i = 0; i < 7; ++i) bcast[r][i] = 100 + i;
    c.broadcast(bcast[r].data(), 7 * sizeof(int), world - 1);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[r], "") << r;
    EXPECT_EQ(0, std::memcmp(sums[r].data(), want.data(), n * sizeof(float))) << "rank " << r << " sum differs";
    for (int k = 0; k < world; ++k)
      EXPECT_EQ(0, std::memcmp(&gathered[r][k * n], in[k].data(), n * sizeof(float))) << r << " " << k;
    EXPECT_EQ(bcast[r], (std::vector<int>{100, 101, 102, 103, 104, 105, 106})) << r;
  }
}

TEST(Communicators, LocalGroupSumsInRankOrder) {
  for (int world : {1, 2, 3, 4}) {
    auto comms = make_local_communicators(world);
    check_collectives(comms);
  }
}

TEST(Communicators, TcpGroupSumsInRankOrder) {
  for (int world : {2, 3}) {
    auto comms = tcp_group(world);
    check_collectives(comms);
  }
}

// A rank that never arrives: abort() releases the ranks waiting for it, and the group stays
// refused afterwards.
TEST(Communicators, AbortReleasesBlockedRanks) {
  auto local = make_local_communicators(3);
  auto tcp = tcp_group(3);
  for (auto* comms : {&local, &tcp}) {
    auto errors = on_ranks(*comms, [&](int r, Communicator& c) {
      std::vector<float> v(16, 1.0f);
      if (r == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        c.abort("rank 2 failed on purpose");
        return;
      }
      c.all_reduce_sum(v.data(), v.size());
    });
    EXPECT_NE(errors[0], "");
    EXPECT_NE(errors[1], "");
    EXPECT_NE(errors[0].find("rank"), std::string::npos) << errors[0];
    std::vector<float> v(4);
    EXPECT_THROW((*comms)[2]->all_reduce_sum(v.data(), v.size()), Error);
  }
}

// A TCP peer that goes away (its process died: the socket closes) is an error naming it.
TEST(Communicators, TcpPeerThatClosesIsAnError) {
  auto comms = tcp_group(2);
  comms[1].reset();  // closes rank 1's socket
  std::vector<float> v(8, 1.0f);
  try {
    comms[0]->all_reduce_sum(v.data(), v.size());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 closed its connection"), std::string::npos) << e.what();
  }
}

TEST(Communicators, TcpRendezvousErrors) {
  const int port = free_port();
  // Nobody listens: the worker gives up at its deadline, naming the address.
  try {
    tcp_rendezvous("127.0.0.1", port, 1, 2, 1, 0.5);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach rank 0 at 127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << e.what();
  }
  // Nobody comes: rank 0 gives up too.
  try {
    tcp_rendezvous("127.0.0.1", port, 0, 2, 1, 0.5);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not arrive"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tcp_rendezvous("127.0.0.1", port, 2, 2, 1, 1), Error);
  EXPECT_THROW(tcp_rendezvous("127.0.0.1", 0, 1, 2, 1, 1), Error);
}

}  // namespace
}  // namespace gptoss
