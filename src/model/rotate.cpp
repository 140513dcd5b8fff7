// The residual-stream rotation (model/rotate.h): each tensor of the walk read as f32, transformed by its role,
// and streamed into the new checkpoint.
#include "model/rotate.h"

#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "core/json.h"
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/archs.h"
#include "model/config.h"
#include "model/weights.h"
#include "quant/affine_convert.h"
#include "quant/trellis_convert.h"

namespace arbor {
namespace {

using quant::module_matches;

std::vector<float> read_f32(const TensorInfo& t) {
  ARBOR_CHECK(float_dtype(t.dtype), "rotate: tensor '{}' is {}; rotation needs a dense checkpoint (F32, F16 or BF16)", t.name,
              dtype_name(t.dtype));
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_float(t.data, t.dtype, int64_t(i));
  return v;
}

}  // namespace

std::vector<float> rotation_signs(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<float> s(static_cast<size_t>(n));
  for (float& x : s) x = (rng() >> 63) ? -1.0f : 1.0f;
  return s;
}

void rotate_vector(float* v, int64_t n, const std::vector<float>& signs) {
  ARBOR_CHECK(n > 0 && (n & (n - 1)) == 0 && int64_t(signs.size()) == n, "rotate: length {} is not a power of two with {} signs", n,
              signs.size());
  std::vector<double> d(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d[size_t(i)] = double(v[i]) * double(signs[size_t(i)]);
  for (int64_t h = 1; h < n; h <<= 1)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const double a = d[size_t(j)], b = d[size_t(j + h)];
        d[size_t(j)] = a + b, d[size_t(j + h)] = a - b;
      }
  const double inv = 1.0 / std::sqrt(double(n));
  for (int64_t i = 0; i < n; ++i) v[i] = float(d[size_t(i)] * inv);
}

RotateStats rotate_residual_checkpoint(const std::string& in_dir, const std::string& out_dir, uint64_t seed,
                                       const std::function<void(uint64_t)>& progress) {
  json cj = read_json_file(in_dir + "/config.json");
  ModelConfig c = parse_model_config(cj, in_dir + "/config.json");
  const ArchDescriptor& a = find_arch(c);
  apply_arch_defaults(c, a);
  ARBOR_CHECK(!cj.contains("quantization") && !cj.contains("quantization_config"),
              "rotate: {} is quantized; rotation reads a dense checkpoint", in_dir);
  ARBOR_CHECK(a.block == BlockKind::PreNorm && a.norm == NormKind::RMS,
              "rotate: model_type '{}' is not a pre-norm RMSNorm model; the rotation folds exactly only into those", a.model_type);
  const int64_t n = c.hidden_size;
  ARBOR_CHECK(n > 0 && (n & (n - 1)) == 0, "rotate: hidden_size {} is not a power of two (the rotation is a Walsh-Hadamard one)", n);
  const std::vector<float> signs = rotation_signs(n, seed);
  Checkpoint ck = Checkpoint::open(in_dir);

  // Roles by module path: a linear reading the normed stream (which norm's weight it folds) or writing into it.
  const TensorNames& nm = a.names;
  const std::string final_norm_w = nm.final_norm + ".weight";
  auto reads_norm = [&](const std::string& module) -> std::string {  // the norm weight to fold, or ""
    for (const std::string* s : {&nm.q, &nm.k, &nm.v, &nm.qkv})
      if (module_matches(module, *s)) return module.substr(0, module.size() - s->size()) + nm.attn_norm + ".weight";
    for (const std::string* s : {&nm.gate, &nm.up, &nm.gate_up})
      if (module_matches(module, *s)) return module.substr(0, module.size() - s->size()) + nm.mlp_norm + ".weight";
    if (module + ".weight" == nm.lm_head) return final_norm_w;
    return "";
  };
  auto writes_stream = [&](const std::string& module) { return module_matches(module, nm.o) || module_matches(module, nm.down); };
  auto is_stream_norm = [&](const std::string& name) {
    return name == final_norm_w || module_matches(name, nm.attn_norm + ".weight") ||
           module_matches(name, nm.mlp_norm + ".weight");
  };

  std::vector<TensorHeader> plan;
  for (const TensorSpec& s : expected_tensors(c, a)) plan.push_back({s.name, DType::F32, s.shape});
  RotateStats st;
  st.untied = c.tie_word_embeddings;
  if (st.untied) plan.push_back({nm.lm_head, DType::F32, {c.vocab_size, n}});
  std::filesystem::create_directories(out_dir);
  ShardedSafetensorsWriter w(out_dir, plan, uint64_t(5) << 30);

  auto rotate_rows = [&](std::vector<float>& v, int64_t rows, int64_t cols, const std::vector<float>* fold) {
    ARBOR_CHECK(cols == n, "rotate: a matrix of {} columns where the hidden size {} was expected", cols, n);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = v.data() + r * cols;
      if (fold)
        for (int64_t i = 0; i < cols; ++i) row[i] *= (*fold)[size_t(i)];
      rotate_vector(row, cols, signs);
    }
  };
  auto rotate_cols = [&](std::vector<float>& v, int64_t rows, int64_t cols) {
    ARBOR_CHECK(rows == n, "rotate: a matrix of {} rows where the hidden size {} was expected", rows, n);
    std::vector<float> col(static_cast<size_t>(rows));
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t i = 0; i < rows; ++i) col[size_t(i)] = v[size_t(i * cols + j)];
      rotate_vector(col.data(), rows, signs);
      for (int64_t i = 0; i < rows; ++i) v[size_t(i * cols + j)] = col[size_t(i)];
    }
  };
  const std::string embed_module = nm.embed.substr(0, nm.embed.size() - 7);
  for (const TensorHeader& t : plan) {
    const bool extra_head = st.untied && t.name == nm.lm_head;
    const TensorInfo& src = ck.take(extra_head ? nm.embed : t.name);
    ARBOR_CHECK(src.shape == t.shape, "rotate: tensor '{}' has shape [{}], the config expects [{}]", src.name, fmt::join(src.shape, ", "),
                fmt::join(t.shape, ", "));
    std::vector<float> v = read_f32(src);
    const bool weight = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
    const std::string module = weight ? t.name.substr(0, t.name.size() - 7) : "";
    const std::string gname = t.shape.size() == 2 ? reads_norm(module) : "";  // the head (tied or not) folds the final norm
    if (t.shape.size() == 2 && module == embed_module) {
      rotate_rows(v, t.shape[0], t.shape[1], nullptr);
    } else if (!gname.empty()) {
      const TensorInfo* gt = ck.find(gname);
      ARBOR_CHECK(gt && gt->numel() == n, "rotate: '{}' needs the norm weight '{}' of {} values", t.name, gname, n);
      const std::vector<float> g = read_f32(*gt);
      rotate_rows(v, t.shape[0], t.shape[1], &g);
    } else if (t.shape.size() == 2 && writes_stream(module)) {
      rotate_cols(v, t.shape[0], t.shape[1]);
    } else if (t.shape.size() == 1 && t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0 &&
               writes_stream(t.name.substr(0, t.name.size() - 5))) {
      rotate_vector(v.data(), n, signs);  // b·Q
    } else if (t.shape.size() == 1 && is_stream_norm(t.name)) {
      std::fill(v.begin(), v.end(), 1.0f);  // folded into the linears that read it
    } else {
      ARBOR_CHECK(t.shape.size() == 1, "rotate: matrix '{}' has no role in the residual stream this rotation knows", t.name);
    }
    w.write(t.name, v.data(), v.size() * 4);
    ++st.tensors;
    if (progress) progress(src.nbytes);
  }
  w.finish();

  cj["tie_word_embeddings"] = false;
  if (cj.contains("text_config") && cj["text_config"].is_object()) cj["text_config"]["tie_word_embeddings"] = false;
  // Written in f32, but the quantizer casts what it leaves dense to torch_dtype: name the source's dtype there
  // when the config only has transformers 5's "dtype" (or nothing), so the dense tensors come back in it.
  if (!cj.contains("torch_dtype") || cj["torch_dtype"].is_null()) {
    const DType d = ck.find(nm.embed) ? ck.find(nm.embed)->dtype : DType::F32;
    cj["torch_dtype"] = d == DType::BF16 ? "bfloat16" : d == DType::F16 ? "float16" : "float32";
  }
  {
    std::ofstream f(out_dir + "/config.json");
    f << cj.dump(2) << "\n";
    ARBOR_CHECK(f.good(), "rotate: cannot write {}/config.json", out_dir);
  }
  for (const char* const* p = quant::kAffineConvertCopiedFiles; *p; ++p) {
    const std::filesystem::path from = std::filesystem::path(in_dir) / *p;
    if (std::filesystem::exists(from))
      std::filesystem::copy_file(from, std::filesystem::path(out_dir) / *p, std::filesystem::copy_options::overwrite_existing);
  }
  return st;
}

}  // namespace arbor
