#pragma once
// TCP links of a tensor-parallel group whose ranks are processes (one host or several): a star
// through rank 0. Rank 0 listens on MASTER_ADDR:MASTER_PORT and every other rank connects to
// it, once per channel (channel 0: the control channel rank 0 sends commands and batches on;
// channel 1: the CPU backend's collectives). Blocking sockets with poll()-bounded waits, so
// a peer that dies (connection closed) or stalls (timeout) is an error naming the rank, never a
// hang.
#include <memory>
#include <string>
#include <vector>

namespace gptoss {

class TcpStar {
 public:
  ~TcpStar();
  int rank() const { return rank_; }
  int world() const { return world_; }
  // Exactly `n` bytes to / from `peer` (rank 0: any other rank; others: only 0). timeout_s < 0
  // waits as long as it takes (a worker idling for its next command); a peer that closed the
  // connection or a wait past the timeout throws gptoss::Error naming the peer.
  void send(int peer, const void* p, size_t n);
  void recv(int peer, void* p, size_t n, double timeout_s);
  // The socket of a peer (for poll()); -1 when none.
  int fd(int peer) const;
  // Breaks every link: blocked sends and receives fail at once (abort of the group).
  void shutdown_all();
  double default_timeout_s() const { return timeout_s_; }

 private:
  friend std::vector<std::unique_ptr<TcpStar>> tcp_rendezvous(const std::string&, int, int, int, int, double);
  int rank_ = 0, world_ = 1;
  double timeout_s_ = 300;
  std::vector<int> fds_;  // rank 0: one per peer (index = rank, own = -1); others: [0] = rank 0
};

// Builds the group's links: `channels` stars, element c of the result being channel c. Rank 0
// listens on addr:port and accepts the (world - 1) x channels connections in any order; the
// others connect, retrying until `connect_timeout_s` (rank 0 may start later) and then fail with
// an error naming the address. Collectives wait up to GPTOSS_TP_TIMEOUT_S (default 300) seconds.
std::vector<std::unique_ptr<TcpStar>> tcp_rendezvous(const std::string& addr, int port, int rank, int world,
                                                     int channels, double connect_timeout_s);

}  // namespace gptoss
