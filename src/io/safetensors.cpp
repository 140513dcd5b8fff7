// safetensors header parser (untrusted bytes: every field, offset and shape checked), mmap reader and writer.
#include "io/safetensors.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.h"
#include "io/safetensors_writer.h"

namespace arbor {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// A valid header nests three deep (root -> entry -> shape); anything far deeper is garbage, and refusing it
// keeps the parser's work bounded.
constexpr int kMaxDepth = 8;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

std::string supported_dtypes() {
  std::string s;
  for (int i = 0; i <= int(DType::F8_E5M2); ++i) s += fmt::format("{}{}", i ? ", " : "", dtype_name(DType(i)));
  return s;
}

// Bytes of a tensor of this shape and dtype, or nullopt when the product of its non-zero dimensions times the
// element size passes 2^63 (judged without the zeros, so that a zero-size tensor cannot smuggle in dimensions
// whose partial products, the strides, overflow int64 in the code that later indexes it). Dimensions are >= 0.
std::optional<uint64_t> shape_bytes(const std::vector<int64_t>& shape, DType dt) {
  uint64_t extent = dtype_size(dt);
  bool empty = false;
  for (int64_t d : shape) {
    if (d == 0) empty = true;
    else if (__builtin_mul_overflow(extent, uint64_t(d), &extent)) return std::nullopt;
  }
  if (extent > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return empty ? 0 : extent;
}

// At most ~kShown bytes of an untrusted string for an error message, cut on a UTF-8 character boundary (the
// message may end up in a JSON error response, which must stay valid UTF-8).
constexpr size_t kShown = 120;
std::string brief(std::string_view s) {
  if (s.size() <= kShown) return std::string(s);
  size_t n = kShown;
  while (n > 0 && (uint8_t(s[n]) & 0xc0) == 0x80) --n;
  return fmt::format("{}... ({} bytes)", s.substr(0, n), s.size());
}
std::string brief_json(const json& v) { return brief(v.dump()); }

std::string shape_str(const std::vector<int64_t>& shape) { return brief(fmt::format("[{}]", fmt::join(shape, ", "))); }

// Parses the header JSON, refusing duplicate keys in any object (nlohmann would silently keep the last one,
// so a duplicated tensor name would hide a tensor) and absurd nesting.
json parse_header(const char* begin, const char* end, const std::string& file) {
  std::vector<std::set<std::string>> keys;  // one key set per open object
  std::string entry;                        // the root key being parsed, for messages
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxDepth) fail("safetensors: {}: header nests deeper than {} levels", file, kMaxDepth);
        if (ev == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        if (keys.size() == 1) entry = k;
        if (!keys.back().insert(k).second) {
          if (keys.size() == 1) fail("safetensors: {}: duplicate tensor name '{}' in the header", file, brief(k));
          fail("safetensors: {}: tensor '{}': duplicate key '{}' in its entry", file, brief(entry), brief(k));
        }
        break;
      }
      case json::parse_event_t::object_end:
        keys.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, cb);
  } catch (const json::exception& e) {
    fail("safetensors: {}: header ({} bytes) is not valid JSON: {}", file, end - begin, e.what());
  }
}

// A JSON value that is a non-negative integer fitting int64, or nullopt.
std::optional<uint64_t> as_index(const json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u <= uint64_t(std::numeric_limits<int64_t>::max())) return u;
  }
  return std::nullopt;
}

const json& field(const json& entry, const char* key, const std::string& file, const std::string& name) {
  auto it = entry.find(key);
  if (it == entry.end()) fail("safetensors: {}: tensor '{}': missing '{}'", file, name, key);
  return *it;
}

TensorInfo parse_entry(const std::string& name, const json& e, const uint8_t* data_section, uint64_t data_size,
                       const std::string& file) {
  const std::string shown = brief(name);
  // No checkpoint names a tensor "", and nothing could look it up or write it back (the writer refuses it).
  if (name.empty()) fail("safetensors: {}: a tensor has an empty name", file);
  if (!e.is_object()) fail("safetensors: {}: tensor '{}': entry is a JSON {}, not an object", file, shown, e.type_name());
  TensorInfo t;
  t.name = name;
  t.file = file;

  const json& jd = field(e, "dtype", file, shown);
  if (!jd.is_string()) fail("safetensors: {}: tensor '{}': 'dtype' is a JSON {}, not a string", file, shown, jd.type_name());
  const auto& ds = jd.get_ref<const std::string&>();
  auto dt = dtype_from_name(ds);
  if (!dt) fail("safetensors: {}: tensor '{}': unknown dtype '{}' (supported: {})", file, shown, brief(ds), supported_dtypes());
  t.dtype = *dt;

  const json& js = field(e, "shape", file, shown);
  if (!js.is_array()) fail("safetensors: {}: tensor '{}': 'shape' is a JSON {}, not an array", file, shown, js.type_name());
  for (size_t i = 0; i < js.size(); ++i) {
    const json& d = js[i];
    if (d.is_number_integer() && !d.is_number_unsigned())
      fail("safetensors: {}: tensor '{}': shape dimension {} is negative ({})", file, shown, i, d.get<int64_t>());
    auto v = as_index(d);
    if (!v) fail("safetensors: {}: tensor '{}': shape dimension {} is {}, not an integer in [0, 2^63)", file, shown, i, brief_json(d));
    t.shape.push_back(int64_t(*v));
  }
  const auto bytes = shape_bytes(t.shape, t.dtype);
  if (!bytes)
    fail("safetensors: {}: tensor '{}': shape {} of {} overflows (more than 2^63 bytes)", file, shown, shape_str(t.shape),
         brief(ds));
  const uint64_t nbytes = *bytes;

  const json& jo = field(e, "data_offsets", file, shown);
  if (!jo.is_array() || jo.size() != 2)
    fail("safetensors: {}: tensor '{}': 'data_offsets' is {}, not an array of two integers", file, shown, brief_json(jo));
  auto b = as_index(jo[0]), en = as_index(jo[1]);
  if (!b || !en)
    fail("safetensors: {}: tensor '{}': 'data_offsets' {} must hold two integers in [0, 2^63)", file, shown, brief_json(jo));
  if (*b > *en) fail("safetensors: {}: tensor '{}': data_offsets [{}, {}] begin after they end", file, shown, *b, *en);
  if (*en > data_size)
    fail("safetensors: {}: tensor '{}': data_offsets [{}, {}] end at byte {} of the data section, which has {} bytes",
         file, shown, *b, *en, *en, data_size);
  if (*en - *b != nbytes)
    fail("safetensors: {}: tensor '{}': shape {} of {} needs {} bytes, data_offsets [{}, {}] hold {}", file, shown,
         shape_str(t.shape), brief(ds), nbytes, *b, *en, *en - *b);
  t.offset = size_t(*b);
  t.nbytes = size_t(nbytes);
  t.data = data_section + *b;
  return t;
}

}  // namespace

std::vector<TensorInfo> parse_safetensors(const uint8_t* data, size_t size, const std::string& filename,
                                          json* metadata_out) {
  if (size < 8)
    fail("safetensors: {}: file is {} bytes, shorter than the 8-byte header length field", filename, size);
  const uint64_t n = read_u64_le(data);
  if (n > size - 8)
    fail("safetensors: {}: header length {} exceeds the {} bytes after the length field (file is {} bytes; truncated?)",
         filename, n, size - 8, size);
  if (n > kSafetensorsMaxHeader)
    fail("safetensors: {}: header length {} is larger than the {}-byte limit", filename, n, kSafetensorsMaxHeader);
  const char* hb = reinterpret_cast<const char*>(data + 8);
  json h = parse_header(hb, hb + n, filename);
  if (!h.is_object()) fail("safetensors: {}: header is a JSON {}, not an object", filename, h.type_name());

  const uint8_t* data_section = data + 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<TensorInfo> out;
  out.reserve(h.size());
  json metadata = json::object();
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        fail("safetensors: {}: __metadata__ is a JSON {}, not an object of strings", filename, it->type_name());
      for (auto m = it->begin(); m != it->end(); ++m)
        if (!m->is_string())
          fail("safetensors: {}: __metadata__ must map strings to strings; '{}' holds a JSON {}", filename, brief(m.key()),
               m->type_name());
      metadata = std::move(*it);
      continue;
    }
    out.push_back(parse_entry(it.key(), *it, data_section, data_size, filename));
  }

  // Overlap: in begin order, a non-empty tensor must start at or after the furthest end seen so far.
  std::sort(out.begin(), out.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes != b.nbytes ? a.nbytes < b.nbytes : a.name < b.name;
  });
  const TensorInfo* furthest = nullptr;
  for (const auto& t : out) {
    if (t.nbytes == 0) continue;
    if (furthest && t.offset < furthest->offset + furthest->nbytes)
      fail("safetensors: {}: tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) overlap", filename,
           brief(furthest->name), furthest->offset, furthest->offset + furthest->nbytes, brief(t.name), t.offset, t.offset + t.nbytes);
    if (!furthest || t.offset + t.nbytes > furthest->offset + furthest->nbytes) furthest = &t;
  }
  if (metadata_out) *metadata_out = std::move(metadata);
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : mapping_(path) {
  tensors_ = parse_safetensors(mapping_.data(), mapping_.size(), path, &metadata_);
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::string serialize_safetensors(const std::vector<TensorToWrite>& tensors, const json& metadata) {
  std::vector<TensorHeader> plan;
  plan.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    for (int64_t d : t.shape)
      if (d < 0) fail("safetensors: write: tensor '{}': negative dimension in shape {}", t.name, shape_str(t.shape));
    const auto need = shape_bytes(t.shape, t.dtype);
    if (!need || *need != t.nbytes)
      fail("safetensors: write: tensor '{}': shape {} of {} needs {} bytes, got {}", t.name, shape_str(t.shape),
           dtype_name(t.dtype), need ? std::to_string(*need) : std::string("more than 2^63"), t.nbytes);
    if (t.nbytes && !t.data) fail("safetensors: write: tensor '{}': {} bytes but no data", t.name, t.nbytes);
    plan.push_back({t.name, t.dtype, t.shape});
    offset += t.nbytes;
  }
  const std::string header = safetensors_header(plan, metadata);  // names, offsets, metadata, padding
  std::string out;
  out.reserve(8 + header.size() + offset);
  for (int i = 0; i < 8; ++i) out.push_back(char(uint64_t(header.size()) >> (8 * i) & 0xff));
  out += header;
  for (const auto& t : tensors)
    if (t.nbytes) out.append(static_cast<const char*>(t.data), t.nbytes);
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors, const json& metadata) {
  const std::string bytes = serialize_safetensors(tensors, metadata);
  const std::string tmp = fmt::format("{}.tmp{}", path, ::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("safetensors: cannot create {}: {}", tmp, std::strerror(errno));
  size_t wrote = std::fwrite(bytes.data(), 1, bytes.size(), f);
  int werr = errno;
  if (std::fclose(f) != 0 && wrote == bytes.size()) werr = errno, wrote = 0;
  if (wrote != bytes.size()) {
    std::remove(tmp.c_str());
    fail("safetensors: cannot write {} ({} bytes): {}", path, bytes.size(), std::strerror(werr));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    fail("safetensors: cannot rename {} to {}: {}", tmp, path, std::strerror(e));
  }
}

}  // namespace arbor
