// Catalog parsing and the probe wrapper kernel.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/error.h"
#include "tools/isa_audit/isa_audit.h"

namespace gptoss::isa {
namespace fs = std::filesystem;

bool Probe::has_tag(const std::string& t) const {
  return std::find(tags.begin(), tags.end(), t) != tags.end();
}

namespace {
std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}
std::vector<std::string> split_ws(const std::string& s) {
  std::istringstream is(s);
  std::vector<std::string> v;
  for (std::string w; is >> w;) v.push_back(w);
  return v;
}
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
  return s;
}
// ${R:a:n} -> %ra, ..., %r(a+n-1); prefixes R F H RD FD B Q.
std::string expand_macros(const std::string& s, const std::string& where) {
  static const std::regex re(R"(\$\{(RD|FD|R|F|H|B|P):(\d+):(\d+)\})");
  std::string out;
  auto begin = std::sregex_iterator(s.begin(), s.end(), re);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    auto& m = *it;
    out += s.substr(last, m.position() - last);
    std::string pre = m[1];
    std::transform(pre.begin(), pre.end(), pre.begin(), ::tolower);
    int a = std::stoi(m[2]), n = std::stoi(m[3]);
    for (int i = 0; i < n; ++i) out += (i ? ", %" : "%") + pre + std::to_string(a + i);
    last = m.position() + m.length();
  }
  out += s.substr(last);
  if (out.find("${") != std::string::npos) throw Error(where + ": unexpanded ${...} in: " + trim(out));
  return out;
}

struct Raw {
  std::string name, group, globals, body, where;
  std::vector<std::string> tags;
  std::vector<std::vector<std::pair<std::string, std::string>>> rows;  // zipped expansion
  std::vector<std::pair<std::string, std::vector<std::string>>> cart;  // cartesian expansion
};

void emit(const Raw& r, std::vector<Probe>& out) {
  // All combinations: rows x cartesian product.
  std::vector<std::vector<std::pair<std::string, std::string>>> combos{{}};
  if (!r.rows.empty()) combos = r.rows;
  for (auto& [var, vals] : r.cart) {
    std::vector<std::vector<std::pair<std::string, std::string>>> next;
    for (auto& c : combos)
      for (auto& v : vals) {
        auto c2 = c;
        c2.push_back({var, v});
        next.push_back(c2);
      }
    combos = next;
  }
  for (auto& c : combos) {
    Probe p;
    p.name = r.name, p.group = r.group, p.tags = r.tags, p.globals = r.globals, p.body = r.body;
    // Substitute twice so a value may name another variable.
    for (int pass = 0; pass < 2; ++pass)
      for (auto& [k, v] : c) {
        p.name = replace_all(p.name, "${" + k + "}", v);
        p.body = replace_all(p.body, "${" + k + "}", v);
        p.globals = replace_all(p.globals, "${" + k + "}", v);
      }
    p.body = expand_macros(p.body, r.where);
    p.globals = expand_macros(p.globals, r.where);
    if (p.name.find("${") != std::string::npos) throw Error(r.where + ": unexpanded name " + p.name);
    out.push_back(std::move(p));
  }
}
}  // namespace

std::vector<Probe> parse_catalog(const std::string& text, const std::string& origin) {
  std::vector<Probe> out;
  std::istringstream is(text);
  std::string line, group = "misc";
  std::optional<Raw> cur;
  int ln = 0;
  auto flush = [&] {
    if (!cur) return;
    if (trim(cur->body).empty()) throw Error(cur->where + ": probe " + cur->name + " has no body");
    emit(*cur, out);
    cur.reset();
  };
  while (std::getline(is, line)) {
    ++ln;
    std::string where = origin + ":" + std::to_string(ln);
    std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    bool indented = line[0] == ' ' || line[0] == '\t';
    if (!indented) {
      auto w = split_ws(t);
      if (w[0] == "group" && w.size() == 2) {
        flush();
        group = w[1];
      } else if (w[0] == "probe" && w.size() >= 2) {
        flush();
        cur = Raw{};
        cur->name = w[1], cur->group = group, cur->where = where;
        cur->tags.assign(w.begin() + 2, w.end());
      } else {
        throw Error(where + ": expected 'group NAME' or 'probe NAME [tags...]', got: " + t);
      }
      continue;
    }
    if (!cur) throw Error(where + ": indented line outside a probe");
    if (t.rfind("expand ", 0) == 0) {  // expand VAR: a b c
      auto c = t.find(':');
      if (c == std::string::npos) throw Error(where + ": expand needs 'VAR: values'");
      cur->cart.push_back({trim(t.substr(7, c - 7)), split_ws(t.substr(c + 1))});
    } else if (t.rfind("rows ", 0) == 0) {  // rows A B: a1 b1 | a2 b2
      auto c = t.find(':');
      if (c == std::string::npos) throw Error(where + ": rows needs 'VARS: values | values'");
      auto vars = split_ws(t.substr(5, c - 5));
      std::string rest = t.substr(c + 1);
      size_t p = 0;
      while (true) {
        size_t q = rest.find('|', p);
        auto vals = split_ws(rest.substr(p, q == std::string::npos ? std::string::npos : q - p));
        if (vals.size() != vars.size()) throw Error(where + ": rows: wrong number of values");
        std::vector<std::pair<std::string, std::string>> row;
        for (size_t i = 0; i < vars.size(); ++i) row.push_back({vars[i], vals[i]});
        cur->rows.push_back(row);
        if (q == std::string::npos) break;
        p = q + 1;
      }
    } else if (t.rfind("global ", 0) == 0) {
      cur->globals += t.substr(7) + "\n";
    } else {
      cur->body += "  " + t + "\n";
    }
  }
  flush();
  std::set<std::string> seen;
  for (auto& p : out)
    if (!seen.insert(p.name).second) throw Error(origin + ": duplicate probe name " + p.name);
  return out;
}

std::vector<Probe> load_catalog(const std::string& path) {
  // Not a regular file: the errors of common/files.h (this library is also a standalone program
  // that does not link gptoss_common). A directory opened as a stream reads as empty.
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!ec && fs::is_directory(st)) throw Error(path + ": is a directory, not a file");
  if (!ec && fs::exists(st) && !fs::is_regular_file(st)) throw Error(path + ": not a regular file");
  std::ifstream f(path);
  if (!f) throw Error("cannot read catalog " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_catalog(ss.str(), path);
}

std::string default_catalog_path() {
  if (const char* e = std::getenv("GPTOSS_ISA_CATALOG")) return e;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (auto p : {exe.parent_path() / "catalog.txt", exe.parent_path() / "isa_audit_catalog.txt"})
      if (fs::exists(p)) return p.string();
#ifdef GPTOSS_ISA_SOURCE_CATALOG
  if (fs::exists(GPTOSS_ISA_SOURCE_CATALOG)) return GPTOSS_ISA_SOURCE_CATALOG;
#endif
  throw Error("no catalog found: pass --catalog or set GPTOSS_ISA_CATALOG");
}

std::vector<Probe> select_probes(const std::vector<Probe>& all, const std::vector<std::string>& filters,
                                 const std::string& tag) {
  std::vector<Probe> out;
  for (auto& p : all) {
    if (!tag.empty() && !p.has_tag(tag)) continue;
    bool ok = filters.empty();
    for (auto& f : filters)
      if (p.name.find(f) != std::string::npos || p.group == f) ok = true;
    if (ok) out.push_back(p);
  }
  return out;
}

Probe baseline_probe() {
  Probe p;
  p.name = "_baseline";
  p.group = "_";
  return p;
}

// Register conventions for catalog bodies (see catalog.txt):
//   %r0..%r31, %f0..%f31, %rd2..%rd17, %fd0..%fd15, %h0..%h15, %b0..%b3, %p0..%p3 hold loaded
//   inputs and are stored at the end, so a body writes its results there. %r32.., %f32.. etc. are
//   free scratch. %r100: shared address of smem[16384] (1024-aligned); %r101: shared address of
//   mbar[8] (.b64); %r102: smem+8192; %rd40: generic address of smem; %rd41: global buffer gbuf.
std::string wrap_probe(const Probe& p, const std::string& target, const std::string& ptx_version) {
  std::ostringstream o;
  o << ".version " << ptx_version << "\n.target " << target << "\n.address_size 64\n\n"
    << ".shared .align 1024 .b8 smem[16384];\n.shared .align 8 .b64 mbar[8];\n"
    << ".global .align 128 .b8 gbuf[4096];\n"
    << p.globals << "\n"
    << ".visible .entry probe(.param .u64 p_out, .param .u64 p_in)\n{\n"
    << "  .reg .pred %p<16>;\n  .reg .b8 %b<8>;\n  .reg .b16 %h<32>;\n  .reg .b32 %r<128>;\n"
    << "  .reg .b64 %rd<64>;\n  .reg .f32 %f<160>;\n  .reg .f64 %fd<40>;\n"
    << "  ld.param.u64 %rd0, [p_out];\n  ld.param.u64 %rd1, [p_in];\n"
    << "  cvta.to.global.u64 %rd0, %rd0;\n  cvta.to.global.u64 %rd1, %rd1;\n";
  for (int i = 0; i < 32; i += 4)
    o << "  ld.global.v4.b32 {%r" << i << ", %r" << i + 1 << ", %r" << i + 2 << ", %r" << i + 3
      << "}, [%rd1+" << i * 4 << "];\n";
  for (int i = 0; i < 32; i += 4)
    o << "  ld.global.v4.f32 {%f" << i << ", %f" << i + 1 << ", %f" << i + 2 << ", %f" << i + 3
      << "}, [%rd1+" << 128 + i * 4 << "];\n";
  for (int i = 2; i < 18; i += 2)
    o << "  ld.global.v2.b64 {%rd" << i << ", %rd" << i + 1 << "}, [%rd1+" << 256 + (i - 2) * 8 << "];\n";
  for (int i = 0; i < 16; i += 2)
    o << "  ld.global.v2.f64 {%fd" << i << ", %fd" << i + 1 << "}, [%rd1+" << 384 + i * 8 << "];\n";
  for (int i = 0; i < 16; i += 2) o << "  mov.b32 {%h" << i << ", %h" << i + 1 << "}, %r" << i / 2 << ";\n";
  for (int i = 0; i < 4; ++i) o << "  ld.global.b8 %b" << i << ", [%rd1+" << 512 + i << "];\n";
  for (int i = 0; i < 4; ++i) o << "  setp.ne.b32 %p" << i << ", %r" << i << ", 0;\n";
  o << "  mov.u32 %r100, smem;\n  mov.u32 %r101, mbar;\n  add.u32 %r102, %r100, 8192;\n"
    << "  mov.u64 %rd40, smem;\n  cvta.shared.u64 %rd40, %rd40;\n  mov.u64 %rd41, gbuf;\n"
    << "  cvta.global.u64 %rd41, %rd41;\n"
    << "  // ---- probe body\n"
    << p.body << "  // ---- end of probe body\n";
  for (int i = 0; i < 32; i += 4)
    o << "  st.global.v4.b32 [%rd0+" << i * 4 << "], {%r" << i << ", %r" << i + 1 << ", %r" << i + 2
      << ", %r" << i + 3 << "};\n";
  for (int i = 0; i < 32; i += 4)
    o << "  st.global.v4.f32 [%rd0+" << 128 + i * 4 << "], {%f" << i << ", %f" << i + 1 << ", %f" << i + 2
      << ", %f" << i + 3 << "};\n";
  for (int i = 2; i < 18; i += 2)
    o << "  st.global.v2.b64 [%rd0+" << 256 + (i - 2) * 8 << "], {%rd" << i << ", %rd" << i + 1 << "};\n";
  for (int i = 0; i < 16; i += 2)
    o << "  st.global.v2.f64 [%rd0+" << 384 + i * 8 << "], {%fd" << i << ", %fd" << i + 1 << "};\n";
  for (int i = 0; i < 16; i += 2) o << "  mov.b32 %r" << 40 + i / 2 << ", {%h" << i << ", %h" << i + 1 << "};\n";
  o << "  st.global.v4.b32 [%rd0+512], {%r40, %r41, %r42, %r43};\n"
    << "  st.global.v4.b32 [%rd0+528], {%r44, %r45, %r46, %r47};\n";
  for (int i = 0; i < 4; ++i) o << "  st.global.b8 [%rd0+" << 544 + i << "], %b" << i << ";\n";
  for (int i = 0; i < 4; ++i) o << "  selp.u32 %r" << 48 + i << ", 1, 0, %p" << i << ";\n";
  o << "  st.global.v4.b32 [%rd0+560], {%r48, %r49, %r50, %r51};\n  ret;\n}\n";
  return o.str();
}

std::string file_stem(const std::string& name) {
  std::string s;
  for (char c : name) s += (std::isalnum((unsigned char)c) || c == '.' || c == '-' || c == '_') ? c : '_';
  return s;
}

}  // namespace gptoss::isa
