// Model loading (checkpoint or dummy weights) and the universal decoder forward.
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/synth.h"
#include "quant/affine.h"
#include "quant/affine_synth.h"
#include "quant/trellis_convert.h"

namespace arbor {

namespace {

std::string join_path(const std::string& dir, const std::string& f) { return dir.empty() ? f : dir + "/" + f; }

NormOp to_norm_op(NormKind k) {
  switch (k) {
    case NormKind::RMS: return NormOp::RMS;
    case NormKind::RMSPlusOne: return NormOp::RMSPlusOne;
    case NormKind::LayerNorm: return NormOp::LayerNorm;
  }
  return NormOp::RMS;
}

ActOp to_act_op(Activation a) {
  switch (a) {
    case Activation::SiLU: return ActOp::SiLU;
    case Activation::GeLU: return ActOp::GeLU;
    case Activation::GeLUTanh: return ActOp::GeLUTanh;
  }
  return ActOp::SiLU;
}

// Rows [0, n) of a [rows, cols] activation buffer.
Tensor first_rows(const Tensor& t, int64_t n) { return t.row_slice(0, n); }

}  // namespace

std::string DummyQuant::describe() const {
  if (format == WeightFormat::Affine) return fmt::format("affine {}-bit g{}", affine.bits, affine.group_size);
  if (format == WeightFormat::Trellis) return fmt::format("trellis {}-bit", trellis_bits);
  return weight_format_name(format);
}

Model::~Model() = default;

std::vector<std::pair<std::string, const Linear*>> Model::matrix_modules() const {
  std::vector<std::pair<std::string, const Linear*>> out;
  // The walk only points into the weights (their layers are sized), it does not change them.
  for_each_weight(cfg_, *arch_, const_cast<ModelWeights*>(&w_), [&](const WeightSlot& s) {
    if (s.kind != WeightSlot::Kind::Matrix) return;
    for (const auto& [l, rows] : s.parts) out.emplace_back(s.name, l);
  });
  return out;
}

Model::Model(const LoadOptions& opt, Backend& backend) : backend_(backend) {
  std::string cfg_path = !opt.config_path.empty() ? opt.config_path : join_path(opt.model_dir, "config.json");
  cfg_ = load_model_config(cfg_path);
  arch_ = &find_arch(cfg_);
  apply_arch_defaults(cfg_, *arch_);
  const ModelConfig& c = cfg_;
  const ArchDescriptor& a = *arch_;

  // Weights: from the checkpoint (every tensor consumed, shapes checked) or generated.
  std::map<std::string, uint64_t> dtype_bytes;
  const std::string embed_module = a.names.embed.substr(0, a.names.embed.rfind('.'));  // "model.embed_tokens"
  auto account = [&](const std::string& name, DType t, uint64_t bytes) {
    dtype_bytes[std::string(dtype_name(t))] += bytes;
    if (name.compare(0, embed_module.size() + 1, embed_module + ".") == 0) embed_bytes_ += bytes;
  };
  auto host_tensor = [](void* data, DType t, const std::vector<int64_t>& shape) {
    Tensor out(data, t, {});
    out.ndim = int(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) out.shape[i] = shape[i];
    return out;
  };
  std::function<Tensor(const TensorSpec&)> get;
  std::unique_ptr<ThreadPool> fill_pool;  // all cores generate dummy weights (an 8B model: 39 -> 9 s)
  // MLX affine weights: config.json's quantization block (or --dummy-weights --bits's), and a matrix is affine
  // when its .scales is stored (generated).
  std::optional<quant::AffineQuantConfig> affine;
  QuantizedSource quantized;
  std::set<std::string, std::less<>> dummy_affine;  // modules --dummy-weights quantizes
  struct DummyTrellis {
    quant::TrellisConfig cfg;
    int64_t out = 0, in = 0;
  };
  std::map<std::string, DummyTrellis, std::less<>> dummy_trellis;  // modules --dummy-weights trellis-codes
  if (opt.dummy_weights) {
    fill_pool = std::make_unique<ThreadPool>(0);
    const DummyQuant& dq = opt.dummy_quant;
    if (dq.format == WeightFormat::Trellis) {  // what arbor synth --format trellis writes, module by module
      const quant::TrellisRecipe r = trellis_arch_recipe(a, dq.trellis_bits, dq.trellis_down_axis, dq.trellis_axis);
      quant::check_trellis_recipe(r, "model: dummy weights");
      affine.emplace();
      for_each_weight(c, a, nullptr, [&](const WeightSlot& s) {
        if (s.kind != WeightSlot::Kind::Matrix) return;
        if (const std::optional<quant::TrellisConfig> tc = quant::trellis_recipe_config(r, s.name, s.rows, s.cols)) {
          affine->trellis[s.name] = *tc;
          dummy_trellis[s.name] = {*tc, s.rows, s.cols};
        }
      });
      quantized.affine = &*affine;
      quantized.has = [&](const std::string& name) {  // asked for "<module>.scales" and "<module>.biases"
        const size_t dot = name.rfind('.');
        return dot != std::string::npos && std::string_view(name).substr(dot) == ".scales" &&
               dummy_trellis.count(std::string_view(name).substr(0, dot)) > 0;
      };
    }
    if (dq.format == WeightFormat::Affine) {
      quant::check_affine_params(dq.affine, "model: dummy weights");
      affine = quant::AffineQuantConfig{dq.affine, {}, {}, std::nullopt};
      for_each_weight(c, a, nullptr, [&](const WeightSlot& s) {
        if (s.kind == WeightSlot::Kind::Matrix && quant::affine_synth_quantizes(s.cols, dq.affine)) dummy_affine.insert(s.name);
      });
      quantized.affine = &*affine;
      quantized.has = [&](const std::string& name) {  // asked for "<module>.scales" and "<module>.biases"
        const size_t dot = name.rfind('.');
        return dot != std::string::npos && dummy_affine.count(std::string_view(name).substr(0, dot)) > 0;
      };
    }
    get = [&](const TensorSpec& s) {
      // A quantized matrix's part: "<module>.weight" (codes), ".scales" or ".biases", as synth would write it.
      const size_t dot = s.name.rfind('.');
      const std::string_view module = std::string_view(s.name).substr(0, dot == std::string::npos ? 0 : dot);
      const std::string_view part = std::string_view(s.name).substr(dot == std::string::npos ? s.name.size() : dot);
      int64_t n = 1;
      for (auto d : s.shape) n *= d;
      if (part == ".weight" || part == ".scales") {
        if (const auto it = dummy_trellis.find(module); it != dummy_trellis.end()) {
          const DummyTrellis& t = it->second;
          const bool words = part == ".weight";
          const DType dt = words ? DType::U32 : DType::F16;
          const size_t bytes = size_t(n) * dtype_size(dt);
          dummy_.emplace_back(new uint8_t[bytes]);
          void* out = dummy_.back().get();
          quant::trellis_synth_matrix(std::string(module) + ".weight", t.cfg, t.out, t.in, words ? static_cast<uint32_t*>(out) : nullptr,
                                      words ? nullptr : static_cast<uint16_t*>(out), fill_pool.get());
          account(s.name, dt, bytes);
          return host_tensor(out, dt, s.shape);
        }
      }
      if ((part == ".weight" || part == ".scales" || part == ".biases") && dummy_affine.count(module)) {
        const quant::AffineParams& p = dq.affine;
        const bool codes = part == ".weight";
        const int64_t cols = codes ? s.shape[1] * 32 / p.bits : s.shape[1] * p.group_size;
        const quant::AffineShape shape{s.shape[0], cols, p};
        const DType t = codes ? DType::U32 : opt.dummy_dtype;
        const size_t bytes = size_t(n) * dtype_size(t);
        dummy_.emplace_back(new uint8_t[bytes]);
        void* out = dummy_.back().get();
        quant::affine_synth_matrix(std::string(module) + ".weight", shape, opt.dummy_dtype,
                                   codes ? static_cast<uint32_t*>(out) : nullptr, part == ".scales" ? out : nullptr,
                                   part == ".biases" ? out : nullptr, fill_pool.get());
        account(s.name, t, bytes);
        return host_tensor(out, t, s.shape);
      }
      const size_t bytes = size_t(n) * dtype_size(opt.dummy_dtype);
      dummy_.emplace_back(new uint8_t[bytes]);
      fill_dummy(s, a, opt.dummy_dtype, dummy_.back().get(), fill_pool.get());
      account(s.name, opt.dummy_dtype, bytes);
      return host_tensor(dummy_.back().get(), opt.dummy_dtype, s.shape);
    };
  } else {
    ckpt_ = std::make_unique<Checkpoint>(Checkpoint::open(opt.model_dir));
    if (opt.show_progress && ckpt_->total_bytes() > (uint64_t(256) << 20)) {
      Progress prog("loading weights", ckpt_->total_bytes());
      ckpt_->prefault([&](uint64_t n) { prog.advance(n); });
    }
    get = [&](const TensorSpec& s) {
      const TensorInfo& ti = ckpt_->take(s.name);
      ARBOR_CHECK(ti.shape == s.shape, "model: {}: tensor '{}' has shape [{}], {} expects [{}]", ti.file, s.name,
                  fmt::join(ti.shape, ", "), c.model_type, fmt::join(s.shape, ", "));
      ARBOR_CHECK(ti.dtype == DType::F32 || ti.dtype == DType::F16 || ti.dtype == DType::BF16 || ti.dtype == DType::U32,
                  "model: {}: tensor '{}' has dtype {}; supported: F32, F16, BF16 (U32: affine or trellis codes)", ti.file, s.name,
                  dtype_name(ti.dtype));
      account(s.name, ti.dtype, ti.nbytes);
      return host_tensor(const_cast<uint8_t*>(ti.data), ti.dtype, s.shape);
    };
    affine = quant::parse_affine_quant_config(read_json_file(cfg_path), cfg_path);
    quantized.affine = affine ? &*affine : nullptr;
    quantized.has = [&](const std::string& name) { return ckpt_->find(name) != nullptr; };
    quantized.shape = [&](const std::string& name) {  // trellis: the stored layout (k = 3 axis 0 may be interleaved)
      const TensorInfo* t = ckpt_->find(name);
      return t ? t->shape : std::vector<int64_t>{};
    };
  }
  // Parameters are weights, whatever their storage: a quantized matrix counts rows x cols, not its packed words.
  for (const TensorSpec& s : expected_tensors(c, a)) {
    uint64_t n = 1;
    for (auto d : s.shape) n *= uint64_t(d);
    param_count_ += n;
  }
  w_ = bind_weights(c, a, get, backend_, quantized);
  if (!backend_.views_host_weights()) dummy_.clear();  // the backend holds its own copies
  if (ckpt_) {
    // Tied checkpoints sometimes also store lm_head.weight (a copy of the embedding); transformers
    // ignores it when tie_word_embeddings is set, and so do we.
    if (c.tie_word_embeddings) {
      ckpt_->take_optional(a.names.lm_head);
      const std::string& h = a.names.lm_head;  // "<module>.weight"; a quantized copy has .scales and .biases too
      if (h.size() > 7 && h.compare(h.size() - 7, 7, ".weight") == 0) {
        const std::string head = h.substr(0, h.size() - 7);
        ckpt_->take_optional(head + ".scales"), ckpt_->take_optional(head + ".biases");
      }
    }
    ckpt_->check_all_consumed();
  }
  for (auto& [name, bytes] : dtype_bytes) {
    weight_bytes_ += bytes;
    weight_dtypes_ += (weight_dtypes_.empty() ? "" : ", ") + name;
  }
  {
    std::map<std::string, int> formats;  // "affine 4-bit g64" -> matrices (a fused qkv counts its parts)
    auto count = [&](const Linear& l) {
      if (l.empty()) return;
      const std::string d = l.describe();
      formats[d.substr(0, d.rfind(" ["))]++;
    };
    count(w_.embed);
    for (const LayerWeights& L : w_.layers)
      for (const Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) count(*l);
    if (!c.tie_word_embeddings) count(w_.lm_head);
    std::vector<std::pair<std::string, int>> by_count(formats.begin(), formats.end());
    std::stable_sort(by_count.begin(), by_count.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
    for (const auto& [f, n] : by_count) weight_formats_ += fmt::format("{}{} x{}", weight_formats_.empty() ? "" : ", ", f, n);
  }

  norm_op_ = to_norm_op(a.norm);
  act_op_ = to_act_op(parse_activation(c.hidden_act, a.default_act, cfg_path));
  embed_scale_ = float(c.embedding_multiplier) * (a.scale_embeddings ? std::sqrt(float(c.hidden_size)) : 1.0f);

  ctx_size_ = opt.ctx_size > 0 ? opt.ctx_size : std::min<int64_t>(c.max_position, 4096);
  max_step_tokens_ = std::max<int64_t>(1, opt.max_step_tokens);

  // Attention scale: Granite's attention_multiplier, Gemma's query_pre_attn_scalar, else 1/sqrt(d).
  AttentionParams ap;
  ap.n_heads = c.n_heads, ap.n_kv_heads = c.n_kv_heads, ap.head_dim = c.head_dim;
  ap.scale = c.attention_multiplier > 0     ? float(c.attention_multiplier)
             : c.query_pre_attn_scalar > 0 ? float(1.0 / std::sqrt(c.query_pre_attn_scalar))
                                            : float(1.0 / std::sqrt(double(c.head_dim)));
  ap.softcap = float(c.attn_logit_softcap);
  attn_full_ = ap;
  attn_sliding_ = ap;
  attn_sliding_.window = c.sliding_window;

  // Rope tables for every position up to ctx_size, computed once here and put on the device. With a
  // longrope rope the tables hold two regimes, [2 ctx_size, rot/2]: rows [0, ctx) the default regime,
  // rows [ctx, 2 ctx) the long one (a table without a long regime repeats its rows there), and a
  // sequence in the long regime reads row ctx + position (forward: rope_rows).
  rope_full_ = RopeTable(c.rope, c.rotary_dim(), c.max_position);
  rope_local_ = RopeTable(c.rope_local, c.rotary_dim(), c.max_position);
  const int64_t regimes = rope_full_.has_long_regime() || rope_local_.has_long_regime() ? 2 : 1;
  auto make_tables = [&](RopeTable& table, Tensor& cos, Tensor& sin) {
    table.ensure(ctx_size_);
    const int64_t half = c.rotary_dim() / 2;
    std::vector<float> hc(size_t(regimes * ctx_size_ * half)), hs(hc.size());
    for (int64_t r = 0; r < regimes; ++r) {
      const bool long_regime = r == 1 && table.has_long_regime();
      for (int64_t p = 0; p < ctx_size_; ++p) {
        const int64_t row = r * ctx_size_ + p;
        std::memcpy(hc.data() + row * half, table.cos(p, long_regime), size_t(half) * sizeof(float));
        std::memcpy(hs.data() + row * half, table.sin(p, long_regime), size_t(half) * sizeof(float));
      }
    }
    cos = backend_.upload_table(hc, {regimes * ctx_size_, half});
    sin = backend_.upload_table(hs, {regimes * ctx_size_, half});
  };
  make_tables(rope_full_, cos_full_, sin_full_);
  make_tables(rope_local_, cos_local_, sin_local_);
  has_long_rope_ = regimes == 2;

  KVLayout kv;
  kv.n_layers = c.n_layers, kv.block_size = opt.block_size, kv.n_kv_heads = c.n_kv_heads, kv.head_dim = c.head_dim;
  kv.n_blocks = opt.kv_blocks > 0 ? opt.kv_blocks : (ctx_size_ + opt.block_size - 1) / opt.block_size + 1;
  if (!opt.kv_cache.empty() && opt.kv_cache != "bf16") kv.codecs = resolve_kv_cache_spec(opt.kv_cache, c.n_layers, c.head_dim);
  backend_.alloc_kv(kv);
  plan_buffers();
}

void Model::plan_buffers() {
  const ModelConfig& c = cfg_;
  const DType t = backend_.act_dtype();
  const int64_t T = max_step_tokens_;
  x_ = backend_.alloc(t, {T, c.hidden_size});
  h_ = backend_.alloc(t, {T, c.hidden_size});
  o_ = backend_.alloc(t, {T, c.hidden_size});
  q_ = backend_.alloc(t, {T, c.q_dim()});
  attn_ = backend_.alloc(t, {T, c.q_dim()});
  k_ = backend_.alloc(t, {T, c.kv_dim()});
  v_ = backend_.alloc(t, {T, c.kv_dim()});
  gate_ = backend_.alloc(t, {T, c.intermediate_size});
  up_ = backend_.alloc(t, {T, c.intermediate_size});
  act_ = backend_.alloc(t, {T, c.intermediate_size});
  graph_max_ = std::min(backend_.max_graph_tokens(), T);
  logit_cap_ = std::max(kLogitChunk, graph_max_);
  rows_ = backend_.alloc(t, {logit_cap_, c.hidden_size});
  rows_normed_ = backend_.alloc(t, {logit_cap_, c.hidden_size});
  logits_ = backend_.alloc(DType::F32, {logit_cap_, c.vocab_size});
}

// Token counts decode graphs are recorded for: exact up to 8 (the GEMV sizes), then steps of 8.
int64_t Model::graph_bucket(int64_t T) const {
  if (T <= 8) return T;
  const int64_t b = (T + 7) / 8 * 8;
  return b <= graph_max_ ? b : 0;
}

// A decode step (token i of sequence i, every row's logits wanted) becomes a graph batch: padded to
// its bucket with tokens that sit at position 0 of their own sequence, whose block table points at
// the backend's spare block (index n_blocks), and block tables widened to a power of two.
bool Model::make_graph_batch(const BatchInfo& b) {
  const int64_t T = b.n_tokens();
  if (graph_max_ == 0 || T > graph_max_ || b.n_seqs() != T || int64_t(b.logit_rows.size()) != T) return false;
  const int64_t B = graph_bucket(T);
  if (B == 0 || B > max_step_tokens_) return false;
  for (int64_t i = 0; i < T; ++i)  // token i is sequence i (how make_batch and the scheduler lay out decode steps)
    if (b.seq[size_t(i)] != i) return false;
  int32_t mb = 1;
  while (mb < b.max_blocks) mb *= 2;
  BatchInfo& g = graph_batch_;
  g.tokens.assign(b.tokens.begin(), b.tokens.end());
  g.pos.assign(b.pos.begin(), b.pos.end());
  g.seq.assign(b.seq.begin(), b.seq.end());
  g.ctx_len.assign(b.ctx_len.begin(), b.ctx_len.end());
  g.logit_rows.assign(b.logit_rows.begin(), b.logit_rows.end());
  g.long_rope.clear();  // already in rope_rows
  g.rope_rows.assign(b.rope_rows.begin(), b.rope_rows.end());
  g.max_blocks = mb;
  g.block_tables.assign(size_t(B) * size_t(mb), -1);
  for (int64_t s = 0; s < T; ++s)
    std::copy_n(b.block_tables.begin() + s * b.max_blocks, b.max_blocks, g.block_tables.begin() + s * mb);
  const int32_t pad_block = int32_t(backend_.kv_layout().n_blocks);
  for (int64_t i = T; i < B; ++i) {
    g.tokens.push_back(0), g.pos.push_back(0), g.seq.push_back(int32_t(i)), g.ctx_len.push_back(1);
    g.logit_rows.push_back(int32_t(i));
    if (!g.rope_rows.empty()) g.rope_rows.push_back(0);
    g.block_tables[size_t(i * mb)] = pad_block;
  }
  return true;
}

bool Model::long_rope_for(int64_t prompt_tokens) const {
  return rope_full_.long_regime_for(prompt_tokens) || rope_local_.long_regime_for(prompt_tokens);
}

// The batch with rope_rows filled when one of its sequences takes the long regime, else b itself.
const BatchInfo& Model::with_rope_rows(const BatchInfo& b) {
  ARBOR_CHECK(b.long_rope.empty() || int64_t(b.long_rope.size()) == b.n_seqs(), "model: {} long-rope flags for {} sequences",
              b.long_rope.size(), b.n_seqs());
  ARBOR_CHECK(b.rope_rows.empty(), "model: the batch already has rope rows (the model fills them)");
  if (!has_long_rope_ || std::none_of(b.long_rope.begin(), b.long_rope.end(), [](uint8_t f) { return f != 0; })) return b;
  rope_batch_ = b;
  rope_batch_.rope_rows.resize(size_t(b.n_tokens()));
  for (int64_t i = 0; i < b.n_tokens(); ++i) {
    const int32_t s = b.seq[size_t(i)];
    ARBOR_CHECK(s >= 0 && s < b.n_seqs(), "model: token {} of sequence {}, the batch has {}", i, s, b.n_seqs());
    rope_batch_.rope_rows[size_t(i)] = b.pos[size_t(i)] + (b.long_rope[size_t(s)] ? int32_t(ctx_size_) : 0);
  }
  return rope_batch_;
}

void Model::forward(const BatchInfo& batch, float* logits_out) {
  const int64_t T = batch.n_tokens(), R = int64_t(batch.logit_rows.size());
  ARBOR_CHECK(T > 0 && T <= max_step_tokens_, "model: a step carries {} tokens, the plan allows 1..{}", T, max_step_tokens_);
  ARBOR_CHECK(batch.pos.size() == size_t(T) && batch.seq.size() == size_t(T), "model: {} tokens with {} positions and {} sequence ids", T,
              batch.pos.size(), batch.seq.size());
  for (int64_t i = 0; i < T; ++i)
    ARBOR_CHECK(batch.pos[size_t(i)] >= 0 && batch.pos[size_t(i)] < ctx_size_, "model: position {} outside the context ({} tokens)",
                batch.pos[size_t(i)], ctx_size_);
  const BatchInfo& b = with_rope_rows(batch);
  for (auto r : b.logit_rows) ARBOR_CHECK(r >= 0 && r < T, "model: logit row {} outside the batch ({})", r, T);
  ARBOR_CHECK(b.decode_rows.empty() || int64_t(b.decode_rows.size()) == T, "model: {} decode-row flags for {} tokens",
              b.decode_rows.size(), T);
  ARBOR_CHECK(logits_out || R <= logit_cap_, "model: {} logit rows left on the device, the buffer holds {}", R, logit_cap_);
  Backend& be = backend_;
  if (make_graph_batch(b)) {
    const BatchInfo& g = graph_batch_;
    const int64_t B = g.n_tokens();
    be.begin_batch(g);
    if (!be.step_graph_begin()) {  // logit row i is token i (make_graph_batch)
      const bool fold = B <= logit_cap_;
      run_layers(B, fold);
      run_logits(B, fold);
    }
    be.step_graph_end();
    if (logits_out) be.read_logits(first_rows(logits_, R), logits_out);
    return;
  }
  be.begin_batch(b);
  bool identity = R == T && T <= logit_cap_;
  for (int64_t i = 0; identity && i < R; ++i) identity = b.logit_rows[size_t(i)] == i;
  run_layers(T, identity);
  if (identity) {
    run_logits(T, true);
    if (logits_out) be.read_logits(first_rows(logits_, T), logits_out);
    return;
  }
  // Logits for the requested rows only, logit_cap_ rows per lm_head call.
  BatchInfo chunk_batch;
  for (int64_t r0 = 0; r0 < R; r0 += logit_cap_) {
    const int64_t n = std::min(logit_cap_, R - r0);
    if (r0 > 0 || n < R) {
      chunk_batch.logit_rows.assign(b.logit_rows.begin() + r0, b.logit_rows.begin() + r0 + n);
      chunk_batch.decode_rows = b.decode_rows;  // by token: the kind of each logit row
      be.begin_batch(chunk_batch);
    }
    run_logits(n);
    if (logits_out) be.read_logits(first_rows(logits_, n), logits_out + r0 * cfg_.vocab_size);
  }
}

Tensor Model::device_logits(int64_t rows) const {
  ARBOR_CHECK(rows >= 0 && rows <= logit_cap_, "model: {} logit rows, the buffer holds {}", rows, logit_cap_);
  return first_rows(logits_, rows);
}

// The layer stack over the current batch's T tokens, leaving the residual stream in x_. Each residual
// add is fused with the norm that reads its result when there is one (add_norm).
void Model::run_layers(int64_t T, bool final_norm) {
  const ModelConfig& c = cfg_;
  const ArchDescriptor& a = *arch_;
  Backend& be = backend_;
  Tensor x = first_rows(x_, T), h = first_rows(h_, T), o = first_rows(o_, T);
  Tensor q = first_rows(q_, T), k = first_rows(k_, T), v = first_rows(v_, T), attn = first_rows(attn_, T);
  Tensor gate = first_rows(gate_, T), up = first_rows(up_, T), act = first_rows(act_, T);
  const float resid = float(c.residual_multiplier), eps = float(c.norm_eps);
  bool owed = false;  // x += o * resid is still owed
  auto settle = [&] {
    if (owed) be.add_scaled(x, o, resid), owed = false;
  };
  auto pre_norm = [&](const Tensor& w, const Tensor& bias) {
    if (owed) be.add_norm(norm_op_, x, o, resid, w, bias, eps, h), owed = false;
    else be.norm(norm_op_, x, w, bias, eps, h);
  };

  be.embed(w_.embed, x, embed_scale_);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[size_t(l)];
    const bool sliding = c.layer_types[size_t(l)] == LayerAttention::Sliding;
    // Attention half.
    if (a.block != BlockKind::PostNorm) pre_norm(L.attn_norm, L.attn_norm_b);
    else settle();
    const Tensor& attn_in = a.block == BlockKind::PostNorm ? x : h;
    const Backend::LinearOut qkv[3] = {{&L.q, q}, {&L.k, k}, {&L.v, v}};
    be.linear_multi(attn_in, qkv, 3);
    Backend::QKPrep prep;
    prep.norm = norm_op_, prep.eps = eps;
    prep.n_heads = c.n_heads, prep.n_kv_heads = c.n_kv_heads, prep.head_dim = c.head_dim, prep.rot_dim = c.rotary_dim();
    if (a.qk_norm == QKNormKind::PerHead) {
      prep.q_norm = &L.q_norm, prep.k_norm = &L.k_norm;
    } else if (a.qk_norm == QKNormKind::Full) {
      be.norm(norm_op_, q, L.q_norm, Tensor{}, eps, q);
      be.norm(norm_op_, k, L.k_norm, Tensor{}, eps, k);
    }
    if (c.layer_uses_rope[size_t(l)]) {
      prep.cos = sliding ? &cos_local_ : &cos_full_;
      prep.sin = sliding ? &sin_local_ : &sin_full_;
    }
    be.prep_attention(l, q, k, v, prep, sliding ? attn_sliding_ : attn_full_, attn);
    be.linear(attn, L.o, o);
    if (a.block != BlockKind::PreNorm) be.norm(norm_op_, o, L.post_attn_norm, Tensor{}, eps, o);
    owed = true;
    // MLP half.
    if (a.block != BlockKind::PostNorm) pre_norm(L.mlp_norm, L.mlp_norm_b);
    else settle();
    const Tensor& mlp_in = a.block == BlockKind::PostNorm ? x : h;
    if (a.mlp == MlpKind::Gated) {
      be.gated_up(mlp_in, L.gate, L.up, act_op_, gate, up, act);
    } else {
      be.linear(mlp_in, L.up, up);
      be.activation(act_op_, Tensor{}, up, act);
    }
    be.linear(act, L.down, o);
    if (a.block != BlockKind::PreNorm) be.norm(norm_op_, o, L.post_mlp_norm, Tensor{}, eps, o);
    owed = true;
  }
  if (!final_norm) {
    settle();
    return;
  }
  Tensor normed = first_rows(rows_normed_, T);
  if (owed) be.add_norm(norm_op_, x, o, resid, w_.final_norm, w_.final_norm_b, eps, normed);
  else be.norm(norm_op_, x, w_.final_norm, w_.final_norm_b, eps, normed);
}

// Logits of the current batch's first n logit rows into logits_ (gather, final norm, LM head, scaling;
// normed_ready: run_layers already normed rows 0..n-1, which are the logit rows).
void Model::run_logits(int64_t n, bool normed_ready) {
  const ModelConfig& c = cfg_;
  Backend& be = backend_;
  Tensor rows = first_rows(rows_, n), normed = first_rows(rows_normed_, n), logits = first_rows(logits_, n);
  if (!normed_ready) {
    be.gather_logit_rows(x_, rows);
    be.norm(norm_op_, rows, w_.final_norm, w_.final_norm_b, float(c.norm_eps), normed);
  }
  be.linear(normed, w_.lm_head, logits);
  be.scale_softcap(logits, float(1.0 / c.logits_scaling), float(c.final_logit_softcap));
}

}  // namespace arbor
