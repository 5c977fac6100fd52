// Phase 2: disassemble accepted probes, map PTX variants to SASS opcodes.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "tools/isa_audit/isa_audit.h"

namespace gptoss::isa {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string SassInsn::base() const { return opcode.substr(0, opcode.find('.')); }

std::vector<SassInsn> parse_sass(const std::string& text) {
  static const std::regex re(R"(^\s*/\*([0-9a-fA-F]{4,})\*/\s*([^;]*?)\s*;)");
  std::vector<SassInsn> v;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    std::string body = m[2];
    if (body.empty()) continue;
    SassInsn s;
    s.offset = uint32_t(std::stoul(m[1], nullptr, 16));
    std::istringstream ws(body);
    std::string tok;
    ws >> tok;
    if (!tok.empty() && tok[0] == '@') {
      s.guard = tok;
      ws >> tok;
    }
    if (tok.empty() || !std::isalpha((unsigned char)tok[0])) continue;
    s.opcode = tok;
    size_t p = body.find(tok);
    s.text = body.substr(p);
    v.push_back(s);
  }
  return v;
}

std::map<std::string, int> opcode_histogram(const std::vector<SassInsn>& v) {
  std::map<std::string, int> h;
  for (auto& s : v) ++h[s.opcode];
  return h;
}

std::map<std::string, int> subtract_baseline(const std::map<std::string, int>& probe,
                                             const std::map<std::string, int>& baseline) {
  std::map<std::string, int> d;
  for (auto& [op, n] : probe) {
    auto it = baseline.find(op);
    int b = it == baseline.end() ? 0 : it->second;
    if (n > b) d[op] = n - b;
  }
  return d;
}

namespace {
std::vector<std::string> disasm_argv(const std::string& tool, const std::string& cubin) {
  if (fs::path(tool).filename().string().find("nvdisasm") != std::string::npos) return {tool, cubin};
  return {tool, "-sass", cubin};
}
}  // namespace

Phase2Result run_phase2(const Phase1Result& p1, const Phase2Options& opt) {
  auto t0 = std::chrono::steady_clock::now();
  Phase2Result res;
  fs::path out = opt.out_dir;
  if (!opt.from_sass) {
    res.disassembler = opt.disassembler;
    if (res.disassembler.empty()) res.disassembler = find_tool("cuobjdump");
    if (res.disassembler.empty()) res.disassembler = find_tool("nvdisasm");
    if (res.disassembler.empty())
      throw Error("phase 2 needs cuobjdump or nvdisasm (not found; set GPTOSS_CUDA_BIN or pass --disasm)");
  } else {
    res.disassembler = "(existing sass/ files)";
  }
  struct Job {
    std::string probe, target;
  };
  std::vector<Job> jobs;
  for (auto& t : p1.targets) jobs.push_back({"_baseline", t});
  for (auto& c : p1.results)
    if (c.accepted) jobs.push_back({c.probe, c.target});
  std::vector<Phase2Entry> entries(jobs.size());
  std::vector<std::vector<SassInsn>> insns(jobs.size());
  std::atomic<size_t> next{0};
  int nthreads = opt.jobs > 0 ? opt.jobs : std::max(1u, std::thread::hardware_concurrency());
  auto worker = [&] {
    for (size_t i; (i = next++) < jobs.size();) {
      auto& j = jobs[i];
      auto& e = entries[i];
      e.probe = j.probe, e.target = j.target;
      std::string stem = file_stem(j.probe);
      fs::path sass = out / "sass" / j.target / (stem + ".sass");
      std::string text;
      try {
        if (opt.from_sass) {
          text = read_file(sass);
        } else {
          fs::path cubin = out / "cubins" / j.target / (stem + ".cubin");
          auto pr = run_process(disasm_argv(res.disassembler, cubin.string()), 120);
          if (pr.exit_code != 0) {
            e.message = pr.err + pr.out;
            write_file(sass, "// disassembly failed\n" + e.message);
            continue;
          }
          text = pr.out;
          write_file(sass, text);
        }
        insns[i] = parse_sass(text);
        e.ok = !insns[i].empty();
        if (!e.ok) e.message = "no instructions parsed";
      } catch (const std::exception& ex) {
        e.message = ex.what();
      }
    }
  };
  std::vector<std::thread> th;
  for (int i = 0; i < nthreads; ++i) th.emplace_back(worker);
  for (auto& t : th) t.join();
  for (size_t i = 0; i < jobs.size(); ++i)
    if (jobs[i].probe == "_baseline") {
      if (!entries[i].ok) throw Error("cannot disassemble the wrapper for " + jobs[i].target + ": " + entries[i].message);
      res.baseline[jobs[i].target] = opcode_histogram(insns[i]);
    }
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].probe == "_baseline") continue;
    auto& e = entries[i];
    auto h = opcode_histogram(insns[i]);
    for (auto& [op, n] : h) res.distinct[e.target].insert(op);
    e.opcodes = subtract_baseline(h, res.baseline[e.target]);
    res.entries.push_back(e);
  }
  for (auto& [t, h] : res.baseline)
    for (auto& [op, n] : h) res.distinct[t].insert(op);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_file(out / "phase2.json", phase2_json(res).dump(1));
  write_file(out / "sass_table.md", phase2_markdown(p1, res));
  return res;
}

json phase2_json(const Phase2Result& r) {
  json j;
  j["disassembler"] = r.disassembler;
  j["seconds"] = r.seconds;
  j["baseline"] = r.baseline;
  json d = json::object();
  for (auto& [t, s] : r.distinct) d[t] = std::vector<std::string>(s.begin(), s.end());
  j["distinct_opcodes"] = d;
  json e = json::array();
  for (auto& x : r.entries)
    e.push_back({{"probe", x.probe}, {"target", x.target}, {"ok", x.ok}, {"opcodes", x.opcodes}, {"message", x.message}});
  j["entries"] = e;
  return j;
}

std::string phase2_markdown(const Phase1Result& p1, const Phase2Result& r) {
  std::ostringstream o;
  o << "# PTX -> SASS (phase 2)\n\nDisassembler: " << r.disassembler << ". Each cell lists the SASS opcodes the "
    << "probe produced beyond those of the empty wrapper kernel (count in parentheses when > 1); "
    << "`(none)` = no new opcode (e.g. the instruction became wrapper-like code or was optimised away); "
    << "`-` = rejected in phase 1.\n\n| probe |";
  for (auto& t : p1.targets) o << " " << t << " |";
  o << "\n|---|";
  for (size_t i = 0; i < p1.targets.size(); ++i) o << "---|";
  o << "\n";
  std::map<std::pair<std::string, std::string>, const Phase2Entry*> idx;
  for (auto& e : r.entries) idx[{e.probe, e.target}] = &e;
  for (auto& p : p1.probes) {
    o << "| `" << p.name << "` |";
    for (auto& t : p1.targets) {
      auto it = idx.find({p.name, t});
      if (it == idx.end()) {
        o << " - |";
        continue;
      }
      auto& e = *it->second;
      if (!e.ok) {
        o << " (disasm failed) |";
        continue;
      }
      std::string cell;
      for (auto& [op, n] : e.opcodes) {
        if (!cell.empty()) cell += ' ';
        cell += op;
        if (n > 1) {
          cell += '(';
          cell += std::to_string(n);
          cell += ')';
        }
      }
      o << " " << (cell.empty() ? "(none)" : cell) << " |";
    }
    o << "\n";
  }
  o << "\n## Distinct SASS opcodes per target\n\n";
  std::set<std::string> all;
  for (auto& [t, s] : r.distinct) all.insert(s.begin(), s.end());
  for (auto& t : p1.targets) {
    auto it = r.distinct.find(t);
    if (it == r.distinct.end()) continue;
    std::set<std::string> bases;
    for (auto& op : it->second) bases.insert(op.substr(0, op.find('.')));
    o << "### " << t << " (" << it->second.size() << " opcodes with modifiers, " << bases.size() << " base opcodes)\n\n";
    for (auto& b : bases) o << "`" << b << "` ";
    o << "\n\nOnly on " << t << " (among the targets audited): ";
    std::string only;
    for (auto& b : bases) {
      bool elsewhere = false;
      for (auto& [t2, s2] : r.distinct)
        if (t2 != t)
          for (auto& op : s2)
            if (op.substr(0, op.find('.')) == b) elsewhere = true;
      if (!elsewhere) only += "`" + b + "` ";
    }
    o << (only.empty() ? "(none)" : only) << "\n\n";
    // The same against other families only (sm_120a and sm_121a are one family, "sm_12").
    auto family = [](const std::string& t) { return t.substr(0, t.find_last_of("0123456789")); };
    std::string fam = family(t), only_fam;
    for (auto& b : bases) {
      bool elsewhere = false;
      for (auto& [t2, s2] : r.distinct)
        if (family(t2) != fam)
          for (auto& op : s2)
            if (op.substr(0, op.find('.')) == b) elsewhere = true;
      if (!elsewhere) only_fam += "`" + b + "` ";
    }
    o << "Only in the " << fam << "x family: " << (only_fam.empty() ? "(none)" : only_fam) << "\n\n";
  }
  return o.str();
}

}  // namespace gptoss::isa
