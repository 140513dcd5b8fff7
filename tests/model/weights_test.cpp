// The weight walk: every architecture's bound matrices have the shapes the decoder expects, fused
// tensors split into their parts, a tied head is the embedding, and the specs list follows the walk.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/archs.h"
#include "model/config.h"
#include "model/weights.h"

using namespace arbor;

namespace {

ModelConfig tiny(const std::string& type, bool tied) {
  json j{{"model_type", type},     {"vocab_size", 97},       {"hidden_size", 32},           {"intermediate_size", 48},
         {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-5},
         {"max_position_embeddings", 128}, {"tie_word_embeddings", tied}};
  ModelConfig c = parse_model_config(j, "test");
  apply_arch_defaults(c, find_arch(c));
  return c;
}

void expect_shape(const Linear& l, int64_t rows, int64_t cols, const char* what) {
  EXPECT_EQ(l.format, WeightFormat::Dense) << what;
  EXPECT_EQ(l.rows(), rows) << what;
  EXPECT_EQ(l.cols(), cols) << what;
  ASSERT_FALSE(l.data.empty()) << what;
  EXPECT_EQ(l.data.shape[0], rows) << what;
  EXPECT_EQ(l.data.shape[1], cols) << what;
}

}  // namespace

TEST(Weights, EveryArchitectureBindsTheShapesTheDecoderReads) {
  for (const std::string& type : supported_archs())
    for (bool tied : {false, true}) {
      SCOPED_TRACE(type + (tied ? " tied" : " untied"));
      const ModelConfig c = tiny(type, tied);
      const ArchDescriptor& a = find_arch(c);
      const std::vector<TensorSpec> specs = expected_tensors(c, a);
      // Host tensors for every spec (distinct values per tensor: its index), and the order they were asked for.
      std::vector<std::unique_ptr<float[]>> keep;
      std::vector<std::string> asked;
      auto get = [&](const TensorSpec& s) {
        int64_t n = 1;
        for (auto d : s.shape) n *= d;
        keep.emplace_back(new float[size_t(n)]);
        for (int64_t i = 0; i < n; ++i) keep.back()[size_t(i)] = float(keep.size()) + float(i) * 1e-3f;
        asked.push_back(s.name);
        Tensor t(keep.back().get(), DType::F32, {});
        t.ndim = int(s.shape.size());
        for (size_t i = 0; i < s.shape.size(); ++i) t.shape[i] = s.shape[i];
        return t;
      };
      CpuBackend be(1, WeightPlacement::Mapped);
      const ModelWeights m = bind_weights(c, a, get, be);
      ASSERT_EQ(asked.size(), specs.size());
      for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(asked[i], specs[i].name) << i;  // binding reads the specs' order

      const int64_t H = c.hidden_size, F = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
      expect_shape(m.embed, c.vocab_size, H, "embed");
      expect_shape(m.lm_head, c.vocab_size, H, "lm_head");
      EXPECT_EQ(m.lm_head.data.data == m.embed.data.data, tied);
      ASSERT_EQ(int64_t(m.layers.size()), c.n_layers);
      for (const LayerWeights& L : m.layers) {
        expect_shape(L.q, Q, H, "q");
        expect_shape(L.k, KV, H, "k");
        expect_shape(L.v, KV, H, "v");
        expect_shape(L.o, H, Q, "o");
        if (a.mlp == MlpKind::Gated) {
          expect_shape(L.gate, F, H, "gate");
        } else {
          EXPECT_TRUE(L.gate.empty());
        }
        expect_shape(L.up, F, H, "up");
        expect_shape(L.down, H, F, "down");
        // A fused tensor's parts are consecutive rows of it: k starts where q ends, up where gate ends.
        if (!a.names.qkv.empty()) {
          EXPECT_EQ(static_cast<const float*>(L.k.data.data), static_cast<const float*>(L.q.data.data) + Q * H);
          EXPECT_EQ(static_cast<const float*>(L.v.data.data), static_cast<const float*>(L.k.data.data) + KV * H);
        }
        if (!a.names.gate_up.empty()) {
          EXPECT_EQ(static_cast<const float*>(L.up.data.data), static_cast<const float*>(L.gate.data.data) + F * H);
        }
      }
    }
}

TEST(Weights, WalkSlotsAddUpToTheSpecs) {
  const ModelConfig c = tiny("phi3", false);
  const ArchDescriptor& a = find_arch(c);
  size_t tensors = 0, fused = 0;
  for_each_weight(c, a, nullptr, [&](const WeightSlot& s) {
    EXPECT_TRUE(s.parts.empty());  // no ModelWeights, no destinations
    EXPECT_EQ(s.vec, nullptr);
    tensors += s.kind == WeightSlot::Kind::Matrix && s.bias ? 2 : 1;
    if (s.kind == WeightSlot::Kind::Matrix && (s.rows == c.q_dim() + 2 * c.kv_dim() || s.rows == 2 * c.intermediate_size)) ++fused;
  });
  EXPECT_EQ(tensors, expected_tensors(c, a).size());
  EXPECT_EQ(fused, size_t(2 * c.n_layers));  // qkv_proj and gate_up_proj per layer
  ModelWeights m;
  for_each_weight(c, a, &m, [&](const WeightSlot& s) {
    if (s.kind != WeightSlot::Kind::Matrix) return;
    int64_t rows = 0;
    for (const auto& [dst, n] : s.parts) {
      EXPECT_NE(dst, nullptr) << s.name;
      rows += n;
    }
    EXPECT_EQ(rows, s.rows) << s.name;
  });
}
