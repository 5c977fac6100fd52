// Minimal ELF64 reading of cubins and 128-bit SASS instruction words.
#include <cstring>

#include "common/error.h"
#include "tools/isa_audit/isa_audit.h"

namespace gptoss::isa {

namespace {
template <class T>
T rd(const std::string& b, uint64_t off) {
  if (off + sizeof(T) > b.size()) throw Error("cubin: truncated ELF");
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}
}  // namespace

std::vector<CubinSection> cubin_sections(const std::string& b) {
  if (b.size() < 64 || b.compare(0, 4, "\x7f" "ELF") != 0 || b[4] != 2) throw Error("cubin: not an ELF64 file");
  uint64_t shoff = rd<uint64_t>(b, 0x28);
  uint16_t shentsize = rd<uint16_t>(b, 0x3A), shnum = rd<uint16_t>(b, 0x3C), shstrndx = rd<uint16_t>(b, 0x3E);
  if (shentsize < 64 || shstrndx >= shnum) throw Error("cubin: bad section table");
  uint64_t stroff = rd<uint64_t>(b, shoff + uint64_t(shstrndx) * shentsize + 0x18);
  std::vector<CubinSection> v;
  for (uint16_t i = 0; i < shnum; ++i) {
    uint64_t h = shoff + uint64_t(i) * shentsize;
    CubinSection s;
    uint32_t name = rd<uint32_t>(b, h);
    if (stroff + name >= b.size()) throw Error("cubin: bad section name");
    s.name = std::string(b.c_str() + stroff + name);
    s.offset = rd<uint64_t>(b, h + 0x18);
    s.size = rd<uint64_t>(b, h + 0x20);
    v.push_back(s);
  }
  return v;
}

CubinSection cubin_text(const std::string& bytes, const std::string& kernel) {
  for (auto& s : cubin_sections(bytes))
    if (kernel.empty() ? s.name.rfind(".text.", 0) == 0 : s.name == ".text." + kernel) {
      if (s.offset + s.size > bytes.size() || s.size % 16) throw Error("cubin: bad text section " + s.name);
      return s;
    }
  throw Error("cubin: no .text." + kernel + " section");
}

InsnWord read_insn(const std::string& b, uint64_t off) { return {rd<uint64_t>(b, off), rd<uint64_t>(b, off + 8)}; }

void write_insn(std::string& b, uint64_t off, InsnWord w) {
  if (off + 16 > b.size()) throw Error("cubin: instruction out of range");
  std::memcpy(b.data() + off, &w.lo, 8);
  std::memcpy(b.data() + off + 8, &w.hi, 8);
}

uint32_t get_field(InsnWord w, int bit0, int nbits) {
  uint32_t v = 0;
  for (int i = 0; i < nbits; ++i) {
    int b = bit0 + i;
    uint64_t word = b < 64 ? w.lo : w.hi;
    v |= uint32_t((word >> (b & 63)) & 1) << i;
  }
  return v;
}

InsnWord set_field(InsnWord w, int bit0, int nbits, uint32_t value) {
  if (nbits < 1 || nbits > 32 || bit0 < 0 || bit0 + nbits > 128) throw Error("bad instruction field");
  for (int i = 0; i < nbits; ++i) {
    int b = bit0 + i;
    uint64_t& word = b < 64 ? w.lo : w.hi;
    uint64_t m = uint64_t(1) << (b & 63);
    word = ((value >> i) & 1) ? (word | m) : (word & ~m);
  }
  return w;
}

}  // namespace gptoss::isa
