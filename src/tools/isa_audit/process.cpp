// Child processes (fork/exec with captured output and a timeout) and CUDA tool discovery.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <regex>

#include "common/error.h"
#include "tools/isa_audit/isa_audit.h"

namespace gptoss::isa {
namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& data) {
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f << data;
  if (!f) throw Error("cannot write " + path);
}

ProcResult run_process(const std::vector<std::string>& argv, double timeout_s, const std::string& stdin_data) {
  int po[2], pe[2], pi[2];
  if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC) || pipe2(pi, O_CLOEXEC)) throw Error("pipe failed");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw Error("fork failed");
  if (pid == 0) {
    dup2(pi[0], 0), dup2(po[1], 1), dup2(pe[1], 2);
    setpgid(0, 0);
    execvp(args[0], args.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(po[1]), close(pe[1]), close(pi[0]);
  if (!stdin_data.empty()) {
    signal(SIGPIPE, SIG_IGN);
    [[maybe_unused]] auto n = write(pi[1], stdin_data.data(), stdin_data.size());
  }
  close(pi[1]);
  ProcResult r;
  auto t0 = std::chrono::steady_clock::now();
  pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    int wait_ms = -1;
    if (timeout_s > 0) {
      double left = timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (left <= 0) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        r.timed_out = true;
        break;
      }
      wait_ms = int(left * 1000) + 1;
    }
    int n = poll(fds, 2, wait_ms);
    if (n < 0 && errno == EINTR) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t k = read(fds[i].fd, buf, sizeof buf);
      if (k <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, k);
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFEXITED(st) && !r.timed_out) r.exit_code = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) r.signal = WTERMSIG(st);
  return r;
}

std::string find_tool(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* e = std::getenv("GPTOSS_CUDA_BIN")) dirs.push_back(e);
  if (const char* e = std::getenv("CUDA_HOME")) dirs.push_back(std::string(e) + "/bin");
  dirs.push_back("/usr/local/cuda/bin");
  if (const char* e = std::getenv("PATH")) {
    std::string p = e;
    for (size_t a = 0;;) {
      size_t b = p.find(':', a);
      dirs.push_back(p.substr(a, b == std::string::npos ? std::string::npos : b - a));
      if (b == std::string::npos) break;
      a = b + 1;
    }
  }
  for (auto& d : dirs) {
    if (d.empty()) continue;
    fs::path f = fs::path(d) / name;
    if (access(f.c_str(), X_OK) == 0) return f.string();
  }
  return "";
}

std::string ptx_version_for_release(const std::string& release) {
  int maj = 0, min = 0;
  if (std::sscanf(release.c_str(), "%d.%d", &maj, &min) != 2) throw Error("bad CUDA release " + release);
  // CUDA 12.x: PTX 8.x with 12.6 -> 8.5, 12.7 -> 8.6, 12.8 -> 8.7, 12.9 -> 8.8; CUDA 13.x -> 9.x.
  if (maj >= 13) return std::to_string(9 + (maj - 13)) + "." + std::to_string(min);
  if (maj == 12) {
    static const char* m[] = {"8.0", "8.1", "8.2", "8.3", "8.4", "8.5", "8.5", "8.6", "8.7", "8.8"};
    return m[std::min(min, 9)];
  }
  if (maj == 11) return "7." + std::to_string(std::min(min, 8));
  throw Error("CUDA release " + release + " is too old for this auditor");
}

Toolkit detect_toolkit(const std::string& ptxas_path) {
  Toolkit t;
  t.ptxas = ptxas_path.empty() ? find_tool("ptxas") : ptxas_path;
  if (t.ptxas.empty()) throw Error("ptxas not found (set GPTOSS_CUDA_BIN or CUDA_HOME, or add it to PATH)");
  auto r = run_process({t.ptxas, "--version"}, 60);
  std::smatch m;
  static const std::regex re(R"(release (\d+\.\d+))");
  if (r.exit_code != 0 || !std::regex_search(r.out, m, re))
    throw Error("cannot read the version of " + t.ptxas + ": " + r.out + r.err);
  t.release = m[1];
  t.ptx_version = ptx_version_for_release(t.release);
  return t;
}

}  // namespace gptoss::isa
