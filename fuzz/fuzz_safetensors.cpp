// libFuzzer target for the safetensors header parser: arbitrary bytes must either parse into tensors that lie
// inside the input and do not overlap, or be refused with an arbor::Error; a parsed file must survive a
// write/re-parse round trip unchanged.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

[[noreturn]] void broken(const char* what) {
  fprintf(stderr, "fuzz_safetensors: invariant broken: %s\n", what);
  abort();
}

void check(const std::vector<arbor::TensorInfo>& ts, const uint8_t* data, size_t size) {
  const uint8_t* prev_end = nullptr;
  for (const auto& t : ts) {
    if (t.nbytes != size_t(t.numel()) * arbor::dtype_size(t.dtype)) broken("nbytes != numel * dtype_size");
    if (t.data < data || t.data > data + size || t.nbytes > size_t(data + size - t.data)) broken("tensor outside input");
    if (t.nbytes && prev_end && t.data < prev_end) broken("tensors overlap");  // returned in data order
    if (t.nbytes && (!prev_end || t.data + t.nbytes > prev_end)) prev_end = t.data + t.nbytes;
    for (int64_t d : t.shape)
      if (d < 0) broken("negative dimension");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<arbor::TensorInfo> ts;
  arbor::json meta;
  try {
    ts = arbor::parse_safetensors(data, size, "fuzz.safetensors", &meta);
  } catch (const arbor::Error&) {
    return 0;  // refused with a message: the expected outcome for most inputs
  }
  check(ts, data, size);
  if (!meta.is_object()) broken("metadata not an object");

  // Round trip: what parsed must serialize, and re-parse to the same tensors and bytes.
  std::vector<arbor::TensorToWrite> w;
  for (const auto& t : ts) w.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
  std::string bytes;
  try {
    bytes = arbor::serialize_safetensors(w, meta);
  } catch (const arbor::Error& e) {
    fprintf(stderr, "fuzz_safetensors: serialize: %s\n", e.what());
    broken("a parsed file does not serialize");
  }
  arbor::json meta2;
  auto back = arbor::parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "rt", &meta2);
  if (back.size() != ts.size() || meta2 != meta) broken("round trip changed the tensor count or metadata");
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& a = ts[i];
    const auto* b = &back[i];
    if (a.name != b->name) {  // zero-size tensors may change relative order; look the name up
      b = nullptr;
      for (const auto& x : back)
        if (x.name == a.name) b = &x;
      if (!b) broken("round trip lost a tensor");
    }
    if (a.dtype != b->dtype || a.shape != b->shape || a.nbytes != b->nbytes ||
        (a.nbytes && std::memcmp(a.data, b->data, a.nbytes) != 0))
      broken("round trip changed a tensor");
  }
  return 0;
}
