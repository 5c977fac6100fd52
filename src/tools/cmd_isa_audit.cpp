// `gptoss isa-audit`: the GPU ISA auditor (src/tools/isa_audit, docs/ISA_AUDIT.md).
#include "tools/command.h"
#include "tools/isa_audit/isa_audit.h"

namespace {
gptoss::tools::RegisterCommand reg({"isa-audit", "PTX/SASS ISA auditor: support matrix, SASS opcodes, binary audit",
                                    [](CLI::App* sub) { return gptoss::isa::setup_cli(sub, {"isa-audit"}); }});
}  // namespace
