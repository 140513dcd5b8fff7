// Checkpoint directories: single file, index-sharded or globbed shards; tensor lookup and the consumed-tensor audit.
#include "io/checkpoint.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/json.h"

namespace arbor {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kSingle = "model.safetensors";

// A shard name from an index must stay inside the checkpoint directory.
void check_shard_name(const std::string& dir, const std::string& shard) {
  fs::path p(shard);
  bool bad = shard.empty() || p.is_absolute();
  for (const auto& part : p) bad |= part == "..";
  if (bad) fail("checkpoint: {}: {} names shard '{}', which is not a file name inside the directory", dir, kIndex, shard);
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("checkpoint: {}: not a directory", dir);
  Checkpoint c;
  c.dir_ = dir;

  // tensor name -> shard file name, when the directory has an index
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> names;  // files to open, relative to dir
  const std::string index_path = (fs::path(dir) / kIndex).string();
  if (file_exists(index_path)) {
    json idx = read_json_file(index_path);
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail("checkpoint: {}: {} has no 'weight_map' object", dir, kIndex);
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it->is_string())
        fail("checkpoint: {}: {}: weight_map['{}'] is a JSON {}, not a file name", dir, kIndex, it.key(), it->type_name());
      const auto& shard = it->get_ref<const std::string&>();
      check_shard_name(dir, shard);
      weight_map.emplace(it.key(), shard);
    }
    if (weight_map.empty()) fail("checkpoint: {}: {} has an empty weight_map", dir, kIndex);
    for (const auto& [tensor, shard] : weight_map) {
      if (std::find(names.begin(), names.end(), shard) != names.end()) continue;
      if (!file_exists((fs::path(dir) / shard).string()))
        fail("checkpoint: {}: {} puts tensor '{}' in shard '{}', which does not exist", dir, kIndex, tensor, shard);
      names.push_back(shard);
    }
  } else if (file_exists((fs::path(dir) / kSingle).string())) {
    names.push_back(kSingle);
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") names.push_back(e.path().filename().string());
    if (ec) fail("checkpoint: {}: cannot list the directory: {}", dir, ec.message());
    if (names.empty()) fail("checkpoint: {}: no {}, {} or *.safetensors files", dir, kIndex, kSingle);
  }
  std::sort(names.begin(), names.end());

  std::map<std::string, size_t> file_of;  // shard name -> index into files_
  for (const auto& n : names) {
    file_of[n] = c.files_.size();
    c.files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / n).string()));
    for (const auto& t : c.files_.back()->tensors()) {
      auto [it, fresh] = c.entries_.try_emplace(t.name, Entry{&t});
      if (!fresh) fail("checkpoint: {}: tensor '{}' is in two files: {} and {}", dir, t.name, it->second.info->file, t.file);
    }
  }
  for (const auto& [tensor, shard] : weight_map) {
    if (c.files_[file_of.at(shard)]->find(tensor)) continue;
    auto it = c.entries_.find(tensor);
    if (it != c.entries_.end())
      fail("checkpoint: {}: {} puts tensor '{}' in shard '{}', but it is in {}", dir, kIndex, tensor, shard,
           it->second.info->file);
    fail("checkpoint: {}: {} puts tensor '{}' in shard '{}', which does not contain it", dir, kIndex, tensor, shard);
  }
  return c;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.info;
}

const TensorInfo& Checkpoint::take(std::string_view name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("checkpoint: {}: missing tensor '{}'", dir_, name);
  it->second.consumed = true;
  return *it->second.info;
}

const TensorInfo* Checkpoint::take_optional(std::string_view name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return nullptr;
  it->second.consumed = true;
  return it->second.info;
}

bool Checkpoint::consumed(std::string_view name) const {
  auto it = entries_.find(name);
  return it != entries_.end() && it->second.consumed;
}

void Checkpoint::check_all_consumed() const {
  constexpr size_t kShown = 20;
  std::vector<std::string_view> left;
  for (const auto& [name, e] : entries_)
    if (!e.consumed) left.push_back(name);  // map order: sorted by name
  if (left.empty()) return;
  std::string list = fmt::format("'{}'", fmt::join(left.begin(), left.begin() + std::min(left.size(), kShown), "', '"));
  if (left.size() > kShown) list += fmt::format(" and {} more", left.size() - kShown);
  fail("checkpoint: {}: {} tensor{} not used by the model: {}", dir_, left.size(), left.size() == 1 ? " is" : "s are",
       list);
}

std::vector<const TensorInfo*> Checkpoint::tensors() const {
  std::vector<const TensorInfo*> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(e.info);
  return out;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, e] : entries_) n += e.info->nbytes;
  return n;
}

void Checkpoint::prefault(const std::function<void(uint64_t)>& progress) const {
  constexpr size_t kChunk = size_t(16) << 20;  // bytes between progress calls
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  volatile uint8_t sink = 0;
  for (const auto& f : files_) {
    const MappedFile& m = f->mapping();
    // Start the kernel's readahead for the whole file; the loop below then mostly finds pages resident.
    if (m.size()) ::madvise(const_cast<uint8_t*>(m.data()), m.size(), MADV_WILLNEED);
    for (const auto& t : f->tensors()) {  // data order
      for (size_t done = 0; done < t.nbytes;) {
        size_t n = std::min(kChunk, t.nbytes - done);
        uint8_t acc = 0;
        const uint8_t* p = t.data + done;
        for (size_t i = 0; i < n; i += page) acc ^= p[i];
        acc ^= p[n - 1];
        sink = sink ^ acc;
        done += n;
        if (progress) progress(n);
      }
    }
  }
  (void)sink;
}

}  // namespace arbor
