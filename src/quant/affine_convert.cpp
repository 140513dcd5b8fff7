// Dense checkpoint -> MLX affine checkpoint, one tensor at a time.
#include "quant/affine_convert.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"

namespace arbor::quant {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const char* const kAffineConvertCopiedFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
    "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
    nullptr};

AffineRecipe parse_affine_recipe(std::string_view name) {
  if (name.empty()) return AffineRecipe::None;
  for (AffineRecipe r : {AffineRecipe::Mixed_2_6, AffineRecipe::Mixed_3_4, AffineRecipe::Mixed_3_6, AffineRecipe::Mixed_4_6})
    if (affine_recipe_name(r) == name) return r;
  fail("quantize: unknown recipe '{}' (mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6)", name);
}

std::string_view affine_recipe_name(AffineRecipe r) {
  switch (r) {
    case AffineRecipe::Mixed_2_6: return "mixed_2_6";
    case AffineRecipe::Mixed_3_4: return "mixed_3_4";
    case AffineRecipe::Mixed_3_6: return "mixed_3_6";
    case AffineRecipe::Mixed_4_6: return "mixed_4_6";
    default: return "";
  }
}

RecipeBits affine_recipe_bits(AffineRecipe r) {
  switch (r) {
    case AffineRecipe::Mixed_2_6: return {2, 6};
    case AffineRecipe::Mixed_3_4: return {3, 4};
    case AffineRecipe::Mixed_3_6: return {3, 6};
    case AffineRecipe::Mixed_4_6: return {4, 6};
    default: return {};
  }
}

namespace {

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> out;
  size_t a = 0;
  for (;;) {
    size_t b = s.find('.', a);
    out.push_back(s.substr(a, b == std::string_view::npos ? std::string_view::npos : b - a));
    if (b == std::string_view::npos) return out;
    a = b + 1;
  }
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(uint8_t(c)); });
}

bool contains(std::string_view s, std::string_view sub) { return s.find(sub) != std::string_view::npos; }

}  // namespace

AffineParams affine_recipe_params(AffineRecipe r, std::string_view path, int layer_location, int n, int group_size) {
  const RecipeBits b = affine_recipe_bits(r);
  const auto parts = split_dots(path);
  int index = 0;
  if (int(parts.size()) > layer_location) {
    if (!all_digits(parts[size_t(layer_location)]))
      fail("quantize: recipe {}: module '{}' has '{}' where the layer index goes (part {})", affine_recipe_name(r), path,
           parts[size_t(layer_location)], layer_location);
    index = std::stoi(std::string(parts[size_t(layer_location)]));
  }
  const bool more = index < n / 8 || index >= 7 * n / 8 || (index - n / 8) % 3 == 2;
  const bool v = contains(path, "v_proj") || contains(path, "v_a_proj") || contains(path, "v_b_proj");
  if ((v && more) || (contains(path, "down_proj") && more) || contains(path, "lm_head")) return {group_size, b.high};
  return {group_size, b.low};
}

namespace {

// The dtype mlx_lm.convert casts float tensors to: torch_dtype, else text_config.dtype, when one of the three.
std::optional<DType> convert_dtype(const ojson& cfg) {
  const ojson* d = nullptr;
  if (auto it = cfg.find("torch_dtype"); it != cfg.end() && !it->is_null()) d = &*it;
  else if (auto tc = cfg.find("text_config"); tc != cfg.end() && tc->is_object())
    if (auto it2 = tc->find("dtype"); it2 != tc->end()) d = &*it2;
  if (!d || !d->is_string()) return std::nullopt;
  const std::string s = d->get<std::string>();
  if (s == "float16") return DType::F16;
  if (s == "bfloat16") return DType::BF16;
  if (s == "float32") return DType::F32;
  return std::nullopt;
}

// Drops the pages of an input tensor from this process once it is written (they stay in the page cache), so that
// the resident set holds about one tensor of the mapped checkpoint, not all of it.
void release_pages(const uint8_t* p, size_t n) {
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = (uintptr_t(p) + page - 1) & ~(page - 1), e = (uintptr_t(p) + n) & ~(page - 1);
  if (e > a) ::madvise(reinterpret_cast<void*>(a), e - a, MADV_DONTNEED);
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

struct Item {
  const TensorInfo* src = nullptr;
  std::string name;   // the source tensor
  bool quantize = false;
  AffineParams p;
  std::optional<TrellisConfig> trellis;  // the trellis path: this matrix's coding
  DType dtype = DType::F32;  // output dtype of the dense tensor, or of scales and biases
};

// Converts a dense float tensor to `to` (round to nearest even), into out.
void convert_dense(const TensorInfo& t, DType to, std::vector<uint8_t>& out) {
  const int64_t n = t.numel();
  out.resize(size_t(n) * dtype_size(to));
  for (int64_t i = 0; i < n; ++i) {
    const float x = load_float(t.data, t.dtype, i);
    if (to == DType::F32) std::memcpy(out.data() + 4 * i, &x, 4);
    else {
      const uint16_t h = to == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
}

}  // namespace

AffineConvertStats affine_convert_checkpoint(const AffineConvertOptions& o, const std::function<void(uint64_t)>& progress,
                                             ThreadPool* pool) {
  if (o.trellis) check_trellis_recipe(*o.trellis, "quantize");
  else check_affine_params(o.params, "quantize");
  if (fs::exists(o.out_dir) && !(fs::is_directory(o.out_dir) && fs::is_empty(o.out_dir)))
    fail("quantize: {} already exists and is not an empty directory; name a new one", o.out_dir);
  if (fs::exists(o.out_dir) && fs::equivalent(o.out_dir, o.in_dir)) fail("quantize: --out is the input directory");
  Checkpoint ck = Checkpoint::open(o.in_dir);
  const std::string cfg_path = o.in_dir + "/config.json";
  ojson cfg;
  try {
    cfg = ojson::parse(read_text_file(cfg_path));
  } catch (const ojson::parse_error& e) {
    fail("json: {}: {}", cfg_path, e.what());
  }
  if (!cfg.is_object()) fail("quantize: {} is not a JSON object", cfg_path);
  if (cfg.contains("quantization") || cfg.contains("quantization_config"))
    fail("quantize: {} already holds a quantization block; arbor quantize takes a dense checkpoint", cfg_path);
  const std::optional<DType> cast = convert_dtype(cfg);

  // Recipe: the layer index position, from the first down_proj module.
  int layer_location = 0;
  if (o.recipe != AffineRecipe::None) {
    const AffineConvertOptions::Tensor* down = nullptr;
    for (const auto& t : o.tensors)
      if (contains(t.name, "down_proj")) {
        down = &t;
        break;
      }
    if (!down) fail("quantize: recipe {} needs down_proj modules; this model has none", affine_recipe_name(o.recipe));
    const auto parts = split_dots(down->name);
    layer_location = int(parts.size());
    for (size_t i = 0; i < parts.size(); ++i)
      if (all_digits(parts[i])) {
        layer_location = int(i);
        break;
      }
  }

  // The plan: every output tensor with its dtype and shape, decided before a byte is written.
  std::vector<Item> items;
  std::vector<TensorHeader> plan;
  AffineConvertStats st;
  ojson quant = ojson::object();
  quant["group_size"] = o.params.group_size;
  quant["bits"] = o.params.bits;
  quant["mode"] = "affine";
  std::vector<std::pair<std::string, TrellisConfig>> trellis_modules;
  std::set<std::string> wanted;
  for (const auto& t : o.tensors) {
    wanted.insert(t.name);
    const TensorInfo& src = ck.take(t.name);
    if (src.shape != t.shape)
      fail("quantize: {}: tensor '{}' has shape {}, the model expects {}", src.file, t.name, shape_str(src.shape), shape_str(t.shape));
    Item it;
    it.src = &src;
    it.name = t.name;
    it.dtype = is_float(src.dtype) && cast ? *cast : src.dtype;
    const bool weight = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
    if (weight && src.shape.size() == 2 && is_float(src.dtype)) {
      const std::string module = t.name.substr(0, t.name.size() - 7);
      std::string why;
      if (o.trellis) {
        it.trellis = trellis_recipe_config(*o.trellis, module, src.shape[0], src.shape[1], &why);
        if (it.trellis) {
          it.quantize = true;
          plan.push_back({module + ".weight", DType::U32, trellis_weight_shape(*it.trellis, src.shape[0], src.shape[1])});
          plan.push_back({module + ".scales", DType::F16, trellis_scales_shape(*it.trellis, src.shape[0], src.shape[1])});
          trellis_modules.emplace_back(module, *it.trellis);
          st.modules_quantized++;
        } else {
          st.left_dense.push_back(fmt::format("{}: {}", t.name, why));
        }
      } else if (src.shape[1] % o.params.group_size != 0) {
        st.left_dense.push_back(fmt::format("{}: a row of {} values does not divide into groups of {}", t.name, src.shape[1],
                                            o.params.group_size));
      } else {
        it.quantize = true;
        it.p = o.params;
        if (o.recipe != AffineRecipe::None) {
          it.p = affine_recipe_params(o.recipe, module, layer_location, o.num_layers, o.params.group_size);
          quant[module] = {{"group_size", it.p.group_size}, {"bits", it.p.bits}, {"mode", "affine"}};
        }
        const AffineShape s = affine_shape(src.shape[0], src.shape[1], it.p, fmt::format("quantize: tensor '{}'", t.name));
        plan.push_back({module + ".weight", DType::U32, {s.rows, s.words_per_row()}});
        plan.push_back({module + ".scales", it.dtype, {s.rows, s.groups_per_row()}});
        plan.push_back({module + ".biases", it.dtype, {s.rows, s.groups_per_row()}});
        st.modules_quantized++;
      }
    }
    if (!it.quantize) plan.push_back({t.name, it.dtype, src.shape});
    st.bytes_in += src.nbytes;
    items.push_back(std::move(it));
  }
  for (const TensorInfo* t : ck.tensors())
    if (!wanted.count(t->name)) st.dropped.push_back(t->name);

  // Parameters, counted as mlx-lm's get_total_parameters does (the unquantized element count).
  uint64_t params = 0;
  for (const auto& it : items) params += uint64_t(it.src->numel());
  fs::create_directories(o.out_dir);
  ShardedSafetensorsWriter w(o.out_dir, plan, o.shard_bytes, json{{"format", "mlx"}}, json{{"total_parameters", params}},
                             /*always_index=*/true);
  std::vector<uint8_t> dense;
  std::vector<uint32_t> packed;
  std::vector<uint8_t> scales, biases;
  std::vector<float> f32;
  for (const auto& it : items) {
    const TensorInfo& src = *it.src;
    if (it.trellis) {
      const std::string module = it.name.substr(0, it.name.size() - 7);
      const int64_t out = src.shape[0], in = src.shape[1];
      f32.resize(size_t(out * in));
      for (int64_t i = 0; i < out * in; ++i) f32[size_t(i)] = load_float(src.data, src.dtype, i);
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<double>* h = o.input_hessian ? o.input_hessian(module) : nullptr;
      const TrellisEncoded e =
          h ? trellis_encode_linear_ldlq(it.name, f32.data(), out, in, it.trellis->bits, it.trellis->axis, *h, pool, o.encode, o.ldlq)
            : trellis_encode_linear(it.name, f32.data(), out, in, it.trellis->bits, it.trellis->axis, pool, o.encode);
      st.modules_ldlq += h ? 1 : 0;
      st.encode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      st.weights_encoded += uint64_t(out * in);
      w.write(module + ".weight", e.words.data(), e.words.size() * 4);
      w.write(module + ".scales", e.scales.data(), e.scales.size() * 2);
      st.tensors_written += 2;
    } else if (it.quantize) {
      const std::string module = it.name.substr(0, it.name.size() - 7);
      const AffineShape s{src.shape[0], src.shape[1], it.p};
      packed.assign(size_t(s.rows * s.words_per_row()), 0);
      scales.resize(size_t(s.rows * s.groups_per_row()) * dtype_size(it.dtype));
      biases.resize(scales.size());
      affine_quantize(src.data, src.dtype, s, packed.data(), scales.data(), biases.data(), it.dtype,
                      fmt::format("quantize: tensor '{}'", it.name), pool);
      w.write(module + ".weight", packed.data(), packed.size() * 4);
      w.write(module + ".scales", scales.data(), scales.size());
      w.write(module + ".biases", biases.data(), biases.size());
      st.tensors_written += 3;
    } else if (is_float(src.dtype) && it.dtype != src.dtype) {
      convert_dense(src, it.dtype, dense);
      w.write(it.name, dense.data(), dense.size());
      st.tensors_written++;
    } else {
      w.write(it.name, src.data, src.nbytes);
      st.tensors_written++;
    }
    release_pages(src.data, src.nbytes);
    if (progress) progress(src.nbytes);
  }
  // Give the buffers back before the next steps (they held the largest tensor).
  std::vector<uint32_t>().swap(packed);
  std::vector<uint8_t>().swap(dense);
  std::vector<float>().swap(f32);
  w.finish();
  st.bytes_out = w.total_bytes();
  st.shards = w.shard_count();

  // config.json as mlx-lm's save_config writes it: _name_or_path and vision_config dropped, the generation
  // config's eos_token_id when it has one, quantization and quantization_config, keys sorted, indent 4.
  cfg.erase("_name_or_path");
  cfg.erase("vision_config");
  const std::string gen = o.in_dir + "/generation_config.json";
  if (file_exists(gen)) {
    try {
      ojson g = ojson::parse(read_text_file(gen));
      if (g.is_object())
        if (auto e = g.find("eos_token_id"); e != g.end() && !e->is_null() && *e != false && *e != 0 &&
                                              !(e->is_array() && e->empty()))
          cfg["eos_token_id"] = *e;
    } catch (const ojson::parse_error&) {  // mlx-lm ignores a generation config it cannot parse
    }
  }
  if (o.trellis) quant = ojson::parse(trellis_quant_block(o.trellis->bits, trellis_modules).dump());
  cfg["quantization"] = quant;
  cfg["quantization_config"] = quant;
  std::vector<std::string> keys;
  for (auto it = cfg.begin(); it != cfg.end(); ++it) keys.push_back(it.key());
  std::sort(keys.begin(), keys.end());
  ojson sorted = ojson::object();
  for (const auto& k : keys) sorted[k] = cfg[k];
  {
    std::ofstream f(o.out_dir + "/config.json");
    f << sorted.dump(4) << "\n";
    if (!f) fail("quantize: cannot write {}/config.json", o.out_dir);
  }
  for (const char* const* n = kAffineConvertCopiedFiles; *n; ++n) {
    const std::string from = o.in_dir + "/" + *n;
    if (!file_exists(from)) continue;
    std::error_code ec;
    fs::copy_file(from, o.out_dir + "/" + *n, fs::copy_options::overwrite_existing, ec);
    if (ec) fail("quantize: cannot copy {} to {}: {}", from, o.out_dir, ec.message());
    st.copied_files.push_back(*n);
  }
  return st;
}

}  // namespace arbor::quant
