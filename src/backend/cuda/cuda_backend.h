// The CUDA backend's entry points (the backend itself lives in cuda_backend.cu and friends).
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace arbor {

// True when a CUDA device can be used; otherwise *why says what is missing (no driver, no device).
bool cuda_device_available(std::string* why);
// Creates the backend on device `index`. Throws arbor::Error naming the CUDA call that failed.
std::unique_ptr<Backend> make_cuda_backend(int index = 0);

}  // namespace arbor
