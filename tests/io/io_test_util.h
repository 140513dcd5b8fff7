// Helpers for the io tests: scratch directories and hand-built safetensors bytes (for malformed headers).
#pragma once
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "../test_util.h"

namespace arbor::test {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("arbor_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The bytes of a safetensors file with `header` verbatim and `data_size` data bytes (values i & 0xff).
inline std::vector<uint8_t> raw_safetensors(const std::string& header, size_t data_size) {
  std::vector<uint8_t> out(8 + header.size() + data_size);
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
  for (size_t i = 0; i < header.size(); ++i) out[8 + i] = uint8_t(header[i]);
  for (size_t i = 0; i < data_size; ++i) out[8 + header.size() + i] = uint8_t(i);
  return out;
}

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

}  // namespace arbor::test
