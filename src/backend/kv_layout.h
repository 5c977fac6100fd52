#pragma once
// The paged KV cache's layout, as one description shared by the CPU reference, the CUDA KV
// writer (rope_kv_store) and the CUDA attention kernels (FlashInfer's paged_kv_t is the model):
// a layer's cache is [pages][2 (K, V)][page_size][kv_heads][head_dim] elements; a sequence's
// position p lives in page table entry p / page_size, slot p % page_size. Each KV group (full,
// sliding) holds its layers one after another.
#include <cstddef>

#if defined(__CUDACC__)
#define GPTOSS_HD __host__ __device__
#else
#define GPTOSS_HD
#endif

namespace gptoss {

struct PagedKvLayout {
  int page_size = 16, kv_heads = 8, head_dim = 64;

  GPTOSS_HD size_t row_elems() const { return size_t(kv_heads) * head_dim; }
  GPTOSS_HD size_t page_elems() const { return 2 * size_t(page_size) * row_elems(); }
  // Element offset of (page, which: 0 = K / 1 = V, slot, kv head, dim) inside one layer.
  GPTOSS_HD size_t offset(int page, int which, int slot, int head, int dim) const {
    return ((size_t(page) * 2 + which) * page_size + slot) * row_elems() + size_t(head) * head_dim + dim;
  }
  // Offset of layer `layer`'s cache in a group of pages_per_layer pages a layer.
  GPTOSS_HD size_t layer_offset(int layer, int pages_per_layer) const {
    return size_t(layer) * pages_per_layer * page_elems();
  }
};

}  // namespace gptoss
