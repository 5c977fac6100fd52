// Tests of the ISA auditor: catalog, SASS parsing, cubin patching (no GPU), and phases 1+2 on the
// reduced (`ci`) catalog with the real ptxas, asserting facts we know about the targets.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "tools/isa_audit/isa_audit.h"

using namespace gptoss::isa;
namespace fs = std::filesystem;

namespace {
fs::path tmpdir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("gptoss_isa_test_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}
bool have_ptxas() { return !find_tool("ptxas").empty(); }
std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}
}  // namespace

TEST(IsaCatalog, ParsesAndExpands) {
  auto v = parse_catalog(
      "group g1\n"
      "probe a.${T} ci\n"
      "  expand T: x y\n"
      "  op.${T} {${R:0:3}};\n"
      "probe b.${N}\n"
      "  rows N M: 1 one | 2 two\n"
      "  global .global .b32 g${N};\n"
      "  op ${M};\n");
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].name, "a.x");
  EXPECT_EQ(v[0].group, "g1");
  EXPECT_TRUE(v[0].has_tag("ci"));
  EXPECT_NE(v[0].body.find("op.x {%r0, %r1, %r2};"), std::string::npos);
  EXPECT_EQ(v[3].name, "b.2");
  EXPECT_NE(v[3].body.find("op two;"), std::string::npos);
  EXPECT_NE(v[3].globals.find(".global .b32 g2;"), std::string::npos);
  EXPECT_THROW(parse_catalog("probe a\n"), gptoss::Error);                       // no body
  EXPECT_THROW(parse_catalog("probe a\n  x\nprobe a\n  y\n"), gptoss::Error);     // duplicate
  EXPECT_THROW(parse_catalog("probe a\n  ${UNSET}\n"), gptoss::Error);            // unexpanded
  EXPECT_THROW(parse_catalog("bogus line\n"), gptoss::Error);
}

TEST(IsaCatalog, ShippedCatalogIsLargeAndCoversTheIssue) {
  auto all = load_catalog(GPTOSS_ISA_CATALOG);
  EXPECT_GE(all.size(), 200u);
  std::set<std::string> groups;
  for (auto& p : all) groups.insert(p.group);
  for (auto g : {"mma", "wgmma", "tcgen05", "cp.async", "cp.async.bulk", "mbarrier", "warp", "cvt", "matrix",
                 "multimem", "cluster"})
    EXPECT_TRUE(groups.count(g)) << g;
  auto ci = select_probes(all, {}, "ci");
  EXPECT_GE(ci.size(), 15u);
  EXPECT_LE(ci.size(), 60u);  // keeps CI quick
  EXPECT_EQ(select_probes(all, {"wgmma"}, "").size(), select_probes(all, {"wgmma."}, "").size());
  std::string ptx = wrap_probe(all[0], "sm_90a", "9.0");
  EXPECT_NE(ptx.find(".target sm_90a"), std::string::npos);
  EXPECT_NE(ptx.find(all[0].body), std::string::npos);
}

TEST(IsaToolkit, PtxVersionPerRelease) {
  EXPECT_EQ(ptx_version_for_release("13.0"), "9.0");
  EXPECT_EQ(ptx_version_for_release("13.1"), "9.1");
  EXPECT_EQ(ptx_version_for_release("12.8"), "8.7");
  EXPECT_EQ(ptx_version_for_release("12.9"), "8.8");
  EXPECT_EQ(ptx_version_for_release("12.4"), "8.4");
  EXPECT_THROW(ptx_version_for_release("x"), gptoss::Error);
}

TEST(IsaSass, ParsesCuobjdumpAndNvdisasmText) {
  const char* cuobjdump =
      "\tcode for sm_90a\n\t\tFunction : probe\n"
      "\t.headerflags\t@\"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90\"\n"
      "        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */\n"
      "                                                                               /* 0x000fe20000000800 */\n"
      "        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;       /* 0x0000000c0804723c */\n"
      "        /*0020*/               @!P0 BRA 0x40 ;                                 /* 0x0000000000008947 */\n"
      "        /*0030*/                   EXIT ;                                      /* 0x000000000000794d */\n"
      "        /*0040*/                   BRA 0x40;                                   /* 0xfffffffc00fc7947 */\n";
  auto v = parse_sass(cuobjdump);
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[1].opcode, "HMMA.16816.F32.BF16");
  EXPECT_EQ(v[1].base(), "HMMA");
  EXPECT_EQ(v[1].offset, 0x10u);
  EXPECT_EQ(v[2].guard, "@!P0");
  EXPECT_EQ(v[2].opcode, "BRA");
  const char* nvdisasm =
      "\t.text.probe:\n"
      "        /*0000*/                   LDC R1, c[0x0][0x28] ;\n"
      "        /*0010*/                   UTCHMMA gdesc[UR4], gdesc[UR6], tmem[UR8], tmem[UR10], idesc[UR11], UPT ;\n"
      ".L_x_0:\n"
      "        /*0020*/                   EXIT ;\n";
  auto w = parse_sass(nvdisasm);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[1].opcode, "UTCHMMA");
  auto probe = opcode_histogram(v), base = opcode_histogram(parse_sass(nvdisasm));
  auto own = subtract_baseline(probe, base);
  EXPECT_EQ(own.count("LDC"), 0u);
  EXPECT_EQ(own.count("EXIT"), 0u);
  EXPECT_EQ(own["HMMA.16816.F32.BF16"], 1);
  EXPECT_EQ(own["BRA"], 2);
}

TEST(IsaCubin, FieldsRoundTrip) {
  InsnWord w{0x0000000000007947ull, 0xfffffffc00fc0000ull};
  EXPECT_EQ(get_field(w, 0, 12), 0x947u);
  auto w2 = set_field(w, 0, 12, 0x94d);
  EXPECT_EQ(get_field(w2, 0, 12), 0x94du);
  EXPECT_EQ(w2.hi, w.hi);
  EXPECT_EQ(w2.lo & ~0xfffull, w.lo & ~0xfffull);
  auto w3 = set_field(w, 60, 8, 0xab);  // straddles the two 64-bit halves
  EXPECT_EQ(get_field(w3, 60, 8), 0xabu);
  EXPECT_THROW(set_field(w, 120, 12, 0), gptoss::Error);
  std::string bytes(32, '\0');
  write_insn(bytes, 16, w2);
  auto r = read_insn(bytes, 16);
  EXPECT_EQ(r.lo, w2.lo);
  EXPECT_EQ(r.hi, w2.hi);
}

TEST(IsaCubin, FindsKernelTextInARealCubin) {
  if (!have_ptxas()) GTEST_SKIP() << "ptxas not found";
  auto dir = tmpdir("cubin");
  auto tk = detect_toolkit();
  std::ofstream(dir / "p3.ptx") << phase3_probe_ptx("sm_90", tk.ptx_version);
  auto r = run_process({tk.ptxas, "-arch=sm_90", "-o", (dir / "p3.cubin").string(), (dir / "p3.ptx").string()}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string bytes = read(dir / "p3.cubin");
  auto text = cubin_text(bytes, "p3");
  EXPECT_EQ(text.name, ".text.p3");
  ASSERT_GT(text.size, 64u);
  EXPECT_EQ(text.size % 16, 0u);
  // On sm_90 the kernel ends with EXIT (opcode field 0x94d) and a BRA-to-self (0x947) loop.
  bool exit_seen = false, bra_seen = false;
  for (uint64_t o = 0; o < text.size; o += 16) {
    auto op = get_field(read_insn(bytes, text.offset + o), 0, 12);
    exit_seen |= op == 0x94d;
    bra_seen |= op == 0x947;
  }
  EXPECT_TRUE(exit_seen);
  EXPECT_TRUE(bra_seen);
  EXPECT_THROW(cubin_text(bytes, "nope"), gptoss::Error);
  EXPECT_THROW(cubin_sections("not an elf at all, really not one......................................"),
               gptoss::Error);
  fs::remove_all(dir);
}

TEST(IsaPhase3, ChildProtocol) {
  auto b = parse_child_line("BEGIN 2381");
  ASSERT_TRUE(b && b->begin);
  EXPECT_EQ(b->value, 2381u);
  auto r = parse_child_line("RES 12 illegal_instruction CUDA_ERROR_ILLEGAL_INSTRUCTION");
  ASSERT_TRUE(r && !r->begin);
  EXPECT_EQ(r->klass, "illegal_instruction");
  EXPECT_EQ(r->detail, "CUDA_ERROR_ILLEGAL_INSTRUCTION");
  EXPECT_FALSE(parse_child_line("READY"));
  EXPECT_FALSE(parse_child_line("BEGIN x"));
}

TEST(IsaPhase3, NoGpuGivesAClearError) {
  if (void* h = dlopen("libcuda.so.1", RTLD_NOW)) {
    dlclose(h);
    GTEST_SKIP() << "a CUDA driver is present; phase 3 is exercised on the GPU machine";
  }
  if (!have_ptxas()) GTEST_SKIP() << "ptxas not found";
  Phase3Options o;
  o.out_dir = tmpdir("p3").string();
  try {
    run_phase3(o);
    FAIL() << "phase 3 ran without a GPU";
  } catch (const gptoss::Error& e) {
    EXPECT_NE(std::string(e.what()).find("GPU"), std::string::npos) << e.what();
  }
  fs::remove_all(o.out_dir);
}

namespace {
bool accepted(const Phase1Result& r, const std::string& p, const std::string& t) {
  auto* c = r.find(p, t);
  EXPECT_TRUE(c) << p << " " << t;
  return c && c->accepted;
}
std::string own(const Phase2Result& r, const std::string& probe, const std::string& target) {
  std::string s;
  for (auto& e : r.entries)
    if (e.probe == probe && e.target == target)
      for (auto& [op, n] : e.opcodes) s += op + " ";
  return s;
}
// The facts every phase 1 result must show (issue 6).
void expect_known_facts(const Phase1Result& r) {
  for (auto t : {"sm_90a", "sm_100a", "sm_120a", "sm_121a"}) {
    SCOPED_TRACE(t);
    std::string ts = t;
    bool is12x = ts == "sm_120a" || ts == "sm_121a";
    EXPECT_TRUE(accepted(r, "mma.m16n8k16.f32.bf16", t));  // warp-level bf16 MMA everywhere
    EXPECT_EQ(accepted(r, "wgmma.fence", t), ts == "sm_90a");  // wgmma only on sm_90a
    EXPECT_EQ(accepted(r, "wgmma.m64n128k16.f32.bf16.rs", t), ts == "sm_90a");
    EXPECT_EQ(accepted(r, "mma.kind::mxf4.block_scale.scale_vec::2X.e2m1", t), is12x);  // MXFP4 mma.sync: 12x
    EXPECT_EQ(accepted(r, "tcgen05.alloc", t), ts == "sm_100a");  // tcgen05: sm_100a
    EXPECT_EQ(accepted(r, "tcgen05.mma.kind::f16", t), ts == "sm_100a");
    EXPECT_EQ(accepted(r, "cvt.e2m1x2.f32", t), ts != "sm_90a");  // FP4 conversions: Blackwell
    EXPECT_TRUE(accepted(r, "mbarrier.try_wait.parity", t));
    EXPECT_TRUE(accepted(r, "cp.async.bulk.g2s", t));
    EXPECT_TRUE(accepted(r, "elect.sync", t));
    EXPECT_TRUE(accepted(r, "cvt.e4m3x2.f32", t));
  }
  auto* rej = r.find("wgmma.fence", "sm_100a");  // rejections carry ptxas's own words
  ASSERT_TRUE(rej);
  EXPECT_NE(rej->message.find("not supported on .target 'sm_100a'"), std::string::npos) << rej->message;
}
}  // namespace

// Phase 1 on the reduced catalog (tag ci), all default targets, with the real ptxas.
TEST(IsaPhase12, Phase1MatchesKnownFacts) {
  if (!have_ptxas()) GTEST_SKIP() << "ptxas not found";
  auto probes = select_probes(load_catalog(GPTOSS_ISA_CATALOG), {}, "ci");
  Phase1Options opt;
  fs::path dir = tmpdir("p1");
  opt.out_dir = dir.string(), opt.jobs = 2, opt.quiet = true;
  auto r = run_phase1(probes, opt);
  ASSERT_EQ(r.results.size(), probes.size() * 4);
  expect_known_facts(r);
  // Outputs round-trip.
  EXPECT_NE(read(dir / "matrix.md").find("| `wgmma.fence` |"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "cubins" / "sm_100a" / "tcgen05.alloc.cubin"));
  auto back = phase1_from_json(nlohmann::json::parse(read(dir / "phase1.json")));
  EXPECT_EQ(back.results.size(), r.results.size());
  EXPECT_TRUE(back.find("tcgen05.alloc", "sm_100a")->accepted);
  fs::remove_all(dir);
}

// Phase 2 over the full run recorded on the GPU machine (CUDA 13.0 ptxas + cuobjdump, reduced to
// the ci probes): CI machines have ptxas but no disassembler.
TEST(IsaPhase12, Phase2FromRecordedSass) {
  auto full = phase1_from_json(nlohmann::json::parse(read(GPTOSS_ISA_RECORDED "/phase1.json")));
  EXPECT_GE(full.probes.size(), 300u);
  expect_known_facts(full);
  Phase1Result p1 = full;
  p1.probes.clear(), p1.results.clear();
  for (auto& p : full.probes)
    if (p.has_tag("ci")) p1.probes.push_back(p);
  for (auto& c : full.results)
    for (auto& p : p1.probes)
      if (p.name == c.probe) p1.results.push_back(c);
  fs::path d = tmpdir("p2rec");
  fs::copy(fs::path(GPTOSS_TEST_DATA) / "isa_audit" / "sass", d / "sass", fs::copy_options::recursive);
  Phase2Options o;
  o.out_dir = d.string(), o.from_sass = true, o.jobs = 2, o.quiet = true;
  auto r = run_phase2(p1, o);
  for (auto& e : r.entries) EXPECT_TRUE(e.ok) << e.probe << " " << e.target << ": " << e.message;
  for (auto t : {"sm_90a", "sm_100a", "sm_120a", "sm_121a"})
    EXPECT_NE(own(r, "mma.m16n8k16.f32.bf16", t).find("HMMA.16816.F32.BF16"), std::string::npos) << t;
  EXPECT_NE(own(r, "wgmma.m64n128k16.f32.bf16.rs", "sm_90a").find("HGMMA.64x128x16.F32.BF16"), std::string::npos);
  EXPECT_NE(own(r, "tcgen05.mma.kind::f16", "sm_100a").find("UTCHMMA"), std::string::npos);
  for (auto t : {"sm_120a", "sm_121a"})  // native block-scaled FP4 MMA on 12x
    EXPECT_NE(own(r, "mma.kind::mxf4.block_scale.scale_vec::2X.e2m1", t).find("OMMA.SF.16864.F32.E2M1.E2M1"),
              std::string::npos) << t;
  EXPECT_NE(own(r, "cvt.e2m1x2.f32", "sm_100a").find("F2FP.SATFINITE.E2M1.F32"), std::string::npos);
  EXPECT_TRUE(own(r, "mma.m16n8k16.f32.bf16", "sm_90a").find("LDG") == std::string::npos);  // wrapper subtracted
  EXPECT_TRUE(fs::exists(d / "sass_table.md"));
  EXPECT_TRUE(r.distinct["sm_90a"].count("HGMMA.64x128x16.F32.BF16"));
  EXPECT_FALSE(r.distinct["sm_100a"].count("HGMMA.64x128x16.F32.BF16"));
  fs::remove_all(d);
}

// Phase 2 with a live disassembler where one is installed; elsewhere it must say what is missing.
TEST(IsaPhase12, Phase2Live) {
  if (!have_ptxas()) GTEST_SKIP() << "ptxas not found";
  auto probes = select_probes(load_catalog(GPTOSS_ISA_CATALOG), {"mma.m16n8k16.f32.bf16", "wgmma.fence"}, "");
  Phase1Options opt;
  fs::path dir = tmpdir("p2live");
  opt.out_dir = dir.string(), opt.jobs = 2, opt.quiet = true, opt.targets = {"sm_90a", "sm_120a"};
  auto p1 = run_phase1(probes, opt);
  Phase2Options o;
  o.out_dir = dir.string(), o.jobs = 2, o.quiet = true;
  if (find_tool("cuobjdump").empty() && find_tool("nvdisasm").empty()) {
    try {
      run_phase2(p1, o);
      ADD_FAILURE() << "phase 2 ran without a disassembler";
    } catch (const gptoss::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuobjdump or nvdisasm"), std::string::npos) << e.what();
    }
  } else {
    auto r = run_phase2(p1, o);
    EXPECT_NE(own(r, "mma.m16n8k16.f32.bf16", "sm_90a").find("HMMA"), std::string::npos);
    EXPECT_FALSE(r.distinct["sm_90a"].empty());
  }
  fs::remove_all(dir);
}
