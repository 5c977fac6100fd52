#pragma once
// gptoss isa-audit: a three-phase GPU ISA auditor (issue 6).
//   Phase 1: compile every catalog probe (a PTX instruction variant wrapped in a minimal kernel)
//            with ptxas for every target; support matrix with ptxas's own messages.
//   Phase 2: disassemble every accepted probe and map each PTX variant to the SASS opcodes it
//            produced (minus the wrapper's own opcodes).
//   Phase 3: patch the opcode field of one SASS instruction of a cubin, load and run every variant
//            in a child process, classify what the hardware does.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gptoss::isa {

// ---------------------------------------------------------------- catalog (data, see catalog.txt)
struct Probe {
  std::string name;               // unique, e.g. "mma.m16n8k16.f32.bf16"
  std::string group;              // e.g. "mma", "wgmma", "tcgen05"
  std::vector<std::string> tags;  // e.g. "ci" (reduced catalog)
  std::string globals;            // module-scope PTX
  std::string body;               // PTX placed inside the wrapper kernel
  bool has_tag(const std::string& t) const;
};

// Parses the catalog text format (documented at the top of catalog.txt); expands `expand`/`rows`
// lines and ${R:a:n}-style register-list macros. Throws gptoss::Error with file:line on errors.
std::vector<Probe> parse_catalog(const std::string& text, const std::string& origin = "catalog");
std::vector<Probe> load_catalog(const std::string& path);
// Default catalog path: $GPTOSS_ISA_CATALOG, then next to the executable, then the source tree.
std::string default_catalog_path();

// Keeps probes whose name or group contains any of `filters` (all when empty) and, if `tag` is
// not empty, that carry `tag`.
std::vector<Probe> select_probes(const std::vector<Probe>& all, const std::vector<std::string>& filters,
                                 const std::string& tag);

// The complete PTX module of a probe for a target ("sm_90a") and PTX ISA version ("9.0").
std::string wrap_probe(const Probe& p, const std::string& target, const std::string& ptx_version);
// The wrapper alone (empty body): its SASS is subtracted in phase 2.
Probe baseline_probe();

// ---------------------------------------------------------------- processes
struct ProcResult {
  int exit_code = -1;      // -1 when killed by a signal or timed out
  int signal = 0;
  bool timed_out = false;
  std::string out, err;
};
// Runs argv (no shell), capturing stdout and stderr; timeout_s <= 0 means none.
ProcResult run_process(const std::vector<std::string>& argv, double timeout_s = 0,
                       const std::string& stdin_data = "");
// Finds a CUDA tool: $GPTOSS_CUDA_BIN, $CUDA_HOME/bin, /usr/local/cuda/bin, then PATH. "" if absent.
std::string find_tool(const std::string& name);
// Whole-file reads and writes of the audit's outputs; throw gptoss::Error naming the path.
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& data);  // creates parent folders

// ---------------------------------------------------------------- toolkit
struct Toolkit {
  std::string ptxas;
  std::string release;      // "13.0"
  std::string ptx_version;  // "9.0"
};
// ptxas's CUDA release -> the newest PTX ISA version it accepts.
std::string ptx_version_for_release(const std::string& release);
Toolkit detect_toolkit(const std::string& ptxas_path = "");

// ---------------------------------------------------------------- phase 1
struct CompileResult {
  std::string probe, group, target;
  bool accepted = false;
  std::string message;  // ptxas's stderr (errors or warnings), trimmed
  double seconds = 0;
  std::string cubin;    // path, when accepted and kept
};
struct Phase1Options {
  std::vector<std::string> targets{"sm_90a", "sm_100a", "sm_120a", "sm_121a"};
  std::string ptx_version;  // empty: per toolkit
  std::string out_dir;      // cubins/<target>/<probe>.cubin, ptx/..., phase1.json, matrix.md
  int jobs = 0;             // 0: hardware_concurrency
  bool quiet = false;
};
struct Phase1Result {
  Toolkit toolkit;
  std::vector<std::string> targets;
  std::vector<Probe> probes;           // in catalog order
  std::vector<CompileResult> results;  // probes x targets
  double seconds = 0;
  const CompileResult* find(const std::string& probe, const std::string& target) const;
};
Phase1Result run_phase1(const std::vector<Probe>& probes, const Phase1Options& opt);
nlohmann::json phase1_json(const Phase1Result& r);
Phase1Result phase1_from_json(const nlohmann::json& j);
std::string phase1_markdown(const Phase1Result& r);
// Safe file name for a probe name.
std::string file_stem(const std::string& probe_name);

// ---------------------------------------------------------------- SASS text
struct SassInsn {
  uint32_t offset = 0;
  std::string guard;   // "@P0", "@!PT", ...
  std::string opcode;  // full mnemonic with modifiers: "HMMA.16816.F32.BF16"
  std::string text;    // whole instruction text without guard and ';'
  std::string base() const;  // mnemonic before the first '.': "HMMA"
};
// Parses cuobjdump -sass or nvdisasm output (one or more functions; all instructions returned).
std::vector<SassInsn> parse_sass(const std::string& text);
// opcode -> count
std::map<std::string, int> opcode_histogram(const std::vector<SassInsn>& v);
// Opcodes whose count in `probe` exceeds that in `baseline` (the probe's own instructions).
std::map<std::string, int> subtract_baseline(const std::map<std::string, int>& probe,
                                             const std::map<std::string, int>& baseline);

// ---------------------------------------------------------------- phase 2
struct Phase2Options {
  std::string out_dir;       // the phase 1 output dir; sass/<target>/<probe>.sass are written there
  std::string disassembler;  // path of cuobjdump or nvdisasm; empty: find one
  bool from_sass = false;    // re-parse existing sass/ files instead of disassembling
  int jobs = 0;
  bool quiet = false;
};
struct Phase2Entry {
  std::string probe, target;
  std::map<std::string, int> opcodes;  // probe's own opcodes (wrapper subtracted)
  bool ok = false;
  std::string message;
};
struct Phase2Result {
  std::string disassembler;
  std::vector<Phase2Entry> entries;
  std::map<std::string, std::map<std::string, int>> baseline;      // target -> histogram
  std::map<std::string, std::set<std::string>> distinct;           // target -> all opcodes seen
  double seconds = 0;
};
Phase2Result run_phase2(const Phase1Result& p1, const Phase2Options& opt);
nlohmann::json phase2_json(const Phase2Result& r);
std::string phase2_markdown(const Phase1Result& p1, const Phase2Result& r);

// ---------------------------------------------------------------- cubin (ELF) handling
struct CubinSection {
  std::string name;
  uint64_t offset = 0, size = 0;
};
std::vector<CubinSection> cubin_sections(const std::string& bytes);
// The .text.<kernel> section of a cubin (first .text.* when kernel is empty).
CubinSection cubin_text(const std::string& bytes, const std::string& kernel = "");
// 128-bit SASS instruction words (Volta and later): lo = bits 0..63, hi = bits 64..127.
struct InsnWord {
  uint64_t lo = 0, hi = 0;
};
InsnWord read_insn(const std::string& bytes, uint64_t offset);
void write_insn(std::string& bytes, uint64_t offset, InsnWord w);
// Replaces bits [bit0, bit0+nbits) of the instruction (nbits <= 32) with `value`.
InsnWord set_field(InsnWord w, int bit0, int nbits, uint32_t value);
uint32_t get_field(InsnWord w, int bit0, int nbits);

// ---------------------------------------------------------------- phase 3
struct Phase3Options {
  std::string cubin;          // sm_90 cubin with kernel `kernel`; empty: compile the built-in probe
  std::string kernel = "p3";
  std::string out_dir;
  std::vector<std::string> patch{"FFMA"};  // instructions to patch: mnemonic prefix or "@0x40"
  int field_bit0 = 0, field_bits = 12;     // the opcode field and its neighbours
  double budget_s = 180;
  double timeout_s = 5;       // per variant, in the child
  int workers = 8;            // child processes at a time
  std::string disassembler;   // nvdisasm, for known/unknown; empty: find
  std::string target = "sm_90";
  size_t max_variants = 0;    // 0: all
  bool known_first = false;   // run variants nvdisasm decodes first (default: those it cannot decode)
  double disasm_share = 0.3;  // at most this share of the budget for the nvdisasm pre-pass
  bool quiet = false;
};
struct Phase3Record {
  std::string site;       // "FFMA@0x0080"
  uint32_t value = 0;     // field value tried
  std::string klass;      // original|rejected_at_load|illegal_instruction|fault|hang|crash|ran_same|ran_diff
  std::string detail;     // error name, or output summary
  std::string disasm;     // nvdisasm's text for the patched instruction; "" if it does not decode
  bool known = false;     // nvdisasm decodes it
  double seconds = 0;
};
struct Phase3Summary {
  size_t tried = 0, planned = 0;
  double seconds = 0;        // this run
  double seconds_total = 0;  // all runs on this output directory (phase 3 resumes)
  std::map<std::string, size_t> by_class;
  std::vector<Phase3Record> records;
};
Phase3Summary run_phase3(const Phase3Options& opt);
// Rebuilds phase3.md from phase3.jsonl and phase3_summary.json in opt.out_dir (no GPU needed).
Phase3Summary phase3_report(const Phase3Options& opt);
// What nvdisasm said about a patched instruction: "decodes", "opclass X, fields undefined",
// "unrecognized opcode", "does not decode" or "not checked".
std::string disasm_verdict(const Phase3Record& r);
// The child side (runs in its own process): loads `cubin` patched at `offset` with each value and
// prints one line per variant. Returns the exit code.
int phase3_child(const std::string& cubin, const std::string& kernel, uint64_t offset, int bit0,
                 int nbits, const std::vector<uint32_t>& values, const std::string& ref_path);
std::string phase3_markdown(const Phase3Summary& s, const Phase3Options& opt);
// The built-in phase 3 probe kernel (PTX).
std::string phase3_probe_ptx(const std::string& target, const std::string& ptx_version);
// Parses a child's output lines into records (pure; unit-tested).
struct ChildLine {
  bool begin = false;
  uint32_t value = 0;
  std::string klass, detail;
};
std::optional<ChildLine> parse_child_line(const std::string& line);

// ---------------------------------------------------------------- CLI
// Adds the isa-audit subcommands to `app`; `self_prefix` are the argv words that reach this app
// from the executable (e.g. {"isa-audit"} in `gptoss`), used to start phase 3 children.
std::function<int()> setup_cli(void* cli_app, std::vector<std::string> self_prefix);

}  // namespace gptoss::isa
