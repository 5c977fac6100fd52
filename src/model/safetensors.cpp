#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "common/error.h"
#include "common/files.h"

namespace gptoss {

using nlohmann::json;
namespace fs = std::filesystem;

int64_t TensorView::numel() const {  // (a loaded view's product was checked not to overflow)
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// A JSON integer >= 0 and < 2^62 (a shape's dimension, a data offset), or an error naming the tensor:
// nlohmann's get<int64_t> would take 64.5 as 64 and 2^64 - 1 as -1.
int64_t header_count(const json& v, const std::string& path, const std::string& name, const char* what) {
  if (!v.is_number_integer()) throw Error(path + ": tensor " + name + " has a " + what + " that is not an integer");
  if (v.is_number_unsigned() ? v.get<uint64_t>() >= (uint64_t(1) << 62) : v.get<int64_t>() >= (int64_t(1) << 62))
    throw Error(path + ": tensor " + name + " has a " + what + " too large (" + v.dump() + ")");
  if (!v.is_number_unsigned() && v.get<int64_t>() < 0) throw Error(path + ": tensor " + name + " has a negative " + what);
  return v.get<int64_t>();
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = open_regular_file(path);  // (a directory or a FIFO: an error naming it, not a hang)
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat");
  }
  size_ = size_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw Error(path + ": truncated safetensors file (" + std::to_string(size_) + " bytes)");
  }
  map_ = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw Error(path + ": mmap failed");
  }
  const uint8_t* base = static_cast<const uint8_t*>(map_);
  uint64_t hlen;
  std::memcpy(&hlen, base, 8);
  if (hlen > size_ - 8) throw Error(path + ": truncated safetensors header (header length " + std::to_string(hlen) + ")");
  // The header's tensor names, each once: JSON would let a second entry of a name replace the first.
  std::string duplicate;
  std::unordered_set<std::string> seen;
  json h;
  try {
    h = json::parse(base + 8, base + 8 + hlen, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (depth == 1 && ev == json::parse_event_t::key && parsed.is_string() &&
          !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(path + ": invalid safetensors header: " + e.what());
  }
  if (!h.is_object()) throw Error(path + ": safetensors header is not an object");
  if (!duplicate.empty()) throw Error(path + ": tensor " + duplicate + " appears twice in the header");
  const uint8_t* data = base + 8 + hlen;
  const size_t data_size = size_ - 8 - hlen;
  struct Range {
    uint64_t begin, end;  // [begin, end) of a tensor with bytes, to find overlaps
    std::string name;
  };
  std::vector<Range> ranges;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    TensorView t;
    t.name = name;
    t.file = path;
    if (!v.is_object()) throw Error(path + ": tensor " + name + " has a malformed header entry (not an object)");
    for (const char* k : {"dtype", "shape", "data_offsets"})
      if (!v.contains(k)) throw Error(path + ": tensor " + name + " has no \"" + k + "\"");
    if (!v["dtype"].is_string()) throw Error(path + ": tensor " + name + " has a dtype that is not a string");
    const std::string dt = v["dtype"].get<std::string>();
    if (!dtype_from_name(dt, &t.dtype)) throw Error(path + ": tensor " + name + " has unsupported dtype " + dt);
    if (!v["shape"].is_array()) throw Error(path + ": tensor " + name + " has a shape that is not an array");
    // The element count in 128 bits: a shape whose product overflows 64 bits once wrapped to 0 bytes.
    unsigned __int128 count = 1;
    for (const auto& d : v["shape"]) {
      t.shape.push_back(header_count(d, path, name, "dimension"));
      count *= uint64_t(t.shape.back());
      if (count > (unsigned __int128)(uint64_t(1) << 62))
        throw Error(path + ": tensor " + name + " has a shape " + t.shape_str() + " too large");
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2) throw Error(path + ": tensor " + name + " has bad data_offsets");
    const uint64_t b = uint64_t(header_count(off[0], path, name, "data offset"));
    const uint64_t e = uint64_t(header_count(off[1], path, name, "data offset"));
    if (b > e) throw Error(path + ": tensor " + name + " has bad data_offsets");
    if (e > data_size) throw Error(path + ": tensor " + name + " extends past the end of the file (truncated?)");
    t.data = data + b;
    t.nbytes = e - b;
    if (count * dtype_size(t.dtype) != t.nbytes)
      throw Error(path + ": tensor " + name + " byte size " + std::to_string(t.nbytes) + " does not match " +
                  dtype_name(t.dtype) + " " + t.shape_str());
    if (t.nbytes) {
      ranges.push_back({b, e, name});
    }
    tensors_.emplace(name, std::move(t));
  }
  // No two tensors may share bytes (the format's rule; one would load the other's values).
  std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) { return x.begin < y.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      throw Error(path + ": tensors " + ranges[i - 1].name + " and " + ranges[i].name +
                  " overlap in the file");
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, size_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) throw Error(dir + ": not a model directory");
  std::vector<std::string> files;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  fs::path single = fs::path(dir) / "model.safetensors";
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index)) {
    const std::string text = read_regular_file(index.string());
    json j;
    try {
      j = json::parse(text);
      weight_map = j.at("weight_map").get<std::map<std::string, std::string>>();
    } catch (const json::exception& e) {
      throw Error(index.string() + ": invalid index: " + e.what());
    }
    for (auto& [n, fn] : weight_map) {
      // A shard is a file of this directory: no absolute path, no way out of it ("..").
      const fs::path rel(fn);
      bool outside = fn.empty() || rel.is_absolute() || fn == ".";
      for (const auto& part : rel) outside |= part == "..";
      if (outside)
        throw Error(index.string() + ": tensor " + n + " is placed in \"" + fn +
                    "\", which is not a file of the model directory");
      if (std::find(files.begin(), files.end(), fn) == files.end()) files.push_back(fn);
    }
  } else if (fs::exists(single)) {
    files.push_back("model.safetensors");
  } else {
    throw Error(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  for (auto& fn : files) {
    fs::path p = fs::path(dir) / fn;
    if (!fs::exists(p)) throw Error(p.string() + ": missing (listed in model.safetensors.index.json)");
    files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
  }
  for (auto& f : files_)
    for (auto& [n, t] : f->tensors())
      if (auto [it, fresh] = index_.emplace(n, &t); !fresh)
        throw Error(dir + ": tensor " + n + " is in two shards, " + fs::path(it->second->file).filename().string() +
                    " and " + fs::path(t.file).filename().string());
  for (auto& [n, fn] : weight_map) {
    auto it = index_.find(n);
    if (it == index_.end()) throw Error((fs::path(dir) / fn).string() + ": tensor " + n + " listed in the index is missing");
    if (fs::path(it->second->file).filename() != fn)
      throw Error(it->second->file + ": tensor " + n + " found here, but the index places it in " + fn);
  }
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  auto* t = find(name);
  if (!t) throw Error(dir_ + ": tensor " + name + " is missing from the checkpoint");
  return *t;
}

void SafetensorsFile::read_all(uint64_t& done, uint64_t total, const LoadProgressFn& progress) const {
  const auto* p = static_cast<const volatile uint8_t*>(map_);
  madvise(map_, size_, MADV_SEQUENTIAL | MADV_WILLNEED);
  const size_t kPage = 4096, kReport = size_t(64) << 20;
  for (size_t at = 0; at < size_;) {
    size_t end = std::min(size_, at + kReport);
    // One load a page faults it in (a volatile read: the compiler keeps it).
    for (size_t i = at; i < end; i += kPage) (void)p[i];
    done += end - at;
    at = end;
    if (progress) progress("reading", done, total);
  }
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (auto& f : files_) n += f->size();
  return n;
}

void Checkpoint::read_all(const LoadProgressFn& progress) const {
  uint64_t total = total_bytes(), done = 0;
  if (progress) progress("reading", 0, total);
  for (auto& f : files_) f->read_all(done, total, progress);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> r;
  for (auto& [n, t] : index_) r.push_back(n);
  return r;
}

size_t TensorSpec::nbytes() const {
  size_t n = dtype_size(dtype);
  for (auto d : shape) n *= size_t(d);
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                       const std::function<void(const TensorSpec&, uint8_t* out)>& fill) {
  // nlohmann::ordered_json keeps the declaration order, which is also the data order.
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"}};
  size_t off = 0;
  for (auto& s : specs) {
    h[s.name] = {{"dtype", dtype_name(s.dtype)}, {"shape", s.shape}, {"data_offsets", {off, off + s.nbytes()}}};
    off += s.nbytes();
  }
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8) hs.push_back(' ');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(path + ": cannot create");
  uint64_t hlen = hs.size();
  f.write(reinterpret_cast<const char*>(&hlen), 8);
  f.write(hs.data(), std::streamsize(hs.size()));
  std::vector<uint8_t> buf;
  for (auto& s : specs) {
    buf.assign(s.nbytes(), 0);
    fill(s, buf.data());
    f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
  }
  if (!f) throw Error(path + ": write failed");
}

}  // namespace gptoss
