#pragma once
// The hook a backend calls while it loads or converts weights, so the command line can show a
// progress bar (tools/load_progress.h prints one). `stage` says what is being done ("reading",
// "quantizing", "uploading"); `done` and `total` count bytes of that stage. Call it with done == 0
// when a stage starts and done == total when it ends; in between as often as is cheap (the
// printer throttles itself). An empty function means nobody is listening.
#include <cstdint>
#include <functional>
#include <string>

namespace gptoss {

using LoadProgressFn = std::function<void(const std::string& stage, uint64_t done, uint64_t total)>;

}  // namespace gptoss
