// Tensor: a non-owning view (pointer, dtype, shape up to rank 4, row stride, device). Buffer owns memory.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace arbor {

enum class Device : uint8_t { CPU, CUDA };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  std::array<int64_t, 4> shape{1, 1, 1, 1};
  Device device = Device::CPU;

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev = Device::CPU);

  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t rows() const;  // product of all but the last dimension
  int64_t cols() const { return ndim ? shape[ndim - 1] : 1; }
  bool empty() const { return data == nullptr; }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  std::string shape_str() const;  // "[4096, 11008]"
  // Rows [r0, r0+n) of a tensor viewed as a matrix [rows, cols].
  Tensor row_slice(int64_t r0, int64_t n) const;
};

// Buffer: owns host memory (64-byte aligned); frees it in its destructor.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_) { o.ptr_ = nullptr, o.size_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace arbor
