// Backend: the op set the decoder needs, one virtual call per op. cpu/ and cuda/ implement it.
// Tensors here live on the backend's device; activations are in act_dtype() (f32 on the CPU, bf16 on
// CUDA); weights stay in their checkpoint dtype unless the backend converts them at upload.
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/sampling.h"
#include "core/tensor.h"
#include "quant/kv_codec.h"

namespace arbor {

// How a linear layer's matrix is stored. Dense: one F32/F16/BF16 tensor [rows, cols]. Affine (MLX:
// b-bit codes packed in uint32 words, a scale and a bias per group of `group_size` columns) and
// Trellis (packed trellis words, a scale per coded row): ../shared/design/formats.md §2-3. The CPU runs
// Affine (reference kernel) and Trellis; other pairs fail at the kernel pick naming what the backend supports.
enum class WeightFormat : uint8_t { Dense, Affine, Trellis };
inline const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Dense: return "dense";
    case WeightFormat::Affine: return "affine";
    case WeightFormat::Trellis: return "trellis";
  }
  return "?";
}

// One weight matrix as the decoder uses it: a linear layer (y = x · Wᵀ + bias) or an embedding table
// (a row per token id; the tied LM head reuses it). The same description serves on the host (views of
// the checkpoint, or generated) and on a backend (Backend::load_linear's result). W is logically
// [rows, cols] = [out features, in features] (HF nn.Linear); how its values are stored is `format`'s.
struct Linear {
  WeightFormat format = WeightFormat::Dense;
  int64_t n_rows = 0, n_cols = 0;
  Tensor data;    // Dense: W [rows, cols]. Affine: codes, uint32 [rows, cols*bits/32]. Trellis: words (axis below;
                  // on the host the k = 3 axis-0 interleaved layout may be 3-D [cols/512, rows, 48]).
  Tensor scales;  // Affine: [rows, cols/group_size]; Trellis: [rows] (axis 0: [cols]); Dense: empty
  Tensor biases;  // Affine: [rows, cols/group_size]; else empty (the quantization offsets, not `bias`)
  Tensor bias;    // the layer's additive bias [rows], or empty
  int32_t group_size = 0, bits = 0;  // Affine (Trellis: bits per weight, group_size the block of 256)
  // Trellis: 1: data [rows, cols*bits/32] (each output row coded along the inputs), scales [rows]; 0: the
  // transpose, data [cols, rows*bits/32] (each input column coded along the outputs), scales [cols].
  int32_t axis = 1;

  int64_t rows() const { return n_rows; }
  int64_t cols() const { return n_cols; }
  bool empty() const { return data.empty(); }
  // A dense layer from W [rows, cols] (and bias [rows]).
  static Linear dense(const Tensor& w, const Tensor& bias = {}) {
    Linear l;
    l.n_rows = w.ndim == 2 ? w.shape[0] : 0, l.n_cols = w.ndim == 2 ? w.shape[1] : 0;
    l.data = w, l.bias = bias;
    return l;
  }
  // "dense BF16 [4096, 4096]", "affine 4-bit g64 [4096, 4096]": what error messages name.
  std::string describe() const {
    std::string s = weight_format_name(format);
    if (format == WeightFormat::Dense) s += fmt::format(" {}", dtype_name(data.dtype));
    else if (format == WeightFormat::Affine) s += fmt::format(" {}-bit g{}", bits, group_size);
    else s += fmt::format(" {}-bit axis {}", bits, axis);
    return s + fmt::format(" [{}, {}]", n_rows, n_cols);
  }
};

enum class NormOp : uint8_t { RMS, RMSPlusOne, LayerNorm };
enum class ActOp : uint8_t { SiLU, GeLU, GeLUTanh };

// The flattened batch of one forward call, host side. Token i belongs to sequence seq[i] and sits at
// position pos[i]; each sequence has a block table into the paged KV pools and its context length
// after this step (all tokens in the cache once this step's keys are written).
// A token id < 0 in BatchInfo::tokens stands for the id that the backend's last queued pick
// (Backend::argmax_rows_start) chose for logit row -1 - id: a step queued before the previous step's
// ids reached the host (only backends that pick ids on the device accept it).
inline int32_t token_from_last_pick(int64_t row) { return int32_t(-1 - row); }

// One logit row's draw for Backend::sample_rows_start, in transformers' order (temperature <= 0:
// greedy). The draw is a function of (params.seed, counter): a request passes its seed and the
// position of the token drawn, so its ids do not depend on which other requests share the step.
struct RowSampling {
  SamplingParams params;
  uint64_t counter = 0;
};

struct BatchInfo {
  std::vector<int32_t> tokens;        // [T] (or token_from_last_pick(row))
  std::vector<int32_t> pos;           // [T]
  std::vector<int32_t> seq;           // [T] index into the per-sequence arrays
  std::vector<int32_t> ctx_len;       // [S]
  std::vector<int32_t> block_tables;  // [S, max_blocks] (row-major, unused entries -1)
  int32_t max_blocks = 0;
  std::vector<int32_t> logit_rows;    // token indices whose logits are wanted, in output order
  // Longrope's per-sequence regime (RopeTable): long_rope[s] != 0 when sequence s takes the long
  // factors at every position (its prompt was longer than original_max_position_embeddings); empty:
  // no sequence does. Set by whoever builds the batch (SequenceKV::long_rope); Model::forward turns it
  // into rope_rows, the row of the rope tables each token reads (empty: its position), which is what
  // the backends read.
  std::vector<uint8_t> long_rope;     // [S] or empty
  std::vector<int32_t> rope_rows;     // [T] or empty
  // decode_rows[t] = 1 where token t is a generated id fed back (a decode step), 0 a prompt token; empty:
  // not said. A backend whose arithmetic depends on the kind of row (the CPU's --cpu-gemm bf16: prompt
  // rows through the bf16-activation GEMM, decode rows through the exact GEMV) chooses by it, so that a
  // token's logits do not depend on what else shares the step or on how much of its prompt was cached.
  std::vector<uint8_t> decode_rows;   // [T] or empty
  void set_row_kind(bool decode) { decode_rows.assign(tokens.size(), decode ? 1 : 0); }
  int64_t n_tokens() const { return int64_t(tokens.size()); }
  int64_t n_seqs() const { return int64_t(ctx_len.size()); }
};

struct AttentionParams {
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;        // applied to q·k
  float softcap = 0.0f;      // 0 = off; else cap * tanh(score / cap)
  int64_t window = 0;        // 0 = full causal; else a token sees the last `window` positions, itself included
};

// The paged KV cache's shape, and each layer's K/V codec (quant/kv_codec.h): a layer's pool holds per
// slot n_kv_heads rows of the codec's row bytes (plain: head_dim values of the backend's kv_dtype()).
struct KVLayout {
  int64_t n_layers = 0, n_blocks = 0, block_size = 16, n_kv_heads = 0, head_dim = 0;
  std::vector<KVCodecPair> codecs;  // one per layer; empty: plain everywhere

  const KVCodecPair& codec(int64_t layer) const {
    static const KVCodecPair plain_pair;
    return codecs.empty() ? plain_pair : codecs[size_t(layer)];
  }
  bool plain() const {
    for (const auto& c : codecs)
      if (!c.plain()) return false;
    return true;
  }
  // Bytes of one token's K and V in one layer / in every layer (plain values of type t).
  int64_t layer_token_bytes(int64_t layer, DType t) const {
    return codec(layer).token_bytes(n_kv_heads, head_dim, int64_t(dtype_size(t)));
  }
  int64_t bytes_per_token(DType t) const {
    int64_t sum = 0;
    for (int64_t l = 0; l < n_layers; ++l) sum += layer_token_bytes(l, t);
    return sum;
  }
  // "k8v3", or the layers' codecs when they differ ("k8v3, layers 0 27: bf16"). The plain cache is named by
  // the values it stores, `plain` (the backend's kv_dtype(): bf16 on CUDA, f32 on the CPU).
  std::string codec_summary(DType plain = DType::BF16) const {
    std::string plain_name(dtype_name(plain));
    for (char& ch : plain_name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (codecs.empty()) return plain_name;
    struct Seen {
      std::string name, layers;
      int count = 0;
    };
    std::vector<Seen> seen;
    for (size_t l = 0; l < codecs.size(); ++l) {
      const std::string n = codecs[l].plain() ? plain_name : codecs[l].name();
      auto it = std::find_if(seen.begin(), seen.end(), [&](const Seen& e) { return e.name == n; });
      if (it == seen.end()) it = seen.insert(seen.end(), Seen{n, "", 0});
      it->layers += fmt::format("{}{}", it->layers.empty() ? "" : " ", l);
      ++it->count;
    }
    auto most = std::max_element(seen.begin(), seen.end(), [](const Seen& a, const Seen& b) { return a.count < b.count; });
    std::string out = most->name;
    for (const Seen& e : seen)
      if (e.name != most->name) out += fmt::format(", layers {}: {}", e.layers, e.name);
    return out;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual DType act_dtype() const = 0;
  virtual DType kv_dtype() const = 0;

  // Memory. Returned tensors stay valid for the backend's lifetime.
  virtual Tensor alloc(DType t, std::initializer_list<int64_t> shape) = 0;
  // A weight as the backend will read it (CPU: a view of the host data, or a copy; CUDA: uploaded).
  virtual Tensor load_weight(const Tensor& host) = 0;
  // A host matrix (Linear) as the backend will read it: its tensors loaded, possibly repacked into the
  // backend's compute layout (the format on disk is unchanged). Fails on a format the backend cannot
  // run, naming the ones it can.
  virtual Linear load_linear(const Linear& host) = 0;
  // True when load_weight may return a view of the host tensor (which must then outlive the backend).
  virtual bool views_host_weights() const = 0;
  virtual void alloc_kv(const KVLayout& layout) = 0;
  virtual const KVLayout& kv_layout() const = 0;

  // Sets the batch the following ops run on (uploads its metadata).
  virtual void begin_batch(const BatchInfo& b) = 0;

  // out[t] = table[token[t]] * scale (table: rows = vocab, cols = hidden)  out [T, hidden]
  virtual void embed(const Linear& table, Tensor out, float scale) = 0;
  // out = norm(x) * w (+ b); rows of x normalised independently           x, out [R, C]
  virtual void norm(NormOp op, const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor out) = 0;
  // Per-head norm: x viewed as [R * n_heads, head_dim], in place.
  virtual void head_norm(NormOp op, Tensor x, int64_t head_dim, const Tensor& w, float eps) = 0;
  // y = x · Wᵀ (+ bias)                                                    x [T, in], y [T, out]
  virtual void linear(const Tensor& x, const Linear& l, Tensor y) = 0;
  // Several layers over the same x (q/k/v, gate/up): y_i = x · W_iᵀ. One launch where the backend can
  // (CUDA decode: one GEMV over all the rows); by default one linear() each.
  struct LinearOut {
    const Linear* l;
    Tensor y;
  };
  virtual void linear_multi(const Tensor& x, const LinearOut* outs, int n) {
    for (int i = 0; i < n; ++i) linear(x, *outs[i].l, outs[i].y);
  }
  // Rotates the first rot_dim dims of each head of x [T, n_heads*head_dim] in place, at each token's
  // position (its rope_rows entry when the batch has them); cos/sin tables are [n_rows, rot_dim/2] on
  // the device (from upload_table).
  virtual void rope(Tensor x, int64_t n_heads, int64_t head_dim, int64_t rot_dim, const Tensor& cos, const Tensor& sin) = 0;
  // Writes k, v [T, n_kv_heads*head_dim] into layer's KV blocks at each token's slot.
  virtual void kv_write(int64_t layer, const Tensor& k, const Tensor& v) = 0;
  // What happens to q and k between their projections and attention, in one call: per-head norms
  // (when q_norm/k_norm are given), rope (when cos is given), then k and v into the KV cache. The
  // default is the separate ops; a backend may fuse them (same numbers: each stage rounds as its op would).
  struct QKPrep {
    NormOp norm{};
    const Tensor* q_norm = nullptr;  // [head_dim] or null
    const Tensor* k_norm = nullptr;
    float eps = 0;
    int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, rot_dim = 0;
    const Tensor* cos = nullptr;  // null: no rope on this layer
    const Tensor* sin = nullptr;
  };
  virtual void qk_prep_kv_write(int64_t layer, Tensor q, Tensor k, const Tensor& v, const QKPrep& p) {
    if (p.q_norm) head_norm(p.norm, q, p.head_dim, *p.q_norm, p.eps);
    if (p.k_norm) head_norm(p.norm, k, p.head_dim, *p.k_norm, p.eps);
    if (p.cos) {
      rope(q, p.n_heads, p.head_dim, p.rot_dim, *p.cos, *p.sin);
      rope(k, p.n_kv_heads, p.head_dim, p.rot_dim, *p.cos, *p.sin);
    }
    kv_write(layer, k, v);
  }
  // out [T, n_heads*head_dim] = softmax(q·Kᵀ·scale (+softcap, causal/window mask)) · V over the cache.
  virtual void attention(int64_t layer, const Tensor& q, const AttentionParams& p, Tensor out) = 0;
  // qk_prep_kv_write, then attention (a backend may fuse the two; q and k are then left as they came).
  virtual void prep_attention(int64_t layer, Tensor q, Tensor k, const Tensor& v, const QKPrep& prep, const AttentionParams& p,
                              Tensor out) {
    qk_prep_kv_write(layer, q, k, v, prep);
    attention(layer, q, p, out);
  }
  // out = act(gate) * up (gated MLP), or act(up) when gate is empty.
  virtual void activation(ActOp op, const Tensor& gate, const Tensor& up, Tensor out) = 0;
  // The gated MLP's first half: out = act(x · Wgᵀ) * (x · Wuᵀ). gate and up [T, ffn] are scratch the
  // default (linear_multi, then activation) writes; a backend may fuse the three and skip them.
  virtual void gated_up(const Tensor& x, const Linear& wg, const Linear& wu, ActOp op, Tensor gate, Tensor up, Tensor out) {
    const LinearOut gu[2] = {{&wg, gate}, {&wu, up}};
    linear_multi(x, gu, 2);
    activation(op, gate, up, out);
  }
  // y += x * scale
  virtual void add_scaled(Tensor y, const Tensor& x, float scale) = 0;
  // The residual add fused with the norm that follows it: x += o * scale, then out = norm(x) * w (+ b).
  // Same numbers as add_scaled then norm (x is stored in the activation dtype before it is normalised).
  virtual void add_norm(NormOp op, Tensor x, const Tensor& o, float scale, const Tensor& w, const Tensor& b, float eps, Tensor out) {
    add_scaled(x, o, scale);
    norm(op, x, w, b, eps, out);
  }
  // x = x * scale, then cap * tanh(x / cap) when cap > 0
  virtual void scale_softcap(Tensor x, float scale, float cap) = 0;
  // out[i] = x[batch.logit_rows[i]]                                        out [R, C]
  virtual void gather_logit_rows(const Tensor& x, Tensor out) = 0;
  // Host float32 data to the device (rope tables).
  virtual Tensor upload_table(const std::vector<float>& host, std::initializer_list<int64_t> shape) = 0;
  // Device logits [R, vocab] to host float32.
  virtual void read_logits(const Tensor& logits, float* host) = 0;
  // Greedy ids of device logits [R, vocab] f32 (ties: lowest id) without copying the logits to the
  // host; false when the backend has no such path (the caller reads the logits and picks on the host).
  // argmax_rows waits for the ids (call it with no pick outstanding). argmax_rows_start only queues
  // the pick, so the host can queue the next step (its tokens token_from_last_pick(row)) before this
  // one's ids arrive; wait_pick gives the ids of the oldest queued pick, R of them. At most two picks
  // are outstanding.
  virtual bool argmax_rows_start(const Tensor& logits) { return false; }
  // The same for a draw per row (greedy or sampled, rows[i] for logit row i), queued like a greedy pick.
  virtual bool sample_rows_start(const Tensor& logits, const std::vector<RowSampling>& rows) { return false; }
  virtual void wait_pick(int32_t* host_ids) { fail("{}: no queued pick of ids to wait for", name()); }
  virtual void drop_picks() {}  // forgets every queued pick (after the device is done with them)
  bool argmax_rows(const Tensor& logits, int32_t* host_ids) {
    if (!argmax_rows_start(logits)) return false;
    wait_pick(host_ids);
    return true;
  }

  // Step graphs: a backend that can record the ops of a decode step once and replay them (CUDA graphs)
  // says so here; the decoder then pads decode batches to buckets of tokens (positions, sequences
  // and block tables are read from device memory, so one recording serves every step of its shape).
  // Between begin_batch and the ops: step_graph_begin() returns true when it launched a recording of
  // this batch's shape (skip the ops), false when the ops must be issued (it may be recording them);
  // step_graph_end() after the ops finishes a recording and launches it.
  virtual int64_t max_graph_tokens() const { return 0; }
  virtual bool step_graph_begin() { return false; }
  virtual void step_graph_end() {}
};

}  // namespace arbor
