// Checkpoint: the safetensors files of a Hugging Face model directory (one file or shards), looked up by
// tensor name, with the weight audit's bookkeeping (which tensors the model consumed).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"

namespace arbor {

class Checkpoint {
 public:
  // Opens `dir`: model.safetensors.index.json (its weight_map names the shard of every tensor), else
  // model.safetensors, else every *.safetensors in the directory. Throws arbor::Error "checkpoint: <dir>: ..."
  // when there are no weights, the index is malformed or names a missing shard, a tensor the index names is not
  // in its shard, or a tensor name appears in two files. Each file is mapped and fully parsed (see
  // parse_safetensors for what a file must satisfy).
  static Checkpoint open(const std::string& dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

  const TensorInfo* find(std::string_view name) const;     // nullptr if absent
  const TensorInfo& take(std::string_view name);            // marks consumed; throws "checkpoint: <dir>: missing tensor 'x'"
  const TensorInfo* take_optional(std::string_view name);  // marks consumed if present
  bool consumed(std::string_view name) const;
  // Throws listing every unconsumed tensor (sorted by name; the first 20, then "and N more").
  void check_all_consumed() const;

  std::vector<const TensorInfo*> tensors() const;  // sorted by name
  uint64_t total_bytes() const;                    // sum of every tensor's nbytes
  const std::string& dir() const { return dir_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }  // sorted by file name

  // Reads every page of every tensor, file by file in data order, so that later access does not fault on
  // cold pages. Calls progress(n) after each chunk with the n bytes just touched (n sums to total_bytes()),
  // so it plugs into Progress::advance.
  void prefault(const std::function<void(uint64_t)>& progress) const;

 private:
  Checkpoint() = default;
  struct Entry {
    const TensorInfo* info;
    bool consumed = false;
  };
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace arbor
