// Flags shared by the verbs that load a model (--model, --config, --dummy-weights, --device,
// --threads, --weights, --ctx-size ...) and the code that turns them into a backend and a Model.
#pragma once
#include <memory>
#include <set>
#include <string>

#include "backend/backend.h"
#include "cli/args.h"
#include "model/model.h"
#include "text/jinja/chat_template.h"

namespace arbor::cli {

// Value flags and bool flags every model-loading verb accepts.
std::set<std::string> model_value_flags();
std::set<std::string> model_bool_flags();

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  double load_seconds = 0;
};

// The model used when no --model is given: $ARBOR_MODEL, else the one shipped in models/.
std::string default_model_dir();
// --model's value as a directory: a path as given, or a Hugging Face repo id ("Qwen/Qwen3-0.6B") that
// is not a path, found in the local hub cache (the snapshot refs/main names, or the only one; nothing
// is downloaded). Sets *repo_id when it was one.
std::string resolve_model_dir(const std::string& spec, std::string* repo_id = nullptr);
// The pieces, for verbs that adjust the options (e.g. bench sizes the context itself):
LoadOptions load_options_from_args(const Args& a);                 // --model/--config/--dummy-weights/--dtype/...
// The dummy weights' format: --bits B [--group-size G] (default 64): MLX affine; --format trellis [--bits K]
// [--down-axis A] [--axis A]: trellis-coded as arbor synth --format trellis writes them; none of these: dense. Fails when
// given without --dummy-weights, or with values the format does not take.
DummyQuant dummy_quant_from_args(const Args& a, bool dummy_weights);
std::unique_ptr<Backend> make_backend_from_args(const Args& a);    // --device/--threads/--weights
// Builds the backend named by --device (cpu default) and loads the model named by --model/--config.
LoadedModel load_model_from_args(const Args& a, int64_t max_step_tokens = 256);

// The chat template for a model's conversations: --chat-template FILE or a built-in name (chatml), with
// the tokenizer_config.json special tokens of tok_dir; without the flag, tok_dir's own template.
ChatTemplate chat_template_from_args(const Args& a, const std::string& tok_dir);

// "bf16 512, affine8 272, affine4 144, k8v4 216, k8v3 200" for a model's KV shape: bytes per token
// (every layer's K and V) of each --kv-cache codec; plain rows of plain_bytes per value. Codecs the
// head_dim cannot take say so.
std::string kv_bytes_per_codec(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t plain_bytes);

// Parses "1,2,3" into non-negative integers; throws naming the flag, the bad entry and what an entry
// should be (`what`, e.g. "a token id").
std::vector<int32_t> parse_id_list(const std::string& s, const char* flag, const char* what = "a token id");

}  // namespace arbor::cli

// Their lines for a verb's --help (a string literal, joined with the verb's own lines; cli/verb.h).
#define ARBOR_MODEL_FLAGS_HELP                                                                          \
  "  --model DIR           checkpoint directory: config.json, *.safetensors (sharded or not), the\n"     \
  "                        tokenizer files; or a repo id (Qwen/Qwen3-0.6B) already in the Hugging Face\n" \
  "                        cache; default $ARBOR_MODEL, else the model shipped in models/\n"             \
  "  --config FILE         a config.json to build the model from, with --dummy-weights\n"               \
  "  --dummy-weights       deterministic random weights instead of a checkpoint's\n"                    \
  "  --dtype bf16|f16|f32  the dummy weights' type (default bf16; quantized: their scales and biases)\n" \
  "  --bits B              dummy weights MLX affine quantized, B bits (2, 3, 4, 5, 6, 8), as `arbor synth\n"  \
  "                        --bits` writes them: every linear, the embedding and an untied head; packed\n"    \
  "  --group-size G        their group size (32, 64, 128; default 64)\n"                                   \
  "  --format affine|trellis  dummy weights' format (affine: the default with --bits); trellis: random\n"  \
  "                        code words, k = --bits (2, 3, 4; default 2), as `arbor synth --format trellis`\n" \
  "  --down-axis 0|1       trellis: the down projection's axis (default 0)\n"                             \
  "  --axis 0|1            trellis: the other linears' axis (default 1; fused q/k/v, gate/up stay on 1)\n" \
  "  --device cpu|cuda     where the model runs (default cpu; cuda needs a CUDA build and a GPU)\n"      \
  "  --threads N           CPU threads (default: every CPU this process may run on)\n"                   \
  "  --weights copy|mmap   CPU: weights copied to anonymous huge-page memory (default) or used from\n"   \
  "                        the file mapping\n"                                                           \
  "  --cpu-gemm bf16|exact CPU prefill linears: activations rounded to bf16 once, one bf16 dot per\n"  \
  "                        pair of products (default; AVX-512 BF16 CPUs, bf16 weights) or kept at ~16\n" \
  "                        mantissa bits (exact: twice the work); decode is always exact\n"              \
  "  --ctx-size N          positions a sequence may use (default: the model's maximum, at most 4096)\n"  \
  "  --kv-blocks N         KV cache blocks of 16 tokens (default: one full-context sequence; serve:\n"   \
  "                        --max-batch of them within --kv-memory-gb)\n"                                \
  "  --kv-cache SPEC       KV cache codec: bf16 (default; f32 on the CPU), affine8, affine4, k8v4, k8v3\n" \
  "                        (TurboQuant k<bits>v<bits>); per layer: k8v3,0:bf16,-1:bf16 (LAYER or A..B,\n" \
  "                        negative from the end; later entries win). docs/kv-cache.md\n"
