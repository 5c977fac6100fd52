// A CUPTI injection library: every kernel the process runs, graph nodes included, as one CSV row
// (start and end in ns on the GPU's clock, graph and node ids, the graph launch's correlation id,
// grid, block, shared memory, the demangled name). The driver loads it at CUDA's initialization
// when CUDA_INJECTION64_PATH names it, and calls InitializeInjection; the rows are written when
// the process exits (KERNEL_TRACE_OUT, default kernel_trace.csv). Concurrent-kernel records do
// not serialize launches, so programmatic dependent launches still overlap as they do untraced.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

struct Row {
  uint64_t start, end;
  uint32_t graph_id, correlation;
  uint64_t node;
  int grid[3], block[3];
  int smem;
  std::string name;
};

std::mutex g_mu;
std::vector<Row> g_rows;
size_t g_dropped = 0;

std::string demangle(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  for (char& c : s)
    if (c == ',' || c == '\n') c = ';';  // one CSV field
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<Row> rows;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    rows.push_back(Row{k->start, k->end, k->graphId, k->correlationId, k->graphNodeId,
                       {k->gridX, k->gridY, k->gridZ}, {k->blockX, k->blockY, k->blockZ},
                       k->staticSharedMemory + k->dynamicSharedMemory, demangle(k->name)});
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_dropped += dropped;
  g_rows.insert(g_rows.end(), std::make_move_iterator(rows.begin()), std::make_move_iterator(rows.end()));
}

void write_rows() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("KERNEL_TRACE_OUT");
  if (!path || !*path) path = "kernel_trace.csv";
  std::lock_guard<std::mutex> lock(g_mu);
  FILE* f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path);
    return;
  }
  std::fprintf(f, "start_ns,end_ns,graph_id,node_id,correlation,grid,block,smem,name\n");
  for (const Row& r : g_rows)
    std::fprintf(f, "%llu,%llu,%u,%llu,%u,%dx%dx%d,%dx%dx%d,%d,%s\n", (unsigned long long)r.start,
                 (unsigned long long)r.end, r.graph_id, (unsigned long long)r.node, r.correlation, r.grid[0], r.grid[1],
                 r.grid[2], r.block[0], r.block[1], r.block[2], r.smem, r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "kernel_trace: %zu kernels to %s (%zu records dropped)\n", g_rows.size(), path, g_dropped);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity\n");
    return 0;
  }
  std::atexit(write_rows);
  return 1;
}
