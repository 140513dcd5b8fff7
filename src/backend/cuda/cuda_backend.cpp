// Placeholder until the CUDA backend lands: reports that this build cannot run on CUDA yet.
#include "backend/cuda/cuda_backend.h"

#include "core/error.h"

namespace arbor {

bool cuda_device_available(std::string* why) {
  if (why) *why = "the CUDA backend is not implemented in this build yet";
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(int) { fail("cuda: the CUDA backend is not implemented in this build yet"); }

}  // namespace arbor
