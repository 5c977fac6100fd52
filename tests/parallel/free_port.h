#pragma once
// A TCP port pair (p, p + 1) for a test's rendezvous: free now on every interface (rank 0 listens
// on all of them; under torchrun's variables gptoss meets on MASTER_PORT + 1), and below Linux's
// ephemeral range (32768-60999 by default), so no client connection of a test running beside
// this one can be handed the port between this check and rank 0's listen. (A port picked by
// binding port 0 comes from that range: once an HTTP test's client took it, rank 0 could not
// listen and its worker waited out its connect deadline.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>

namespace gptoss::test {

inline bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(uint16_t(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

inline int free_port() {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(20000, 32000);
  for (;;) {
    const int p = pick(rng);
    if (port_free(p) && port_free(p + 1)) return p;
  }
}

}  // namespace gptoss::test
