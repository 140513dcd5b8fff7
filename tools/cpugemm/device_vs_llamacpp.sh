#!/usr/bin/env bash
# Issue 22's comparison on the GPU lease host's CPU (AVX-512 BF16 Xeon; the GPU is not used):
# arbor `bench --cpu-gemm bf16` against llama.cpp's llama-bench on a random-bf16 GGUF of the same
# shape (Llama-3.2-1B), 2 threads pinned to two distinct physical cores, alternated so drift shows.
# Run from a checkout that has bench/configs/llama-3.2-1b.json, with $B holding: arbor, llama-bench,
# lib.tar (the shared libraries the host lacks: pcre2, utf8proc, fmt, edit, tinfo, bsd, md, gomp) and
# make_gguf.py; logs go to $OUT. PROMPTS (default "128 512"), PASSES (2), REPS (2), BUDGET_S (140):
# a pass is arbor at each prompt then llama-bench at all of them; a step is skipped once the run
# has used BUDGET_S seconds (the device round's limit). DEADLINE_S (unset): every process is killed
# at that many seconds into the run, so the logs come back.
# CONCURRENT=1: for each prompt, arbor and llama-bench run at the same time, each on its own two
# physical cores (for a round too short to run a 2048-token prompt through both one after the other;
# each tool's figure then includes whatever the other costs it through the shared L3 and clocks).
set -uo pipefail
PROMPTS=${PROMPTS:-"128 512"}; PASSES=${PASSES:-2}; REPS=${REPS:-2}; BUDGET_S=${BUDGET_S:-140}
CONCURRENT=${CONCURRENT:-0}; DEADLINE_S=${DEADLINE_S:-100000}
CFG=${CFG:-bench/configs/llama-3.2-1b.json}
T0=$SECONDS
left() { local t=$((DEADLINE_S - (SECONDS - T0))); echo $((t > 1 ? t : 1)); }  # seconds to the deadline
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/steps.log"; }
mkdir -p "$B/lib" && tar -xf "$B/lib.tar" -C "$B/lib"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
lscpu > "$OUT/lscpu.txt"; lscpu -e > "$OUT/lscpu-e.txt" 2>&1
grep -m1 '^flags' /proc/cpuinfo > "$OUT/cpuflags.txt"
for f in avx512f avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16 avx_vnni; do
  grep -qw "$f" "$OUT/cpuflags.txt" || log "WARNING: CPU lacks $f (llama-bench is built for it)"
done
# Two logical CPUs on two different physical cores (the highest core ids: away from cpu 0).
CPUS=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | tail -2 | cut -d, -f1 | paste -sd,)
[ -n "$CPUS" ] || CPUS=0,1
LCPUS=$CPUS
if [ "$CONCURRENT" = 1 ]; then  # llama-bench on the two cores below arbor's
  LCPUS=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | tail -4 | head -2 | cut -d, -f1 | paste -sd,)
fi
log "arbor pinned to cpus $CPUS, llama-bench to $LCPUS; $(uptime)"
top -bn1 | head -20 > "$OUT/top-start.txt"
ldd "$B/arbor" > "$OUT/ldd-arbor.txt" 2>&1; ldd "$B/llama-bench" > "$OUT/ldd-llama-bench.txt" 2>&1

G=${TMPDIR:-/tmp}/lcpp-llama-1b-bf16.gguf
log "make_gguf"
python3 "$B/make_gguf.py" --config "$CFG" --out "$G" 2>&1 | tee -a "$OUT/steps.log"

run_arbor() {  # prompt tag
  local P=$1 f="$OUT/arbor-p$1-$2.log"
  if (( SECONDS - T0 > BUDGET_S )); then log "skip arbor P=$P $2 (budget)"; return; fi
  log "arbor P=$P $2"
  timeout "$(left)" taskset -c "$CPUS" "$B/arbor" bench --device cpu --config "$CFG" --dummy-weights --threads 2 --prompt-tokens "$P" \
    --chunk 512 --decode-tokens 1 --reps "$REPS" --cpu-gemm bf16 > "$f" 2>&1
  log "  rc=$? $(grep -E '^prefill' "$f" | head -2 | tr '\n' ' ')"
}
run_llama() {  # tag [prompts]
  local f="$OUT/llama-$1" PS=${2:-${PROMPTS// /,}}
  if (( SECONDS - T0 > BUDGET_S )); then log "skip llama-bench $1 (budget)"; return; fi
  log "llama-bench -p $PS $1"
  timeout "$(left)" taskset -c "$LCPUS" "$B/llama-bench" -m "$G" -t 2 -p "$PS" -n 0 -r "$REPS" -o json -oe md > "$f.json" 2> "$f.err"
  local rc=$?
  log "  rc=$rc $(grep -E '\| *pp[0-9]+' "$f.err" | awk -F'|' '{print $(NF-2) $(NF-1)}' | tr -s ' ' | tr '\n' ';')"
  if [ $rc -ne 0 ] && [ ! -e "$G.none" ]; then  # the vocabulary may be what it rejects: the fallback
    tail -5 "$f.err" | tee -a "$OUT/steps.log"
    log "retry with --vocab none"
    python3 "$B/make_gguf.py" --config "$CFG" --out "$G" --vocab none >> "$OUT/steps.log" 2>&1 && touch "$G.none"
    taskset -c "$LCPUS" "$B/llama-bench" -m "$G" -t 2 -p "$PS" -n 0 -r "$REPS" -o json -oe md > "$f-none.json" 2> "$f-none.err"
    log "  rc=$? (vocab none)"
  fi
}
for pass in $(seq 1 "$PASSES"); do
  if [ "$CONCURRENT" = 1 ]; then
    for P in $PROMPTS; do
      run_arbor "$P" "pass$pass-concurrent" &
      run_llama "p$P-pass$pass-concurrent" "$P" &
      wait
    done
  else
    for P in $PROMPTS; do run_arbor "$P" "pass$pass"; done
    run_llama "pass$pass"
  fi
done
top -bn1 | head -20 > "$OUT/top-end.txt"
rm -f "$G" "$G.none"
log "done"
