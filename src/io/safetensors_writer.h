// Streaming safetensors writers: the header (every tensor's name, dtype, shape and offsets) is written first,
// then the tensors one by one in the planned order, so that memory holds at most the tensor being written
// (write_safetensors in safetensors.h builds the whole file in memory). ShardedSafetensorsWriter spreads a plan
// over model-0000X-of-0000N.safetensors files with a model.safetensors.index.json, as mlx-lm's save_model and
// Hugging Face's save_pretrained lay them out.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/json.h"

namespace arbor {

// One tensor of a plan: what the header says about it.
struct TensorHeader {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;  // product(shape) * dtype_size(dtype); throws on overflow or a negative dimension
};

// The header JSON of a safetensors file holding `tensors` in this order with no gaps, __metadata__ (string ->
// string) first when non-empty, padded with spaces to a multiple of 8 bytes (the bytes after the 8-byte length).
// Throws arbor::Error "safetensors: write: ..." naming the tensor for a duplicate, empty or reserved name, a
// negative or overflowing shape, and non-string metadata.
std::string safetensors_header(const std::vector<TensorHeader>& tensors, const json& metadata = json::object());

// Writes one file. The constructor writes the header to `path`.tmp<pid>; write() appends tensors in plan order
// (each in one call or in several write_part() calls); finish() checks every tensor came, flushes and renames the
// file into place. Destroyed unfinished (an error on the way), it removes the temporary file. Errors name the
// file and the tensor: a tensor out of order, one the plan does not hold, a byte count that differs from its
// shape, a write after finish(), and I/O failures.
class SafetensorsStreamWriter {
 public:
  SafetensorsStreamWriter(std::string path, std::vector<TensorHeader> plan, const json& metadata = json::object());
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // The whole tensor `name`, which must be the next one of the plan.
  void write(std::string_view name, const void* data, size_t nbytes);
  // Part of tensor `name`: the first call for a tensor starts it, later calls continue it, and the tensor is
  // complete when its bytes are in (a part past its end is an error). A zero-size tensor is written too, with
  // zero bytes.
  void write_part(std::string_view name, const void* data, size_t nbytes);
  void finish();

  const std::string& path() const { return path_; }
  const std::vector<TensorHeader>& plan() const { return plan_; }
  size_t next_index() const { return next_; }  // tensors complete so far
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  void put(const void* data, size_t n);
  std::string path_, tmp_;
  std::vector<TensorHeader> plan_;
  FILE* f_ = nullptr;
  size_t next_ = 0;        // index of the tensor being written
  uint64_t in_tensor_ = 0;  // bytes of plan_[next_] written so far
  uint64_t file_bytes_ = 0;
  bool finished_ = false;
};

// Splits a plan into shards of at most max_shard_bytes of tensor data each, in order, as mlx-lm's make_shards
// does (a new shard starts when the next tensor would pass the limit; a tensor larger than the limit gets a
// shard of its own). Returns the index ranges [first, last) of each shard (at least one, possibly empty).
std::vector<std::pair<size_t, size_t>> plan_shards(const std::vector<TensorHeader>& plan, uint64_t max_shard_bytes);

// Writes a plan as shards into `dir`: "model.safetensors" when it fits one shard, else
// "model-%05d-of-%05d.safetensors", each with `file_metadata` as __metadata__, and model.safetensors.index.json
// ({"metadata": {"total_size": N, ...index_metadata}, "weight_map": {name: file} sorted by name}, indented by 4)
// when there are several shards or `always_index`. Tensors come in plan order through write()/write_part();
// one shard file is open at a time. finish() closes the last shard and writes the index.
class ShardedSafetensorsWriter {
 public:
  ShardedSafetensorsWriter(std::string dir, std::vector<TensorHeader> plan, uint64_t max_shard_bytes,
                           json file_metadata = json::object(), json index_metadata = json::object(),
                           bool always_index = false);
  ~ShardedSafetensorsWriter();
  void write(std::string_view name, const void* data, size_t nbytes);
  void write_part(std::string_view name, const void* data, size_t nbytes);
  void finish();

  size_t shard_count() const { return shards_.size(); }
  const std::vector<std::string>& file_names() const { return files_; }
  uint64_t total_bytes() const { return total_; }

 private:
  SafetensorsStreamWriter& current(std::string_view name);
  std::string dir_;
  std::vector<TensorHeader> plan_;
  std::vector<std::pair<size_t, size_t>> shards_;
  std::vector<std::string> files_;
  json file_metadata_, index_metadata_;
  bool always_index_;
  size_t shard_ = 0;  // shard being written
  std::unique_ptr<SafetensorsStreamWriter> w_;
  uint64_t total_ = 0;
  bool finished_ = false;
};

}  // namespace arbor
