// Streaming safetensors writers (header first, tensors one at a time, sharded with an index).
#include "io/safetensors_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.h"

namespace arbor {

uint64_t TensorHeader::nbytes() const {
  uint64_t n = dtype_size(dtype);
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) fail("safetensors: write: tensor '{}': negative dimension in shape [{}]", name, fmt::join(shape, ", "));
    if (d == 0) empty = true;
    else if (__builtin_mul_overflow(n, uint64_t(d), &n) || n > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("safetensors: write: tensor '{}': shape [{}] passes 2^63 bytes", name, fmt::join(shape, ", "));
  }
  return empty ? 0 : n;
}

std::string safetensors_header(const std::vector<TensorHeader>& tensors, const json& metadata) {
  if (!metadata.is_object()) fail("safetensors: write: metadata is a JSON {}, not an object", metadata.type_name());
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = h["__metadata__"] = nlohmann::ordered_json::object();
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (!it->is_string())
        fail("safetensors: write: metadata '{}' is a JSON {}, not a string", it.key(), it->type_name());
      m[it.key()] = it->get<std::string>();
    }
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || h.contains(t.name))
      fail("safetensors: write: tensor name '{}' is empty, reserved or used twice", t.name);
    const uint64_t n = t.nbytes();
    h[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string header;
  try {
    header = h.dump();
  } catch (const nlohmann::ordered_json::exception& e) {  // names that are not valid UTF-8
    fail("safetensors: write: cannot encode the header: {}", e.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');  // the data section then starts 8-byte aligned
  return header;
}

SafetensorsStreamWriter::SafetensorsStreamWriter(std::string path, std::vector<TensorHeader> plan, const json& metadata)
    : path_(std::move(path)), plan_(std::move(plan)) {
  const std::string header = safetensors_header(plan_, metadata);
  tmp_ = fmt::format("{}.tmp{}", path_, ::getpid());
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) fail("safetensors: cannot create {}: {}", tmp_, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
  put(len, 8);
  put(header.data(), header.size());
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

void SafetensorsStreamWriter::put(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, f_) != n) {
    int e = errno;
    fail("safetensors: cannot write {} ({} bytes in): {}", path_, file_bytes_, std::strerror(e));
  }
  file_bytes_ += n;
}

void SafetensorsStreamWriter::write(std::string_view name, const void* data, size_t nbytes) {
  if (!finished_ && next_ < plan_.size() && in_tensor_ == 0 && nbytes != plan_[next_].nbytes() && name == plan_[next_].name)
    fail("safetensors: {}: tensor '{}': shape [{}] of {} needs {} bytes, got {}", path_, name,
         fmt::join(plan_[next_].shape, ", "), dtype_name(plan_[next_].dtype), plan_[next_].nbytes(), nbytes);
  write_part(name, data, nbytes);
  if (in_tensor_ != 0) fail("safetensors: {}: tensor '{}' was started in parts and then written whole", path_, name);
}

void SafetensorsStreamWriter::write_part(std::string_view name, const void* data, size_t nbytes) {
  if (finished_) fail("safetensors: {}: tensor '{}' written after the file was finished", path_, name);
  if (next_ >= plan_.size()) {
    bool planned = false;
    for (const auto& t : plan_) planned |= t.name == name;
    fail("safetensors: {}: tensor '{}' {}; every planned tensor is written", path_, name,
         planned ? "written twice" : "is not in the file's plan");
  }
  const TensorHeader& t = plan_[next_];
  if (name != t.name) {
    size_t at = plan_.size();
    for (size_t i = 0; i < plan_.size(); ++i)
      if (plan_[i].name == name) at = i;
    if (at == plan_.size()) fail("safetensors: {}: tensor '{}' is not in the file's plan (next is '{}')", path_, name, t.name);
    fail("safetensors: {}: tensor '{}' written out of order: it is number {} of the plan, the next to write is '{}' "
         "(number {}){}", path_, name, at + 1, t.name, next_ + 1, in_tensor_ ? fmt::format(", {} bytes into it", in_tensor_) : "");
  }
  const uint64_t need = t.nbytes();
  if (in_tensor_ + nbytes > need)
    fail("safetensors: {}: tensor '{}': shape [{}] of {} needs {} bytes, got {}", path_, name, fmt::join(t.shape, ", "),
         dtype_name(t.dtype), need, in_tensor_ + nbytes);
  if (nbytes && !data) fail("safetensors: {}: tensor '{}': {} bytes but no data", path_, name, nbytes);
  put(data, nbytes);
  in_tensor_ += nbytes;
  if (in_tensor_ == need) {
    in_tensor_ = 0;
    ++next_;  // a zero-size tensor is complete on its first (empty) write
  }
}

void SafetensorsStreamWriter::finish() {
  if (finished_) return;
  if (next_ < plan_.size())
    fail("safetensors: {}: finished with {} of {} tensors written; '{}' is missing{}", path_, next_, plan_.size(),
         plan_[next_].name, in_tensor_ ? fmt::format(" ({} of {} bytes written)", in_tensor_, plan_[next_].nbytes()) : "");
  FILE* f = f_;
  f_ = nullptr;
  int werr = 0;
  if (std::fflush(f) != 0) werr = errno;
  if (std::fclose(f) != 0 && !werr) werr = errno;
  if (werr) {
    std::remove(tmp_.c_str());
    fail("safetensors: cannot write {}: {}", path_, std::strerror(werr));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    int e = errno;
    std::remove(tmp_.c_str());
    fail("safetensors: cannot rename {} to {}: {}", tmp_, path_, std::strerror(e));
  }
  finished_ = true;
}

std::vector<std::pair<size_t, size_t>> plan_shards(const std::vector<TensorHeader>& plan, uint64_t max_shard_bytes) {
  std::vector<std::pair<size_t, size_t>> out{{0, 0}};
  uint64_t size = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const uint64_t n = plan[i].nbytes();
    if (out.back().second > out.back().first && size + n > max_shard_bytes) out.push_back({i, i}), size = 0;
    out.back().second = i + 1;
    size += n;
  }
  return out;
}

ShardedSafetensorsWriter::ShardedSafetensorsWriter(std::string dir, std::vector<TensorHeader> plan, uint64_t max_shard_bytes,
                                                   json file_metadata, json index_metadata, bool always_index)
    : dir_(std::move(dir)),
      plan_(std::move(plan)),
      file_metadata_(std::move(file_metadata)),
      index_metadata_(std::move(index_metadata)),
      always_index_(always_index) {
  if (!index_metadata_.is_object()) fail("safetensors: write: index metadata is a JSON {}, not an object", index_metadata_.type_name());
  {
    std::set<std::string_view> names;  // a duplicate across shards would otherwise only show in the index
    for (const auto& t : plan_) {
      if (!names.insert(t.name).second) fail("safetensors: write: tensor name '{}' is used twice", t.name);
      total_ += t.nbytes();
    }
  }
  shards_ = plan_shards(plan_, max_shard_bytes);
  for (size_t s = 0; s < shards_.size(); ++s)
    files_.push_back(shards_.size() == 1 ? std::string("model.safetensors")
                                         : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards_.size()));
  std::filesystem::create_directories(dir_);
}

ShardedSafetensorsWriter::~ShardedSafetensorsWriter() = default;

SafetensorsStreamWriter& ShardedSafetensorsWriter::current(std::string_view name) {
  if (finished_) fail("safetensors: {}: tensor '{}' written after the checkpoint was finished", dir_, name);
  auto open = [&] {
    std::vector<TensorHeader> part(plan_.begin() + long(shards_[shard_].first), plan_.begin() + long(shards_[shard_].second));
    w_ = std::make_unique<SafetensorsStreamWriter>(dir_ + "/" + files_[shard_], std::move(part), file_metadata_);
  };
  if (!w_) open();
  while (w_->next_index() == w_->plan().size() && shard_ + 1 < shards_.size()) {
    w_->finish();
    ++shard_;
    open();
  }
  return *w_;
}

void ShardedSafetensorsWriter::write(std::string_view name, const void* data, size_t nbytes) { current(name).write(name, data, nbytes); }
void ShardedSafetensorsWriter::write_part(std::string_view name, const void* data, size_t nbytes) {
  current(name).write_part(name, data, nbytes);
}

void ShardedSafetensorsWriter::finish() {
  if (finished_) return;
  // current() moves past complete shards (opening each, so a shard of zero-size tensors gets its file); the
  // shard it stops at is the last one or an incomplete one, whose finish() names the missing tensor.
  current("");
  w_->finish();
  if (shards_.size() > 1 || always_index_) {
    json meta = index_metadata_;
    meta["total_size"] = total_;
    json weight_map = json::object();  // nlohmann's object keeps keys sorted, as mlx-lm sorts its weight_map
    for (size_t s = 0; s < shards_.size(); ++s)
      for (size_t i = shards_[s].first; i < shards_[s].second; ++i) weight_map[plan_[i].name] = files_[s];
    const std::string path = dir_ + "/model.safetensors.index.json";
    std::ofstream f(path);
    f << json{{"metadata", meta}, {"weight_map", weight_map}}.dump(4) << "\n";
    if (!f) fail("safetensors: cannot write {}", path);
  }
  finished_ = true;
}

}  // namespace arbor
