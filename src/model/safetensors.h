#pragma once
// Memory-mapped safetensors files and Hugging Face checkpoint directories (one
// model.safetensors, or shards listed in model.safetensors.index.json).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "model/load_progress.h"

namespace gptoss {

struct TensorView {
  std::string name;
  std::string file;  // the file it lives in, for error messages
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping; valid while the file is open
  size_t nbytes = 0;
  int64_t numel() const;
  std::string shape_str() const;  // "[2, 3]"
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header (offsets in bounds, sizes match dtype x shape).
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& name) const;
  size_t size() const { return size_; }
  // Reads every page of the mapping once (so the first forward pass does not fault the
  // weights in from disk), adding the bytes read to `done` and calling `progress` as it goes.
  void read_all(uint64_t& done, uint64_t total, const LoadProgressFn& progress) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

// A model directory: config.json plus its safetensors (sharded or not).
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }
  // Throws gptoss::Error naming the tensor when it is absent.
  const TensorView& get(const std::string& name) const;
  const TensorView* find(const std::string& name) const;
  std::vector<std::string> names() const;
  uint64_t total_bytes() const;  // of every safetensors file
  // Reads every file once (see SafetensorsFile::read_all), reporting stage "reading".
  void read_all(const LoadProgressFn& progress) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

// Streams a safetensors file: declare every tensor, then each one's bytes are produced by
// `fill` in declaration order (so multi-GB files never sit in memory whole).
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t nbytes() const;
};
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                       const std::function<void(const TensorSpec&, uint8_t* out)>& fill);

}  // namespace gptoss
