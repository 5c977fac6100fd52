#include "backend/parallel/tcp_star.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/error.h"

namespace gptoss {

namespace {
// Whether a connected TCP socket's two ends are the same address and port (Linux lets a client
// connect to its own ephemeral port on localhost when nothing listens there).
bool connected_to_itself(int fd) {
  sockaddr_storage a{}, b{};
  socklen_t la = sizeof a, lb = sizeof b;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &la) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&b), &lb) != 0) return false;
  return la == lb && std::memcmp(&a, &b, la) == 0;
}
}  // namespace

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHelloMagic = 0x67707470;  // "gptp"

struct Hello {
  uint32_t magic, rank, world, channel;
};

std::string peer_name(int peer) { return "tensor-parallel rank " + std::to_string(peer); }

double env_timeout() {
  if (const char* t = std::getenv("GPTOSS_TP_TIMEOUT_S"); t && *t) {
    char* end = nullptr;
    double v = std::strtod(t, &end);
    if (end && *end == 0 && v > 0) return v;
    throw Error(std::string("GPTOSS_TP_TIMEOUT_S must be a positive number of seconds, not '") + t + "'");
  }
  return 300;
}

// Waits until fd is readable (or writable); false on timeout.
bool wait_fd(int fd, short events, double timeout_s) {
  pollfd p{fd, events, 0};
  const int ms = timeout_s < 0 ? -1 : int(timeout_s * 1000);
  for (;;) {
    int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error(std::string("poll: ") + std::strerror(errno));
    return r > 0;
  }
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void write_all(int fd, const void* p, size_t n, const std::string& who) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error(who + " closed its connection (" + std::strerror(errno) + "): the process exited or was killed");
    c += w;
    n -= size_t(w);
  }
}

void read_all(int fd, void* p, size_t n, double timeout_s, const std::string& who) {
  char* c = static_cast<char*>(p);
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s < 0 ? 0 : timeout_s);
  while (n > 0) {
    double left = -1;
    if (timeout_s >= 0) {
      left = std::chrono::duration<double>(deadline - Clock::now()).count();
      if (left < 0) left = 0;
    }
    if (!wait_fd(fd, POLLIN, left))
      throw Error(who + " sent nothing for " + std::to_string(int(timeout_s)) +
                  " s (GPTOSS_TP_TIMEOUT_S): giving up on the tensor-parallel group");
    ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error(who + " closed its connection: the process exited or was killed");
    c += r;
    n -= size_t(r);
  }
}

addrinfo* resolve(const std::string& addr, int port, bool passive) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  int rc = ::getaddrinfo(addr.empty() ? nullptr : addr.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) throw Error("MASTER_ADDR " + addr + ": " + gai_strerror(rc));
  return res;
}

}  // namespace

TcpStar::~TcpStar() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

int TcpStar::fd(int peer) const {
  if (rank_ == 0) return peer > 0 && peer < world_ ? fds_[peer] : -1;
  return peer == 0 ? fds_[0] : -1;
}

void TcpStar::send(int peer, const void* p, size_t n) {
  const int f = fd(peer);
  if (f < 0) throw Error("tensor-parallel: no link from rank " + std::to_string(rank_) + " to " + std::to_string(peer));
  write_all(f, p, n, peer_name(peer));
}

void TcpStar::recv(int peer, void* p, size_t n, double timeout_s) {
  const int f = fd(peer);
  if (f < 0) throw Error("tensor-parallel: no link from rank " + std::to_string(rank_) + " to " + std::to_string(peer));
  read_all(f, p, n, timeout_s, peer_name(peer));
}

void TcpStar::shutdown_all() {
  for (int fd : fds_)
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

std::vector<std::unique_ptr<TcpStar>> tcp_rendezvous(const std::string& addr, int port, int rank, int world,
                                                     int channels, double connect_timeout_s) {
  if (world < 2) throw Error("tcp_rendezvous: a group of processes needs at least 2 ranks");
  if (rank < 0 || rank >= world) throw Error("tensor-parallel rank " + std::to_string(rank) + " outside 0.." + std::to_string(world - 1));
  if (port <= 0 || port > 65535) throw Error("MASTER_PORT must be a port number from 1 to 65535");
  const double timeout = env_timeout();
  std::vector<std::unique_ptr<TcpStar>> stars;
  for (int c = 0; c < channels; ++c) {
    auto s = std::make_unique<TcpStar>();
    s->rank_ = rank;
    s->world_ = world;
    s->timeout_s_ = timeout;
    s->fds_.assign(rank == 0 ? world : 1, -1);
    stars.push_back(std::move(s));
  }
  const std::string where = addr + ":" + std::to_string(port);
  const auto deadline = Clock::now() + std::chrono::duration<double>(connect_timeout_s);
  if (rank == 0) {
    // Listen on every interface at the port: MASTER_ADDR is how the others reach us.
    addrinfo* ai = resolve("", port, true);
    int lfd = -1;
    // A port briefly held by another rank's self-connected probe (see connected_to_itself) is
    // free again within milliseconds: "in use" is retried for a few seconds before it is an error.
    const auto bind_deadline = Clock::now() + std::chrono::seconds(5);
    for (;;) {
      lfd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
      int one = 1;
      ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(lfd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(lfd, 64) == 0) break;
      const int e = errno;
      std::string err = std::strerror(e);
      ::close(lfd);
      if (e == EADDRINUSE && Clock::now() < bind_deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      ::freeaddrinfo(ai);
      throw Error("tensor-parallel rank 0 cannot listen on port " + std::to_string(port) + " (MASTER_PORT): " + err);
    }
    ::freeaddrinfo(ai);
    int missing = (world - 1) * channels;
    while (missing > 0) {
      double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      if (left <= 0 || !wait_fd(lfd, POLLIN, left)) {
        ::close(lfd);
        throw Error("tensor-parallel rank 0: " + std::to_string(missing) + " connection(s) of the " +
                    std::to_string(world - 1) + " other rank(s) did not arrive at port " + std::to_string(port) +
                    " within " + std::to_string(int(connect_timeout_s)) + " s (are all ranks started with WORLD_SIZE=" +
                    std::to_string(world) + "?)");
      }
      int fd = ::accept(lfd, nullptr, nullptr);
      if (fd < 0) continue;
      Hello h{};
      try {
        read_all(fd, &h, sizeof h, 30, "a connecting rank");
      } catch (const Error&) {
        ::close(fd);
        continue;
      }
      if (h.magic != kHelloMagic || int(h.world) != world || h.rank == 0 || int(h.rank) >= world ||
          int(h.channel) >= channels || stars[h.channel]->fds_[h.rank] >= 0) {
        ::close(fd);
        if (h.magic == kHelloMagic && int(h.world) != world) {
          ::close(lfd);
          throw Error("tensor-parallel rank " + std::to_string(h.rank) + " was started with WORLD_SIZE=" +
                      std::to_string(h.world) + ", rank 0 with " + std::to_string(world));
        }
        continue;  // a stray connection (port scanner, old run): ignore it
      }
      set_nodelay(fd);
      stars[h.channel]->fds_[h.rank] = fd;
      --missing;
    }
    ::close(lfd);
    // Everyone is here: say so, so a rank never starts before the group is complete.
    for (int c = 0; c < channels; ++c)
      for (int r = 1; r < world; ++r) {
        uint32_t ok = kHelloMagic;
        write_all(stars[c]->fds_[r], &ok, sizeof ok, peer_name(r));
      }
    return stars;
  }
  for (int c = 0; c < channels; ++c) {
    for (;;) {
      addrinfo* ai = resolve(addr, port, false);
      int fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
      int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
      std::string err = std::strerror(errno);
      ::freeaddrinfo(ai);
      if (rc == 0 && connected_to_itself(fd)) {
        // Nobody listens yet and the kernel gave this socket the destination port as its own
        // ephemeral port: a TCP self-connection, which would also keep rank 0 from binding the
        // port. Drop it and try again.
        rc = -1;
        err = "connected to itself (rank 0 not listening yet)";
      }
      if (rc == 0) {
        set_nodelay(fd);
        Hello h{kHelloMagic, uint32_t(rank), uint32_t(world), uint32_t(c)};
        write_all(fd, &h, sizeof h, "tensor-parallel rank 0 (" + where + ")");
        stars[c]->fds_[0] = fd;
        break;
      }
      ::close(fd);
      if (Clock::now() > deadline)
        throw Error("tensor-parallel rank " + std::to_string(rank) + " could not reach rank 0 at " + where +
                    " (MASTER_ADDR:MASTER_PORT) within " + std::to_string(int(connect_timeout_s)) + " s: " + err);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  for (int c = 0; c < channels; ++c) {
    uint32_t ok = 0;
    double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    read_all(stars[c]->fds_[0], &ok, sizeof ok, left > 1 ? left : 1, "tensor-parallel rank 0 (" + where + ")");
    if (ok != kHelloMagic) throw Error("tensor-parallel rank 0 at " + where + " answered with something else than gptoss");
  }
  return stars;
}

}  // namespace gptoss
