// Command line of the auditor, shared by `gptoss isa-audit` and `gptoss-isa-audit`.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "common/error.h"
#include "tools/isa_audit/isa_audit.h"

namespace gptoss::isa {
namespace fs = std::filesystem;
extern std::vector<std::string> g_self_argv;

namespace {
struct Opts {
  std::string catalog, tag, out = "isa-audit-out", disasm, ptx_version;
  std::vector<std::string> targets{"sm_90a", "sm_100a", "sm_120a", "sm_121a"}, filters;
  int jobs = 0;
  bool from_sass = false, quiet = false, p3_report = false;
  Phase3Options p3;
  // child
  std::string c_cubin, c_kernel = "p3", c_values;
  uint64_t c_offset = 0;
  int c_bit0 = 0, c_bits = 12;
};

std::vector<Probe> probes(const Opts& o) {
  auto all = load_catalog(o.catalog.empty() ? default_catalog_path() : o.catalog);
  auto sel = select_probes(all, o.filters, o.tag);
  if (sel.empty()) throw Error("no probe matches the filter/tag");
  return sel;
}
Phase1Result phase1(const Opts& o) {
  Phase1Options p;
  p.targets = o.targets, p.out_dir = o.out, p.jobs = o.jobs, p.quiet = o.quiet, p.ptx_version = o.ptx_version;
  auto r = run_phase1(probes(o), p);
  std::fprintf(stderr, "phase1: %zu probes x %zu targets in %.1f s (ptxas %s, PTX %s) -> %s/matrix.md\n",
               r.probes.size(), r.targets.size(), r.seconds, r.toolkit.release.c_str(), r.toolkit.ptx_version.c_str(),
               o.out.c_str());
  for (auto& t : r.targets) {
    int a = 0, n = 0;
    for (auto& c : r.results)
      if (c.target == t) ++n, a += c.accepted;
    std::printf("%-8s accepted %d/%d\n", t.c_str(), a, n);
  }
  return r;
}
void phase2(const Opts& o, const Phase1Result& p1) {
  Phase2Options p;
  p.out_dir = o.out, p.disassembler = o.disasm, p.from_sass = o.from_sass, p.jobs = o.jobs, p.quiet = o.quiet;
  auto r = run_phase2(p1, p);
  std::fprintf(stderr, "phase2: %zu disassemblies in %.1f s with %s -> %s/sass_table.md\n", r.entries.size(), r.seconds,
               r.disassembler.c_str(), o.out.c_str());
  for (auto& [t, s] : r.distinct) std::printf("%-8s %zu distinct SASS opcodes\n", t.c_str(), s.size());
}
Phase1Result load_phase1(const Opts& o) {
  std::ifstream f(fs::path(o.out) / "phase1.json");
  if (!f) throw Error("no " + o.out + "/phase1.json: run phase1 first");
  return phase1_from_json(nlohmann::json::parse(f));
}
void add_common(CLI::App* s, Opts& o) {
  s->add_option("--catalog", o.catalog, "catalog file (default: the shipped catalog.txt)");
  s->add_option("--target,-t", o.targets, "targets (default sm_90a sm_100a sm_120a sm_121a)")->delimiter(',');
  s->add_option("--filter,-f", o.filters, "keep probes whose name contains, or group is, this")->delimiter(',');
  s->add_option("--tag", o.tag, "keep probes with this tag (e.g. ci: the reduced catalog)");
  s->add_option("--ptx-version", o.ptx_version, "PTX ISA version (default: per ptxas release)");
}
}  // namespace

std::function<int()> setup_cli(void* app_ptr, std::vector<std::string> prefix) {
  auto* app = static_cast<CLI::App*>(app_ptr);
  auto o = std::make_shared<Opts>();
  app->require_subcommand(1);
  app->add_option("--out,-o", o->out, "output directory")->capture_default_str();
  app->add_option("--jobs,-j", o->jobs, "parallel jobs (default: all cores)");
  app->add_flag("--quiet,-q", o->quiet, "less progress output");

  auto* list = app->add_subcommand("list", "List the catalog's probes");
  add_common(list, *o);
  auto* p1 = app->add_subcommand("phase1", "PTX compilation audit: support matrix (markdown + JSON)");
  add_common(p1, *o);
  auto* p2 = app->add_subcommand("phase2", "SASS opcode discovery on phase 1's output");
  p2->add_option("--disasm", o->disasm, "cuobjdump or nvdisasm to use");
  p2->add_flag("--from-sass", o->from_sass, "re-parse sass/ files written by an earlier phase 2");
  auto* all = app->add_subcommand("run", "Phase 1 then phase 2 (phase 2 is skipped when no disassembler is found)");
  add_common(all, *o);
  all->add_option("--disasm", o->disasm, "cuobjdump or nvdisasm to use");
  auto* p3 = app->add_subcommand("phase3", "SASS binary audit on the GPU: patch opcode bits, run each variant");
  p3->add_option("--cubin", o->p3.cubin, "cubin to patch (default: the built-in probe, compiled for --target)");
  p3->add_option("--kernel", o->p3.kernel, "kernel name in the cubin")->capture_default_str();
  p3->add_option("--target", o->p3.target, "target of the built-in probe")->capture_default_str();
  p3->add_option("--patch", o->p3.patch, "instructions to patch: mnemonic prefix (first match) or @0xOFFSET")
      ->delimiter(',')->capture_default_str();
  p3->add_option("--bit0", o->p3.field_bit0, "first bit of the field to vary")->capture_default_str();
  p3->add_option("--bits", o->p3.field_bits, "width of the field to vary (all values are tried)")->capture_default_str();
  p3->add_option("--budget", o->p3.budget_s, "seconds to spend (resumable: run again to continue)")->capture_default_str();
  p3->add_option("--timeout", o->p3.timeout_s, "seconds per variant before the child is killed")->capture_default_str();
  p3->add_option("--workers", o->p3.workers, "child processes at a time")->capture_default_str();
  p3->add_option("--max-variants", o->p3.max_variants, "cap on variants (0: all)");
  p3->add_option("--nvdisasm", o->p3.disassembler, "nvdisasm to use");
  p3->add_flag("--known-first", o->p3.known_first, "run the variants nvdisasm decodes first");
  p3->add_option("--disasm-share", o->p3.disasm_share, "share of the budget for the nvdisasm pre-pass")
      ->capture_default_str();
  p3->add_flag("--report", o->p3_report, "only rebuild phase3.md from the recorded phase3.jsonl (no GPU)");
  auto* ch = app->add_subcommand("phase3-child", "")->group("");  // internal
  ch->add_option("--cubin", o->c_cubin)->required();
  ch->add_option("--kernel", o->c_kernel);
  ch->add_option("--offset", o->c_offset)->required();
  ch->add_option("--bit0", o->c_bit0);
  ch->add_option("--bits", o->c_bits);
  ch->add_option("--values", o->c_values)->required();

  g_self_argv = prefix;
  return [=]() -> int {
    if (list->parsed()) {
      for (auto& p : probes(*o)) {
        std::string tags;
        for (auto& t : p.tags) tags += " " + t;
        std::printf("%-10s %s%s\n", p.group.c_str(), p.name.c_str(), tags.c_str());
      }
      return 0;
    }
    if (p1->parsed()) return phase1(*o), 0;
    if (p2->parsed()) return phase2(*o, load_phase1(*o)), 0;
    if (all->parsed()) {
      auto r = phase1(*o);
      if (o->disasm.empty() && find_tool("cuobjdump").empty() && find_tool("nvdisasm").empty()) {
        std::fprintf(stderr, "phase2: skipped, no cuobjdump or nvdisasm found\n");
        return 0;
      }
      phase2(*o, r);
      return 0;
    }
    if (p3->parsed()) {
      o->p3.out_dir = o->out, o->p3.quiet = o->quiet;
      auto s = o->p3_report ? phase3_report(o->p3) : run_phase3(o->p3);
      std::printf("phase3: %zu of %zu variants recorded, %.1f s this run -> %s/phase3.md\n", s.tried, s.planned,
                  s.seconds, o->out.c_str());
      for (auto& [k, n] : s.by_class) std::printf("  %-20s %zu\n", k.c_str(), n);
      return 0;
    }
    if (ch->parsed()) {
      std::ifstream f(o->c_values);
      std::string s((std::istreambuf_iterator<char>(f)), {});
      std::vector<uint32_t> vals;
      std::stringstream ss(s);
      for (std::string t; std::getline(ss, t, ',');)
        if (!t.empty()) vals.push_back(uint32_t(std::stoul(t)));
      return phase3_child(o->c_cubin, o->c_kernel, o->c_offset, o->c_bit0, o->c_bits, vals, "");
    }
    return 1;
  };
}

}  // namespace gptoss::isa
