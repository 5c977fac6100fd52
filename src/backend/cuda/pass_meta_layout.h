#pragma once
// Where CudaBackend::upload_meta puts a pass's metadata in its device block (int32 entries):
// tokens, positions, the two page-table offsets (n each), the logit rows (n_rows), the real-token
// count of a graph bucket's pass (1), then the page table. A decode graph captures pointers into
// this block once per bucket and every later pass of the bucket writes its metadata to the same
// places, so every part a kernel reads may sit only at an offset that the bucket (n, n_rows) fixes:
// the page table, whose length grows with the contexts, goes last. (With the real-token count after
// it, a replay read a page id as the count: tests/cuda/test_cuda_model.cpp's
// PassMetaLayout.OffsetsDependOnTheBucketOnly and CudaModel.GraphReplayAfterPageTableGrowth.)
#include <cstddef>

namespace gptoss::cuda {

struct PassMetaLayout {
  size_t tokens, pos, off0, off1, rows, n_real, pt, end;
};

inline PassMetaLayout pass_meta_layout(size_t n, size_t n_rows, size_t pt_entries) {
  PassMetaLayout l;
  l.tokens = 0;
  l.pos = l.tokens + n;
  l.off0 = l.pos + n;
  l.off1 = l.off0 + n;
  l.rows = l.off1 + n;
  l.n_real = l.rows + n_rows;
  l.pt = l.n_real + 1;
  l.end = l.pt + pt_entries;
  return l;
}

}  // namespace gptoss::cuda
