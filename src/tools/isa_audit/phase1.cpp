// Phase 1: compile every probe for every target with ptxas, in parallel.
#include <atomic>
#include <chrono>
#include <cstdio>
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

namespace {
std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
  return s;
}
}  // namespace

const CompileResult* Phase1Result::find(const std::string& probe, const std::string& target) const {
  for (auto& r : results)
    if (r.probe == probe && r.target == target) return &r;
  return nullptr;
}

Phase1Result run_phase1(const std::vector<Probe>& probes_in, const Phase1Options& opt) {
  auto t0 = std::chrono::steady_clock::now();
  Phase1Result res;
  res.toolkit = detect_toolkit();
  if (!opt.ptx_version.empty()) res.toolkit.ptx_version = opt.ptx_version;
  res.targets = opt.targets;
  res.probes = probes_in;
  if (opt.out_dir.empty()) throw Error("phase 1 needs an output directory");
  fs::path out = opt.out_dir;
  fs::create_directories(out);

  std::vector<Probe> all = probes_in;
  all.push_back(baseline_probe());
  struct Job {
    const Probe* p;
    std::string target;
  };
  std::vector<Job> jobs;
  for (auto& p : all)
    for (auto& t : opt.targets) jobs.push_back({&p, t});
  std::vector<CompileResult> results(jobs.size());
  std::atomic<size_t> next{0}, done{0};
  std::mutex mu;
  int nthreads = opt.jobs > 0 ? opt.jobs : std::max(1u, std::thread::hardware_concurrency());
  auto worker = [&] {
    for (size_t i; (i = next++) < jobs.size();) {
      auto& j = jobs[i];
      CompileResult& r = results[i];
      r.probe = j.p->name, r.group = j.p->group, r.target = j.target;
      std::string stem = file_stem(j.p->name);
      fs::path ptx = out / "ptx" / j.target / (stem + ".ptx");
      fs::path cubin = out / "cubins" / j.target / (stem + ".cubin");
      write_file(ptx, wrap_probe(*j.p, j.target, res.toolkit.ptx_version));
      std::error_code ec;
      fs::create_directories(cubin.parent_path(), ec);
      fs::remove(cubin, ec);
      auto c0 = std::chrono::steady_clock::now();
      auto pr = run_process({res.toolkit.ptxas, "-arch=" + j.target, "-o", cubin.string(), ptx.string()}, 300);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      r.accepted = pr.exit_code == 0 && fs::exists(cubin);
      std::string msg = trim(pr.err + (pr.out.empty() ? "" : "\n" + pr.out));
      msg = replace_all(msg, ptx.string(), "probe.ptx");
      if (pr.timed_out) msg = "ptxas timed out. " + msg;
      r.message = msg;
      if (r.accepted) r.cubin = fs::relative(cubin, out).string();
      size_t d = ++done;
      if (!opt.quiet && (d % 100 == 0 || d == jobs.size())) {
        std::lock_guard<std::mutex> lk(mu);
        std::fprintf(stderr, "phase1: %zu/%zu compiled\n", d, jobs.size());
      }
    }
  };
  std::vector<std::thread> th;
  for (int i = 0; i < nthreads; ++i) th.emplace_back(worker);
  for (auto& t : th) t.join();
  for (auto& r : results) {
    if (r.probe == "_baseline") {
      if (!r.accepted) throw Error("the probe wrapper alone does not compile for " + r.target + ": " + r.message);
      continue;
    }
    res.results.push_back(r);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_file(out / "phase1.json", phase1_json(res).dump(1));
  write_file(out / "matrix.md", phase1_markdown(res));
  return res;
}

json phase1_json(const Phase1Result& r) {
  json j;
  j["toolkit"] = {{"ptxas", r.toolkit.ptxas}, {"release", r.toolkit.release}, {"ptx_version", r.toolkit.ptx_version}};
  j["targets"] = r.targets;
  j["seconds"] = r.seconds;
  json probes = json::array();
  for (auto& p : r.probes) {
    json pj = {{"name", p.name}, {"group", p.group}, {"tags", p.tags}, {"body", p.body}};
    json rs = json::object();
    for (auto& t : r.targets)
      if (auto* c = r.find(p.name, t))
        rs[t] = {{"accepted", c->accepted}, {"message", c->message}, {"cubin", c->cubin}, {"seconds", c->seconds}};
    pj["results"] = rs;
    probes.push_back(pj);
  }
  j["probes"] = probes;
  json counts = json::object();
  for (auto& t : r.targets) {
    int a = 0, n = 0;
    for (auto& c : r.results)
      if (c.target == t) ++n, a += c.accepted;
    counts[t] = {{"accepted", a}, {"rejected", n - a}};
  }
  j["counts"] = counts;
  return j;
}

Phase1Result phase1_from_json(const json& j) {
  Phase1Result r;
  r.toolkit.ptxas = j["toolkit"]["ptxas"];
  r.toolkit.release = j["toolkit"]["release"];
  r.toolkit.ptx_version = j["toolkit"]["ptx_version"];
  r.targets = j["targets"].get<std::vector<std::string>>();
  r.seconds = j.value("seconds", 0.0);
  for (auto& pj : j["probes"]) {
    Probe p;
    p.name = pj["name"], p.group = pj["group"], p.tags = pj["tags"].get<std::vector<std::string>>();
    p.body = pj.value("body", "");
    r.probes.push_back(p);
    for (auto& [t, c] : pj["results"].items()) {
      CompileResult cr;
      cr.probe = p.name, cr.group = p.group, cr.target = t;
      cr.accepted = c["accepted"], cr.message = c["message"], cr.cubin = c.value("cubin", "");
      cr.seconds = c.value("seconds", 0.0);
      r.results.push_back(cr);
    }
  }
  return r;
}

namespace {
std::string first_error(const std::string& msg) {
  // The most telling line: the first "error", else the first line.
  std::istringstream is(msg);
  std::string line, first;
  while (std::getline(is, line)) {
    line = trim(line);
    if (line.empty()) continue;
    if (first.empty()) first = line;
    if (line.find("error") != std::string::npos) return line;
  }
  return first;
}
std::string md_escape(std::string s) {
  s = replace_all(s, "|", "\\|");
  return replace_all(s, "\n", " ");
}
}  // namespace

std::string phase1_markdown(const Phase1Result& r) {
  std::ostringstream o;
  o << "# PTX support matrix (phase 1)\n\n"
    << "ptxas " << r.toolkit.release << ", PTX ISA " << r.toolkit.ptx_version << ", " << r.probes.size()
    << " probes x " << r.targets.size() << " targets, " << int(r.seconds + 0.5) << " s.\n\n";
  o << "## Accepted per target\n\n| group |";
  for (auto& t : r.targets) o << " " << t << " |";
  o << "\n|---|";
  for (size_t i = 0; i < r.targets.size(); ++i) o << "---|";
  o << "\n";
  std::vector<std::string> groups;
  for (auto& p : r.probes)
    if (std::find(groups.begin(), groups.end(), p.group) == groups.end()) groups.push_back(p.group);
  groups.push_back("**all**");
  for (auto& g : groups) {
    o << "| " << g << " |";
    for (auto& t : r.targets) {
      int a = 0, n = 0;
      for (auto& c : r.results)
        if (c.target == t && (g == "**all**" || c.group == g)) ++n, a += c.accepted;
      o << " " << a << "/" << n << " |";
    }
    o << "\n";
  }
  o << "\n## Matrix\n\n`yes` = accepted by ptxas; `no` = rejected (reason below).\n\n| probe | group |";
  for (auto& t : r.targets) o << " " << t << " |";
  o << "\n|---|---|";
  for (size_t i = 0; i < r.targets.size(); ++i) o << "---|";
  o << "\n";
  for (auto& p : r.probes) {
    o << "| `" << p.name << "` | " << p.group << " |";
    for (auto& t : r.targets) {
      auto* c = r.find(p.name, t);
      o << " " << (!c ? "-" : c->accepted ? "yes" : "no") << " |";
    }
    o << "\n";
  }
  o << "\n## Rejections (ptxas's message)\n\n| probe | target | ptxas |\n|---|---|---|\n";
  for (auto& p : r.probes)
    for (auto& t : r.targets) {
      auto* c = r.find(p.name, t);
      if (c && !c->accepted) o << "| `" << p.name << "` | " << t << " | " << md_escape(first_error(c->message)) << " |\n";
    }
  return o.str();
}

}  // namespace gptoss::isa
