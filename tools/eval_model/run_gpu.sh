#!/usr/bin/env bash
# The one device call that makes the evaluation model (tests/fixtures/eval-model):
# trains with tools/default_model/train.py --preset eval, exports it (sharded bf16
# safetensors, golden, samples, transformers' held-out perplexity), measures the
# shipped model on the same held-out text, and leaves under $OUT at most 8 files
# of at most 16 MiB (the device tool's limits):
#   model-0000i-of-0000n.safetensors   the weights, 15 MB shards
#   eval-model-run.tar.gz              config.json, generation_config.json,
#       model.safetensors.index.json, golden_greedy.json, samples.json,
#       train_log.json, shipped_heldout.json, train.log, export.log, gpu.txt
# If the export fails, the trained weights come back instead as
# trained_bf16.pt.part-* (cat them together) with the logs, and
#   python3 tools/default_model/train.py --preset eval --export-from DIR --out OUT
# redoes only the export. Run from the repository root, with the token streams
# carried (tools/eval_model/README.md):
#   bash tools/eval_model/run_gpu.sh
# A dry run of the flow on a CPU: TRAIN_ARGS=--smoke REF_CTX=1024 OUT=/tmp/o bash ...
set -uo pipefail
OUT=${OUT:?run_gpu.sh: set OUT to the folder that comes back}
RUN=${RUN:-/tmp/arbor-eval-run}
rm -rf "$RUN"
mkdir -p "$RUN/export" "$OUT"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  git log -1 --format='commit %H' 2>/dev/null; } >"$RUN/export/gpu.txt" 2>&1
cat "$RUN/export/gpu.txt"

pack() {  # the small files, one archive
  cp "$RUN"/*.log "$RUN/export/" 2>/dev/null
  tar czf "$OUT/eval-model-run.tar.gz" -C "$RUN/export" \
    $(cd "$RUN/export" && ls | grep -v '\.safetensors$')
}

python3 tools/default_model/train.py --preset eval --no-export --out "$RUN" ${TRAIN_ARGS:-} 2>&1 | tee "$RUN/train.log"
if [ "${PIPESTATUS[0]}" != 0 ]; then
  cp "$RUN/train_log.json" "$RUN/export/" 2>/dev/null
  pack
  echo "run_gpu.sh: training failed"
  exit 1
fi
python3 tools/default_model/train.py --preset eval --export-from "$RUN" --out "$RUN/export" 2>&1 | tee "$RUN/export.log"
if [ "${PIPESTATUS[0]}" != 0 ]; then
  split -b 15000000 "$RUN/trained_bf16.pt" "$OUT/trained_bf16.pt.part-"
  cp "$RUN/train_log.json" "$RUN/export/"
  pack
  echo "run_gpu.sh: export failed; the trained weights are in $OUT/trained_bf16.pt.part-*"
  exit 1
fi
python3 tools/eval_model/reference_perplexity.py --model models/arbor-tiny-sotu \
  --file tests/fixtures/eval-model/heldout.txt --ctx ${REF_CTX:-128 512 1024} --out "$RUN/export/shipped_heldout.json" \
  2>&1 | tee "$RUN/shipped.log" || echo "run_gpu.sh: the shipped model's reference perplexity failed"
mv "$RUN"/export/*.safetensors "$OUT/"
pack
ls -la "$OUT"
