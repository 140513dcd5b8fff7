// Tensor views and host buffers.
#include "core/tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace arbor {

Tensor::Tensor(void* d, DType t, std::initializer_list<int64_t> dims, Device dev) : data(d), dtype(t), device(dev) {
  ARBOR_CHECK(dims.size() <= 4, "tensor: rank {} exceeds 4", dims.size());
  ndim = int(dims.size());
  int i = 0;
  for (auto v : dims) shape[i++] = v;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

int64_t Tensor::rows() const {
  int64_t n = 1;
  for (int i = 0; i + 1 < ndim; ++i) n *= shape[i];
  return n;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

Tensor Tensor::row_slice(int64_t r0, int64_t n) const {
  ARBOR_CHECK(r0 >= 0 && r0 + n <= rows(), "tensor: rows [{}, {}) outside {}", r0, r0 + n, shape_str());
  Tensor t = *this;
  t.data = static_cast<char*>(data) + size_t(r0) * size_t(cols()) * dtype_size(dtype);
  t.ndim = 2;
  t.shape = {n, cols(), 1, 1};
  return t;
}

Buffer::Buffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  ptr_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!ptr_) throw std::bad_alloc();
}

Buffer::~Buffer() { std::free(ptr_); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    std::free(ptr_);
    ptr_ = o.ptr_, size_ = o.size_;
    o.ptr_ = nullptr, o.size_ = 0;
  }
  return *this;
}

}  // namespace arbor
