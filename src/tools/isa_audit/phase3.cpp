// Phase 3: SASS binary audit. Patch the opcode field of one instruction of a cubin, load and run
// each variant through the CUDA driver API in child processes, classify the outcome.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "tools/isa_audit/isa_audit.h"

namespace gptoss::isa {
namespace fs = std::filesystem;
using json = nlohmann::json;

// Set by the CLI: argv words that start this program's isa-audit app (see setup_cli).
std::vector<std::string> g_self_argv;

std::string phase3_probe_ptx(const std::string& target, const std::string& ptx_version) {
  return ".version " + ptx_version + "\n.target " + target +
         "\n.address_size 64\n"
         ".visible .entry p3(.param .u64 p_out, .param .u64 p_in)\n{\n"
         "  .reg .b32 %r<16>;\n  .reg .f32 %f<8>;\n  .reg .b64 %rd<8>;\n"
         "  ld.param.u64 %rd0, [p_out];\n  ld.param.u64 %rd1, [p_in];\n"
         "  cvta.to.global.u64 %rd0, %rd0;\n  cvta.to.global.u64 %rd1, %rd1;\n"
         "  mov.u32 %r0, %tid.x;\n  mul.wide.u32 %rd2, %r0, 16;\n"
         "  add.u64 %rd3, %rd1, %rd2;\n  add.u64 %rd4, %rd0, %rd2;\n"
         "  ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd3];\n"
         "  mov.b32 %f1, %r1;\n  mov.b32 %f2, %r2;\n  mov.b32 %f3, %r3;\n"
         "  fma.rn.f32 %f4, %f1, %f2, %f3;\n"
         "  xor.b32 %r5, %r2, %r4;\n  and.b32 %r5, %r5, %r1;\n"
         "  shl.b32 %r6, %r3, 3;\n  add.u32 %r6, %r6, %r4;\n"
         "  mul.lo.u32 %r7, %r4, %r2;\n  mov.b32 %r8, %f4;\n"
         "  st.global.v4.b32 [%rd4], {%r8, %r5, %r6, %r7};\n  ret;\n}\n";
}

// ------------------------------------------------------------------ driver API (dlopen)
namespace {
using CUresult = int;
using CUdeviceptr = unsigned long long;
struct Driver {
  void* h = nullptr;
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(int*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, int);
  CUresult (*cuDevicePrimaryCtxRetain)(void**, int);
  CUresult (*cuCtxSetCurrent)(void*);
  CUresult (*cuModuleLoadData)(void**, const void*);
  CUresult (*cuModuleGetFunction)(void**, void*, const char*);
  CUresult (*cuModuleUnload)(void*);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*cuLaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                             void**, void**);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuGetErrorName)(CUresult, const char**);
  std::string name(CUresult r) {
    const char* s = nullptr;
    if (cuGetErrorName && cuGetErrorName(r, &s) == 0 && s) return s;
    return "CUresult_" + std::to_string(r);
  }
};
template <class F>
void sym(Driver& d, F& f, const char* n) {
  f = reinterpret_cast<F>(dlsym(d.h, n));
  if (!f) throw Error(std::string("libcuda lacks ") + n);
}
Driver load_driver() {
  Driver d;
  d.h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!d.h) d.h = dlopen("libcuda.so", RTLD_NOW);
  if (!d.h) throw Error("phase 3 needs an NVIDIA GPU and driver: cannot load libcuda.so.1");
  sym(d, d.cuInit, "cuInit");
  sym(d, d.cuDeviceGet, "cuDeviceGet");
  sym(d, d.cuDeviceGetAttribute, "cuDeviceGetAttribute");
  sym(d, d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  sym(d, d.cuCtxSetCurrent, "cuCtxSetCurrent");
  sym(d, d.cuModuleLoadData, "cuModuleLoadData");
  sym(d, d.cuModuleGetFunction, "cuModuleGetFunction");
  sym(d, d.cuModuleUnload, "cuModuleUnload");
  sym(d, d.cuMemAlloc, "cuMemAlloc_v2");
  sym(d, d.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  sym(d, d.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  sym(d, d.cuMemsetD8, "cuMemsetD8_v2");
  sym(d, d.cuLaunchKernel, "cuLaunchKernel");
  sym(d, d.cuCtxSynchronize, "cuCtxSynchronize");
  sym(d, d.cuGetErrorName, "cuGetErrorName");
  return d;
}
constexpr int kThreads = 128, kWords = kThreads * 4;
constexpr int kErrIllegalInstruction = 715;

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// ------------------------------------------------------------------ child
int phase3_child(const std::string& cubin_path, const std::string& kernel, uint64_t offset, int bit0, int nbits,
                 const std::vector<uint32_t>& values, const std::string&) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Driver d;
  try {
    d = load_driver();
  } catch (const std::exception& e) {
    std::printf("FATAL %s\n", e.what());
    return 2;
  }
  auto check = [&](CUresult r, const char* what) {
    if (r != 0) {
      std::printf("FATAL %s: %s\n", what, d.name(r).c_str());
      std::fflush(stdout);
      std::_Exit(2);
    }
  };
  check(d.cuInit(0), "cuInit");
  int dev;
  check(d.cuDeviceGet(&dev, 0), "cuDeviceGet");
  void* ctx;
  check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  const std::string orig = read_file(cubin_path);
  std::vector<uint32_t> in(kWords), ref(kWords), got(kWords);
  for (int i = 0; i < kWords; ++i) {
    float f = 1.0f + 0.37f * float(i % 97) - 0.5f * float(i % 7);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    in[i] = (i % 4 == 3) ? uint32_t(i * 2654435761u) : u;
  }
  CUdeviceptr din, dout;
  check(d.cuMemAlloc(&din, kWords * 4), "cuMemAlloc");
  check(d.cuMemAlloc(&dout, kWords * 4), "cuMemAlloc");
  check(d.cuMemcpyHtoD(din, in.data(), kWords * 4), "cuMemcpyHtoD");
  // Runs one image; returns 0 on success, else the CUresult; `stage` says where it failed.
  auto run = [&](const std::string& image, std::vector<uint32_t>& out, std::string& stage) -> CUresult {
    void* mod = nullptr;
    void* fn = nullptr;
    stage = "load";
    if (CUresult r = d.cuModuleLoadData(&mod, image.data())) return r;
    if (CUresult r = d.cuModuleGetFunction(&fn, mod, kernel.c_str())) {
      d.cuModuleUnload(mod);
      return r;
    }
    stage = "run";
    CUresult r = d.cuMemsetD8(dout, 0xA5, kWords * 4);
    void* args[] = {&dout, &din};
    if (!r) r = d.cuLaunchKernel(fn, 1, 1, 1, kThreads, 1, 1, 0, nullptr, args, nullptr);
    if (!r) r = d.cuCtxSynchronize();
    if (!r) r = d.cuMemcpyDtoH(out.data(), dout, kWords * 4);
    if (!r) d.cuModuleUnload(mod);
    return r;
  };
  std::string stage;
  if (CUresult r = run(orig, ref, stage)) {
    std::printf("FATAL unpatched kernel fails at %s: %s\n", stage.c_str(), d.name(r).c_str());
    return 2;
  }
  std::printf("READY\n");
  for (uint32_t v : values) {
    std::printf("BEGIN %u\n", v);
    std::fflush(stdout);
    std::string img = orig;
    write_insn(img, offset, set_field(read_insn(img, offset), bit0, nbits, v));
    CUresult r = run(img, got, stage);
    if (r && stage == "load") {
      std::printf("RES %u rejected_at_load %s\n", v, d.name(r).c_str());
      continue;
    }
    if (r) {
      std::printf("RES %u %s %s\n", v, r == kErrIllegalInstruction ? "illegal_instruction" : "fault", d.name(r).c_str());
      std::fflush(stdout);
      return 3;  // the context is poisoned
    }
    int ndiff = 0, first = -1;
    for (int i = 0; i < kWords; ++i)
      if (got[i] != ref[i]) ndiff += 1, first = first < 0 ? i : first;
    if (!ndiff) {
      std::printf("RES %u ran_same -\n", v);
    } else {
      int untouched = 0;
      for (int i = 0; i < kWords; ++i) untouched += got[i] == 0xA5A5A5A5u;
      std::printf("RES %u ran_diff words=%d/%d,unwritten=%d,first=%d,ref=0x%08x,got=0x%08x\n", v, ndiff, kWords,
                  untouched, first, ref[first], got[first]);
    }
  }
  std::printf("DONE\n");
  return 0;
}

std::optional<ChildLine> parse_child_line(const std::string& line) {
  std::istringstream is(line);
  std::string w;
  is >> w;
  ChildLine c;
  if (w == "BEGIN") {
    c.begin = true;
    if (!(is >> c.value)) return std::nullopt;
    return c;
  }
  if (w == "RES") {
    if (!(is >> c.value >> c.klass)) return std::nullopt;
    std::getline(is, c.detail);
    size_t a = c.detail.find_first_not_of(' ');
    c.detail = a == std::string::npos ? "" : c.detail.substr(a);
    return c;
  }
  return std::nullopt;
}

// ------------------------------------------------------------------ parent
namespace {
struct Site {
  std::string name;  // "FFMA@0x0080"
  uint64_t file_offset = 0;
  uint32_t insn_offset = 0;
  uint32_t original = 0;
};

json record_json(const Phase3Record& r) {
  return {{"site", r.site}, {"value", r.value}, {"class", r.klass}, {"detail", r.detail},
          {"disasm", r.disasm}, {"known", r.known}, {"seconds", r.seconds}};
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string buf;
  const Site* site = nullptr;
  std::deque<uint32_t> pending;  // values not yet begun
  bool in_flight = false;
  uint32_t current = 0;
  std::chrono::steady_clock::time_point started;
  bool ready = false;
  std::string fatal;
};

pid_t spawn(const std::vector<std::string>& argv, int& fd) {
  int p[2];
  if (pipe2(p, O_CLOEXEC)) throw Error("pipe failed");
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw Error("fork failed");
  if (pid == 0) {
    dup2(p[1], 1);
    int dn = open("/dev/null", O_WRONLY);
    if (dn >= 0) dup2(dn, 2);
    setpgid(0, 0);
    execv(a[0], a.data());
    _exit(127);
  }
  close(p[1]);
  fd = p[0];
  return pid;
}
}  // namespace

Phase3Summary run_phase3(const Phase3Options& opt) {
  auto t0 = std::chrono::steady_clock::now();
  if (opt.out_dir.empty()) throw Error("phase 3 needs --out");
  fs::path out = opt.out_dir;
  fs::create_directories(out);
  // The cubin under test.
  fs::path cubin = opt.cubin;
  if (cubin.empty()) {
    Toolkit tk = detect_toolkit();
    fs::path ptx = out / "p3.ptx";
    cubin = out / "p3.cubin";
    write_file(ptx, phase3_probe_ptx(opt.target, tk.ptx_version));
    auto r = run_process({tk.ptxas, "-arch=" + opt.target, "-o", cubin.string(), ptx.string()}, 120);
    if (r.exit_code != 0) throw Error("ptxas failed on the phase 3 probe: " + r.err);
  }
  const std::string bytes = read_file(cubin);
  const CubinSection text = cubin_text(bytes, opt.kernel);
  // The GPU must be there before anything else is spent.
  {
    Driver d = load_driver();
    if (CUresult r = d.cuInit(0)) throw Error("phase 3 needs a GPU: cuInit failed with " + d.name(r));
    int dev, maj = 0, min = 0;
    if (CUresult r = d.cuDeviceGet(&dev, 0)) throw Error("phase 3 needs a GPU: " + d.name(r));
    d.cuDeviceGetAttribute(&maj, 75, dev);
    d.cuDeviceGetAttribute(&min, 76, dev);
    if (!opt.quiet) std::fprintf(stderr, "phase3: GPU compute capability %d.%d\n", maj, min);
  }
  std::string nvdisasm = opt.disassembler.empty() ? find_tool("nvdisasm") : opt.disassembler;
  // Unpatched disassembly: find the sites.
  std::vector<SassInsn> insns;
  if (!nvdisasm.empty()) {
    auto r = run_process({nvdisasm, cubin.string()}, 60);
    insns = parse_sass(r.out);
    write_file(out / "p3.sass", r.out + r.err);
  }
  if (insns.empty())
    if (std::string cuobjdump = find_tool("cuobjdump"); !cuobjdump.empty()) {
      auto r = run_process({cuobjdump, "-sass", cubin.string()}, 60);
      insns = parse_sass(r.out);
      write_file(out / "p3.sass", r.out + r.err);
    }
  std::vector<Site> sites;
  for (auto& spec : opt.patch) {
    Site s;
    if (spec.rfind("op:", 0) == 0) {  // first instruction whose field equals this value
      uint32_t want = uint32_t(std::stoul(spec.substr(3), nullptr, 0));
      bool found = false;
      for (uint64_t o = 0; o < text.size && !found; o += 16)
        if (get_field(read_insn(bytes, text.offset + o), opt.field_bit0, opt.field_bits) == want) {
          s.insn_offset = uint32_t(o), found = true;
          char b[48];
          std::snprintf(b, sizeof b, "op0x%03x@0x%04x", want, unsigned(o));
          s.name = b;
          for (auto& i : insns)
            if (i.offset == o) s.name = i.opcode + std::string(std::strchr(b, '@'));
        }
      if (!found) throw Error("phase 3: no instruction with field value " + spec);
    } else if (spec.rfind("@", 0) == 0) {
      s.insn_offset = uint32_t(std::stoul(spec.substr(1), nullptr, 0));
      s.name = spec;
      for (auto& i : insns)
        if (i.offset == s.insn_offset) s.name = i.opcode + spec;
    } else {
      bool found = false;
      for (auto& i : insns)
        if (i.opcode.rfind(spec, 0) == 0) {
          s.insn_offset = i.offset, found = true;
          char b[32];
          std::snprintf(b, sizeof b, "@0x%04x", i.offset);
          s.name = i.opcode + b;
          break;
        }
      if (!found) throw Error("phase 3: no instruction " + spec + " in the cubin (nvdisasm " +
                              (nvdisasm.empty() ? "not found" : "found") + ")");
    }
    if (s.insn_offset + 16 > text.size) throw Error("phase 3: site beyond the kernel text: " + spec);
    s.file_offset = text.offset + s.insn_offset;
    s.original = get_field(read_insn(bytes, s.file_offset), opt.field_bit0, opt.field_bits);
    sites.push_back(s);
  }
  // Resume: what is done already.
  fs::path jl = out / "phase3.jsonl";
  std::map<std::pair<std::string, uint32_t>, Phase3Record> done;
  if (fs::exists(jl)) {
    std::ifstream f(jl);
    for (std::string line; std::getline(f, line);) {
      try {
        auto j = json::parse(line);
        Phase3Record r{j["site"], j["value"], j["class"], j["detail"], j["disasm"], j["known"], j["seconds"]};
        done[{r.site, r.value}] = r;
      } catch (...) {
      }
    }
  }
  std::ofstream jout(jl, std::ios::app);
  std::mutex mu;
  auto record = [&](const Phase3Record& r) {
    std::lock_guard<std::mutex> lk(mu);
    done[{r.site, r.value}] = r;
    jout << record_json(r).dump() << "\n";
    jout.flush();
  };
  uint32_t nvals = opt.field_bits >= 32 ? 0xffffffffu : (1u << opt.field_bits);
  struct Todo {
    const Site* site;
    uint32_t value;
    bool known;
    std::string disasm;
  };
  std::vector<Todo> todo;
  size_t planned = 0;
  for (auto& s : sites)
    for (uint32_t v = 0; v < nvals; ++v) {
      if (opt.max_variants && planned >= opt.max_variants) break;
      ++planned;
      if (!done.count({s.name, v})) todo.push_back({&s, v, false, "(not checked)"});
    }
  // Step A: does nvdisasm decode each variant? (parallel, cheap)
  if (!nvdisasm.empty()) {
    fs::path tmp = out / "tmp";
    fs::create_directories(tmp);
    std::atomic<size_t> next{0};
    auto worker = [&](int id) {
      fs::path f = tmp / ("v" + std::to_string(id) + ".cubin");
      for (size_t i; (i = next++) < todo.size();) {
        if (since(t0) > opt.budget_s * opt.disasm_share) break;
        auto& t = todo[i];
        t.disasm.clear();
        std::string img = bytes;
        write_insn(img, t.site->file_offset,
                   set_field(read_insn(img, t.site->file_offset), opt.field_bit0, opt.field_bits, t.value));
        write_file(f, img);
        auto r = run_process({nvdisasm, f.string()}, 30);
        if (r.exit_code == 0)
          for (auto& s : parse_sass(r.out))
            if (s.offset == t.site->insn_offset) {
              t.disasm = s.text;
              std::string u = s.opcode;
              std::transform(u.begin(), u.end(), u.begin(), ::toupper);
              t.known = u.find('?') == std::string::npos && u.rfind("UNKNOWN", 0) && u.rfind("INVALID", 0);
            }
        if (!t.known && r.exit_code == 0) {
          char mark[16];
          std::snprintf(mark, sizeof mark, "/*%04x*/", t.site->insn_offset);
          size_t p = r.out.find(mark);
          if (p != std::string::npos) {
            size_t e = r.out.find('\n', p);
            std::string line = r.out.substr(p + std::strlen(mark), e == std::string::npos ? std::string::npos : e - p - std::strlen(mark));
            size_t a = line.find_first_not_of(" \t");
            t.disasm = "(printed: " + (a == std::string::npos ? std::string() : line.substr(a, 120)) + ")";
          } else {
            t.disasm = "(nvdisasm printed no instruction at the site)";
          }
        } else if (!t.known) {
          std::string m = r.err;
          while (!m.empty() && (m.back() == '\n' || m.back() == '\r')) m.pop_back();
          t.disasm = m.empty() ? "" : "(nvdisasm: " + m.substr(0, 160) + ")";
        }
      }
    };
    std::vector<std::thread> th;
    int n = std::max(1, int(std::thread::hardware_concurrency()));
    for (int i = 0; i < n; ++i) th.emplace_back(worker, i);
    for (auto& x : th) x.join();
    fs::remove_all(tmp);
  }
  // Unknown-to-the-disassembler variants first: they are the point of the audit.
  std::stable_sort(todo.begin(), todo.end(), [&](const Todo& a, const Todo& b) {
    return opt.known_first ? (a.known && !b.known) : (!a.known && b.known);
  });
  std::map<std::pair<const Site*, uint32_t>, const Todo*> info;
  for (auto& t : todo) info[{t.site, t.value}] = &t;
  // Step B: run on the GPU, `workers` children at a time, chunks of values per child.
  std::deque<std::pair<const Site*, std::deque<uint32_t>>> queue;
  const size_t chunk = 64;
  for (size_t i = 0; i < todo.size();) {
    std::deque<uint32_t> vals;
    const Site* s = todo[i].site;
    while (i < todo.size() && todo[i].site == s && vals.size() < chunk) vals.push_back(todo[i++].value);
    queue.push_back({s, vals});
  }
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<Child> kids(std::max(1, opt.workers));
  auto finish = [&](const Site* s, uint32_t v, const std::string& klass, const std::string& detail, double secs) {
    Phase3Record r;
    r.site = s->name, r.value = v, r.klass = (v == s->original && klass == "ran_same") ? "original" : klass;
    r.detail = detail, r.seconds = secs;
    if (auto it = info.find({s, v}); it != info.end()) r.known = it->second->known, r.disasm = it->second->disasm;
    record(r);
  };
  auto start_child = [&](Child& c, const Site* s, std::deque<uint32_t> vals) {
    std::string list;
    for (auto v : vals) {
      if (!list.empty()) list += ',';
      list += std::to_string(v);
    }
    fs::path lf = out / ("values_" + std::to_string(&c - kids.data()) + ".txt");
    write_file(lf, list);
    std::vector<std::string> argv{self};
    argv.insert(argv.end(), g_self_argv.begin(), g_self_argv.end());
    argv.insert(argv.end(), {"phase3-child", "--cubin", cubin.string(), "--kernel", opt.kernel, "--offset",
                             std::to_string(s->file_offset), "--bit0", std::to_string(opt.field_bit0), "--bits",
                             std::to_string(opt.field_bits), "--values", lf.string()});
    c = Child{};
    c.pid = spawn(argv, c.fd);
    c.site = s, c.pending = vals, c.started = std::chrono::steady_clock::now();
  };
  auto reap = [&](Child& c, bool killed) {
    if (c.pid < 0) return;
    if (killed) kill(-c.pid, SIGKILL), kill(c.pid, SIGKILL);
    close(c.fd);
    int st = 0;
    waitpid(c.pid, &st, 0);
    double secs = since(c.started);
    if (c.in_flight) {
      std::string how = killed ? "hang" : WIFSIGNALED(st) ? "crash" : "fault";
      std::string det = killed ? "no result within " + std::to_string(int(opt.timeout_s)) + " s, killed"
                       : WIFSIGNALED(st) ? "child died of signal " + std::to_string(WTERMSIG(st))
                                         : "child exited " + std::to_string(WEXITSTATUS(st)) + " mid-variant";
      finish(c.site, c.current, how, det, secs);
      c.in_flight = false;
    }
    if (!c.fatal.empty() && !c.ready) throw Error("phase 3 child failed: " + c.fatal);
    if (!c.pending.empty()) queue.push_front({c.site, c.pending});
    c.pid = -1;
  };
  size_t tried_now = 0;
  bool stopping = false;
  while (true) {
    if (!stopping && since(t0) > opt.budget_s) {
      stopping = true;
      if (!opt.quiet) std::fprintf(stderr, "phase3: budget reached\n");
    }
    for (auto& c : kids)
      if (c.pid < 0 && !queue.empty() && !stopping) {
        auto [s, vals] = queue.front();
        queue.pop_front();
        start_child(c, s, vals);
      }
    std::vector<pollfd> fds;
    std::vector<Child*> who;
    for (auto& c : kids)
      if (c.pid >= 0) fds.push_back({c.fd, POLLIN, 0}), who.push_back(&c);
    if (fds.empty()) break;
    poll(fds.data(), fds.size(), 200);
    for (size_t i = 0; i < fds.size(); ++i) {
      Child& c = *who[i];
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char b[4096];
        ssize_t k = read(c.fd, b, sizeof b);
        if (k <= 0) {
          reap(c, false);
          continue;
        }
        c.buf.append(b, k);
        for (size_t nl; (nl = c.buf.find('\n')) != std::string::npos;) {
          std::string line = c.buf.substr(0, nl);
          c.buf.erase(0, nl + 1);
          if (line == "READY") c.ready = true;
          if (line.rfind("FATAL", 0) == 0) c.fatal = line;
          auto cl = parse_child_line(line);
          if (!cl) continue;
          if (cl->begin) {
            c.in_flight = true, c.current = cl->value, c.started = std::chrono::steady_clock::now();
            if (!c.pending.empty() && c.pending.front() == cl->value) c.pending.pop_front();
          } else {
            finish(c.site, cl->value, cl->klass, cl->detail, since(c.started));
            c.in_flight = false;
            ++tried_now;
            if (!opt.quiet && tried_now % 256 == 0)
              std::fprintf(stderr, "phase3: %zu variants run, %.0f s\n", tried_now, since(t0));
          }
        }
      }
      if (c.pid >= 0) {
        double limit = c.ready ? opt.timeout_s : opt.timeout_s + 30;  // start-up gets longer
        if (since(c.started) > limit || (stopping && since(t0) > opt.budget_s + opt.timeout_s)) {
          if (!c.in_flight && stopping) c.pending.clear();
          reap(c, true);
        }
      }
    }
    if (stopping)
      for (auto& c : kids) c.pending.clear();
  }
  for (size_t i = 0; i < kids.size(); ++i) {
    std::error_code ec;
    fs::remove(out / ("values_" + std::to_string(i) + ".txt"), ec);
  }
  Phase3Summary s;
  s.planned = planned;
  s.seconds = since(t0);
  double before = 0;  // time spent by earlier (resumed) runs on this output directory
  if (fs::exists(out / "phase3_summary.json")) try {
      {
        auto pj = json::parse(read_file(out / "phase3_summary.json"));
        before = pj.value("seconds_total", pj.value("seconds_this_run", 0.0));
      }
    } catch (...) {
    }
  s.seconds_total = before + s.seconds;
  for (auto& [k, r] : done) {
    s.records.push_back(r);
    ++s.by_class[r.klass];
  }
  s.tried = s.records.size();
  write_file(out / "phase3.md", phase3_markdown(s, opt));
  json sj = {{"tried", s.tried}, {"planned", s.planned}, {"seconds_this_run", s.seconds},
             {"seconds_total", s.seconds_total}, {"by_class", s.by_class},
             {"field_bit0", opt.field_bit0}, {"field_bits", opt.field_bits}, {"sites", json::array()}};
  for (auto& st : sites)
    sj["sites"].push_back({{"name", st.name}, {"offset", st.insn_offset}, {"original_field", st.original}});
  write_file(out / "phase3_summary.json", sj.dump(1));
  return s;
}

Phase3Summary phase3_report(const Phase3Options& opt) {
  fs::path out = opt.out_dir;
  Phase3Summary s;
  auto sj = json::parse(read_file(out / "phase3_summary.json"));
  s.planned = sj.value("planned", size_t(0));
  s.seconds = sj.value("seconds_this_run", 0.0);
  s.seconds_total = sj.value("seconds_total", s.seconds);
  std::map<std::pair<std::string, uint32_t>, Phase3Record> done;
  std::ifstream f(out / "phase3.jsonl");
  if (!f) throw Error("no " + (out / "phase3.jsonl").string());
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    auto j = json::parse(line);
    Phase3Record r{j["site"], j["value"], j["class"], j["detail"], j["disasm"], j["known"], j["seconds"]};
    done[{r.site, r.value}] = r;
  }
  for (auto& [k, r] : done) s.records.push_back(r), ++s.by_class[r.klass];
  s.tried = s.records.size();
  write_file(out / "phase3.md", phase3_markdown(s, opt));
  return s;
}

std::string disasm_verdict(const Phase3Record& r) {
  if (r.known) return "decodes";
  if (r.disasm == "(not checked)") return "not checked";
  auto p = r.disasm.find("Opclass '");
  if (p != std::string::npos) {
    auto e = r.disasm.find('\'', p + 9);
    return "opclass " + r.disasm.substr(p + 9, e - p - 9) + ", fields undefined";
  }
  if (r.disasm.find("Unrecognized operation") != std::string::npos) return "unrecognized opcode";
  if (r.disasm.empty()) return "no verdict recorded";
  return "does not decode";
}

std::string phase3_markdown(const Phase3Summary& s, const Phase3Options& opt) {
  std::ostringstream o;
  o << "# SASS binary audit (phase 3)\n\n" << s.tried << " variants recorded of " << s.planned
    << " planned (field bits " << opt.field_bit0 << ".." << opt.field_bit0 + opt.field_bits - 1
    << " of the 128-bit instruction word); " << int(s.seconds_total + 0.5) << " s of runs in all (the last one "
    << int(s.seconds + 0.5) << " s).\n\n| class | count |\n|---|---|\n";
  for (auto& [k, n] : s.by_class) o << "| " << k << " | " << n << " |\n";
  std::map<std::string, std::map<std::string, int>> cross;  // class -> verdict kind
  for (auto& r : s.records) {
    std::string v = disasm_verdict(r);
    ++cross[r.klass][v.rfind("opclass", 0) == 0 ? "opclass" : v];
  }
  o << "\nWhat nvdisasm says about each patched instruction: `decodes` (prints an instruction), `opclass "
       "known` (it names the opcode class but rejects the other fields: 'Opclass X, undefined value'), "
       "`unrecognized` ('Unrecognized operation for functional unit').\n\n"
    << "| class | decodes | opclass known | unrecognized | other | not checked |\n|---|---|---|---|---|---|\n";
  for (auto& [k, m] : cross)
    o << "| " << k << " | " << m["decodes"] << " | " << m["opclass"] << " | " << m["unrecognized opcode"] << " | "
      << m["does not decode"] + m["no verdict recorded"] << " | " << m["not checked"] << " |\n";
  o << "\n## Executed, but the disassembler does not decode the instruction\n\n| site | field value | class | nvdisasm verdict | output vs unpatched | nvdisasm |\n|---|---|---|---|---|---|\n";
  int n = 0;
  for (auto& r : s.records)
    if (!r.known && r.disasm != "(not checked)" &&
        (r.klass == "ran_same" || r.klass == "ran_diff" || r.klass == "original")) {
      char v[16];
      std::snprintf(v, sizeof v, "0x%03x", r.value);
      std::string d = r.disasm.substr(0, r.disasm.find('\n'));
      o << "| " << r.site << " | " << v << " | " << r.klass << " | " << disasm_verdict(r) << " | " << r.detail << " | " << d
        << " |\n";
      ++n;
    }
  if (!n) o << "| (none) | | | | | |\n";
  // Unrecognized opcodes by outcome: does the hardware agree with the disassembler?
  std::map<std::string, int> unrec;
  for (auto& r : s.records)
    if (disasm_verdict(r) == "unrecognized opcode") ++unrec[r.klass];
  o << "\n## Opcodes nvdisasm does not recognize: what the hardware did\n\n| class | count |\n|---|---|\n";
  for (auto& [k, c] : unrec) o << "| " << k << " | " << c << " |\n";
  o << "\n## Named by the disassembler: outcome per mnemonic\n\n| mnemonic | variants | ran_same | ran_diff | illegal | other |\n|---|---|---|---|---|---|\n";
  std::map<std::string, std::array<int, 5>> per;
  for (auto& r : s.records)
    if (r.known) {
      std::string m = r.disasm.substr(0, r.disasm.find(' '));
      if (!m.empty() && m[0] == '@') m = r.disasm.substr(r.disasm.find(' ') + 1), m = m.substr(0, m.find(' '));
      auto& a = per[m];
      ++a[0];
      if (r.klass == "ran_same" || r.klass == "original") ++a[1];
      else if (r.klass == "ran_diff") ++a[2];
      else if (r.klass == "illegal_instruction") ++a[3];
      else ++a[4];
    }
  for (auto& [m, a] : per) o << "| `" << m << "` | " << a[0] << " | " << a[1] << " | " << a[2] << " | " << a[3] << " | " << a[4] << " |\n";
  return o.str();
}

}  // namespace gptoss::isa
