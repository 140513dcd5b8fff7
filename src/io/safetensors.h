// safetensors: a bounds-checked parser of the header (every field, offset and shape validated), an mmap-backed
// reader, and a writer. Format: u64 little-endian header length N, N bytes of JSON, then the data section.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/json.h"
#include "core/mmap.h"

namespace arbor {

// One tensor of a parsed file. `data` points into the caller's bytes (the mapping for SafetensorsFile); it is
// only as aligned as the file makes it (the data section starts at 8 + N, offsets are byte offsets), so readers
// of multi-byte elements must not assume natural alignment.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // [] for a scalar
  const uint8_t* data = nullptr;
  size_t nbytes = 0;           // == numel() * dtype_size(dtype)
  std::string file;            // file name it came from (for errors)
  size_t offset = 0;           // byte offset of `data` from the start of the data section
  int64_t numel() const;
};

// Largest header accepted, in bytes: the reference implementation's limit (safetensors MAX_HEADER_SIZE).
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

// Parses a safetensors file held in memory (the whole file). Tensors come back in data-section order.
// Throws arbor::Error "safetensors: <filename>: ..." naming the tensor and the numbers for: a file shorter than
// 8 bytes, a header length that lies (> size - 8) or is absurd (> kSafetensorsMaxHeader), a header that is not
// JSON or not an object, a missing or wrong-typed dtype/shape/data_offsets, an unknown dtype, a negative or
// overflowing shape, data_offsets outside the data section or with begin > end, shape*dtype_size != end - begin,
// overlapping tensors, duplicate names (also duplicate keys inside an entry), and a __metadata__ that is not a
// string -> string map. `metadata_out`, when given, receives __metadata__ (an empty object when absent).
std::vector<TensorInfo> parse_safetensors(const uint8_t* data, size_t size, const std::string& filename,
                                          json* metadata_out = nullptr);

// A safetensors file mapped read-only and parsed. The TensorInfo pointers stay valid while this object lives
// (moving it keeps them valid: the mapping does not move).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // data-section order
  const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
  const json& metadata() const { return metadata_; }
  const MappedFile& mapping() const { return mapping_; }
  const std::string& path() const { return mapping_.path(); }

 private:
  MappedFile mapping_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
  json metadata_;
};

// A tensor to write: raw little-endian element bytes, nbytes == product(shape) * dtype_size(dtype).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// The bytes of a safetensors file: data in the given order with no gaps (as the reference writer lays it out,
// so its strict reader accepts the file), header padded with spaces to a multiple of 8 bytes, __metadata__
// (string -> string) first when non-empty. Throws arbor::Error on a size mismatch, a duplicate or empty name, or
// non-string metadata.
std::string serialize_safetensors(const std::vector<TensorToWrite>& tensors, const json& metadata = json::object());

// Writes serialize_safetensors(...) to `path` (through a temporary file renamed into place).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const json& metadata = json::object());

}  // namespace arbor
