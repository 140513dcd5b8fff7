// What `arbor --version` prints: defined in the build folder's generated/build_info.cpp, which
// cmake/build_info.cmake rewrites at every build whose commit or configuration changed.
#pragma once

namespace arbor {
const char* build_commit();  // git HEAD, short, "-dirty" when tracked files differ from it
const char* build_config();  // build type, C++ compiler, CUDA version and architectures or "no CUDA"
}  // namespace arbor
