// The device view of an affine Linear (affine.h): what CudaBackend::load_linear uploads, read back with checks.
#include "backend/cuda/affine.h"

#include "backend/backend.h"
#include "core/error.h"

namespace arbor::cuda {

AffineWeights affine_weights(const Linear& l) {
  ARBOR_CHECK(l.format == WeightFormat::Affine, "cuda: {} is not an affine matrix", l.describe());
  const int64_t R = l.rows(), C = l.cols();
  ARBOR_CHECK(l.group_size > 0 && C % l.group_size == 0 && (C * l.bits) % 32 == 0, "cuda: {}: columns do not divide into groups",
              l.describe());
  const int64_t G = C / l.group_size;
  ARBOR_CHECK(l.data.device == Device::CUDA && l.data.dtype == DType::U32 && l.data.ndim == 2 && l.data.shape[0] == R &&
                  l.data.shape[1] == C * l.bits / 32,
              "cuda: {}: codes must be device U32 [{}, {}] (CudaBackend::load_linear's layout), got {} {}", l.describe(), R,
              C * l.bits / 32, dtype_name(l.data.dtype), l.data.shape_str());
  ARBOR_CHECK(l.scales.device == Device::CUDA && (l.scales.dtype == DType::BF16 || l.scales.dtype == DType::F16) && l.scales.ndim == 3 &&
                  l.scales.shape[0] == R && l.scales.shape[1] == G && l.scales.shape[2] == 2 && l.biases.empty(),
              "cuda: {}: scales must be device BF16/F16 (scale, bias) pairs [{}, {}, 2] and biases empty (CudaBackend::load_linear's "
              "layout), got {} {}",
              l.describe(), R, G, dtype_name(l.scales.dtype), l.scales.shape_str());
  AffineWeights w{};
  w.codes = l.data.as<const uint32_t>();
  w.sb = l.scales.as<const uint32_t>();
  w.sb_f16 = l.scales.dtype == DType::F16;
  w.rows = R, w.cols = C, w.bits = l.bits, w.group_size = l.group_size;
  return w;
}

}  // namespace arbor::cuda
