// Calibration for Hessian-aware quantization (`arbor quantize --calib`): the dense model runs on the CPU
// over calibration text in windows of ctx ids (as `arbor perplexity` cuts them), and every layer linear's
// input rows are summed into its InputHessian (quant/trellis_ldlq.h). Linears that read the same input
// (q/k/v, gate/up, the parts of a fused matrix) share one Hessian: the rows are summed once.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "quant/trellis_ldlq.h"

namespace arbor {

struct CalibrationOptions {
  std::string model_dir;       // the dense checkpoint (config.json, safetensors)
  int64_t ctx = 1024;          // window length in ids
  int64_t max_tokens = 65536;  // ids used: max_tokens / ctx windows spread evenly over a longer text; 0: all
  int64_t step_tokens = 512;   // ids per forward
  int threads = 0;             // CPU threads (0: every core)
  // The layers whose linears are summed, [first_layer, end_layer) (end -1: to the last). The forward runs every
  // layer either way; a model whose Hessians do not fit at once is calibrated a group of layers a pass.
  int64_t first_layer = 0, end_layer = -1;
  std::function<void(int64_t done, int64_t total)> progress;
};

struct Calibration {
  // By module path ("model.layers.0.self_attn.q_proj"); modules with one input share the pointer.
  std::map<std::string, std::shared_ptr<quant::InputHessian>> hessians;
  int64_t tokens = 0;  // ids fed
  int64_t ctx = 0;     // the window used
  double seconds = 0;

  // E[x xᵀ] by module path, shared as the sums are, each made in place of its sum (hessians is left empty).
  std::map<std::string, std::shared_ptr<const std::vector<double>>> take_means();
};

// The bytes the Hessians of one of a config's layers take: n² doubles per distinct linear input (the attention
// and MLP inputs, o's and down's); the model's are n_layers times that.
double calibration_hessian_bytes_per_layer(const ModelConfig& c);

// Every layer linear's input Hessian (the embedding and the LM head left out), of the layers opt names. Fails when
// ids hold fewer than 2 ids, the layer range is empty, or the model cannot be loaded.
Calibration calibrate_input_hessians(std::span<const int32_t> ids, const CalibrationOptions& opt);

}  // namespace arbor
