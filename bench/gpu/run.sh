#!/usr/bin/env bash
# The GPU machine's one call: build mm with CUDA against that machine's own torch, run the tests
# labelled `cuda`, and the GPU benchmarks, each against its baseline measured in the same run;
# a table goes to $OUT/gpu_bench.md (and stdout). Budget: under 8 minutes on one H200.
#
#   1. ~1B Qwen2-architecture decoder (hidden 2048, 16 layers, 16 heads / 4 KV, vocab 151936,
#      tied), bf16 autocast, one row of 4096 tokens packed with 4 documents (varlen flash):
#      MFU = achieved training FLOP/s / `mm bench peak --dtype bf16` on the same GPU. Goal >= 50%.
#   2. Qwen2-VL-2B-architecture full fine-tune step (bench/gpu/qwen2vl_2b_step.yaml: random
#      weights, 8 samples of one 448x448 image + text, bf16) in mm (bench/vl_step) against
#      Hugging Face transformers + torch with SDPA on the same batches (bench/gpu/vl_step_hf.py).
#      Goal >= 1.5x its step throughput.
#   3. Wan2.1 DiT train step (1.3B width, 4 of its 30 blocks, bf16) in mm (bench/dit_step)
#      against diffusers + torch on the same weights and inputs (bench/dit_step_baseline.py;
#      diffusers carried in .gpu-deps/py when the machine lacks it).
#   4. Causal attention per token, forward + backward, bf16, at 4k / 16k / 64k tokens on one GPU
#      (bench/cp_attention --algo one): the baseline that Ulysses and ring runs on several GPUs
#      compare with (NCCL puts one rank per GPU, so one GPU has no context-parallel row).
#
# On the device:  bash bench/gpu/run.sh     (with carry [".gpu-deps"] from bench/gpu/prepare_deps.sh)
# Dry run here:   DRY_RUN=1 bash bench/gpu/run.sh   (the existing ./build, tiny sizes, the CPU)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out/gpu_bench}"
mkdir -p "$OUT" out/gpu_bench
DRY=${DRY_RUN:-0}
T0=$(date +%s)
TABLE="$OUT/gpu_bench.md"
log() { echo "[gpu $(($(date +%s) - T0))s] $*"; }
row() { echo "| $1 | $2 | $3 | $4 |" >> "$TABLE"; }

if [[ "$DRY" == 1 ]]; then
  BUILD=${BUILD:-build}
  PY=${PY:-.venv/bin/python}
  DEVICE=cpu
else
  BUILD=${BUILD:-build-gpu}
  PY=${PY:-python3}
  DEVICE=cuda
  # Debian's headers and libraries that the machine lacks, unpacked from the carried .debs.
  DEPS="$ROOT/.gpu-deps/root"
  if [[ -d .gpu-deps/debs && ! -d "$DEPS/usr" ]]; then
    log "unpacking $(ls .gpu-deps/debs | wc -l) .debs"
    "$PY" bench/gpu/unpack_debs.py "$DEPS" .gpu-deps/debs/*.deb
  fi
  LIB="$DEPS/usr/lib/x86_64-linux-gnu"
  export PKG_CONFIG_LIBDIR="$LIB/pkgconfig:$DEPS/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$DEPS"
  export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  PKGCONF=$(command -v pkg-config || echo "$DEPS/usr/bin/pkgconf")
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    log "configure (torch from $PY, CUDA from the machine's nvcc)"
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMM_PYTHON="$PY" -DMM_WITH_VIDEO=OFF -DMM_WITH_CAIRO=OFF \
      -DPKG_CONFIG_EXECUTABLE="$PKGCONF" -DCMAKE_PREFIX_PATH="$DEPS/usr" \
      -DCMAKE_CXX_FLAGS="-isystem $DEPS/usr/include -isystem $DEPS/usr/include/x86_64-linux-gnu" \
      -DCMAKE_EXE_LINKER_FLAGS="-L$LIB -Wl,-rpath,$LIB" -DCMAKE_SHARED_LINKER_FLAGS="-L$LIB -Wl,-rpath,$LIB" \
      -DCMAKE_MODULE_LINKER_FLAGS="-L$LIB -Wl,-rpath,$LIB" > "$OUT/configure.log" 2>&1 ||
      { tail -30 "$OUT/configure.log"; exit 1; }
  fi
  log "build"
  cmake --build "$BUILD" -j "$(nproc)" --target mm mm_cuda_tests train_step vl_step dit_step cp_attention > "$OUT/build.log" 2>&1 ||
    { grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
fi
"$BUILD/mm" version | tee "$OUT/version.txt"

echo "# GPU run $(date -u +%Y-%m-%dT%H:%MZ)" > "$TABLE"
echo >> "$TABLE"
echo '```' >> "$TABLE"
cat "$OUT/version.txt" >> "$TABLE"
echo '```' >> "$TABLE"
echo >> "$TABLE"
echo "| check | result | baseline (same run) | ratio / goal |" >> "$TABLE"
echo "|---|---|---|---|" >> "$TABLE"

# --- tests labelled cuda (each skips without a device)
log "ctest -L cuda"
if [[ "$DRY" == 1 ]]; then CT_ARGS=(-R "Cuda\\."); else CT_ARGS=(-L cuda); fi
(cd "$BUILD" && ctest "${CT_ARGS[@]}" --output-on-failure --timeout 300) > "$OUT/ctest_cuda.log" 2>&1 || true
summary=$(grep -E "tests passed|tests failed" "$OUT/ctest_cuda.log" | tail -1)
skipped=$(grep -c "(Skipped)" "$OUT/ctest_cuda.log" || true)
row "ctest -L cuda" "${summary:-no summary (see ctest_cuda.log)}, $skipped skipped" "-" "all pass"
grep -E "rel err|Failed|\*\*\*" "$OUT/ctest_cuda.log" | head -20 || true

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2" | head -1; }

# --- 1. ~1B decoder MFU
if [[ "$DRY" == 1 ]]; then
  PEAK_ARGS=(--size 512 --dtype fp32); LM=(--hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 1000 --seq 256 --batch 1 --docs 4 --steps 3 --warmup 1 --precision fp32)
else
  PEAK_ARGS=(--size 8192 --dtype bf16 --reps 10); LM=(--hidden 2048 --intermediate 5632 --layers 16 --heads 16 --kv-heads 4 --vocab 151936 --seq 4096 --batch 1 --docs 4 --steps 10 --warmup 3 --precision bf16)
fi
log "mm bench peak ${PEAK_ARGS[*]}"
peak_line=$("$BUILD/mm" bench peak "${PEAK_ARGS[@]}" --device "$DEVICE" | tee -a "$OUT/peak.log")
peak=$(sed -n 's/.*: \([0-9.]*\) TFLOP\/s.*/\1/p' <<<"$peak_line")
log "train_step ${LM[*]}"
lm_line=$("$BUILD/train_step" --device "$DEVICE" "${LM[@]}" 2>&1 | tee "$OUT/train_step.log" | grep RESULT || true)
tflops=$(field tflops "$lm_line")
if [[ -n "$tflops" && -n "$peak" ]]; then
  mfu=$("$PY" -c "print(f'{100*$tflops/$peak:.1f}')")
  row "~1B Qwen2 decoder, bf16, 4096 tokens packed (4 docs), step $(field step_ms "$lm_line") ms, $(field params "$lm_line") params" \
      "$tflops TFLOP/s, $(field tokens_per_s "$lm_line") tokens/s" "mm bench peak: $peak TFLOP/s" "MFU $mfu% (goal >= 50%)"
else
  row "~1B Qwen2 decoder" "failed (see train_step.log)" "peak ${peak:-?}" "-"
  tail -5 "$OUT/train_step.log"
fi

# --- 2. Qwen2-VL-2B step against transformers
VL_DATA=out/gpu_bench/vl
if [[ "$DRY" == 1 ]]; then
  N=8; SIZE=56; VL_CFG=examples/qwen2vl/tiny_fashion_mnist.yaml
  VL_SET=("data.processor.min_pixels=3136" "data.processor.max_pixels=3136" "training.micro_batch_size=4" "training.precision=fp32")
  STEPS=3; WARM=1; HF_PREC=fp32
else
  N=48; SIZE=448; VL_CFG=bench/gpu/qwen2vl_2b_step.yaml; VL_SET=(); STEPS=4; WARM=2; HF_PREC=bf16
fi
[[ -s "$VL_DATA/train.jsonl" ]] || "$PY" bench/gpu/make_vl_data.py "$VL_DATA" --n "$N" --size "$SIZE"
rm -rf "$OUT/vl_dump"
log "vl_step (mm) $VL_CFG"
mm_vl=$(MM_BENCH_DUMP="$OUT/vl_dump" "$BUILD/vl_step" "$VL_CFG" "$VL_DATA" "$STEPS" "$WARM" 0 "$DEVICE" "${VL_SET[@]}" \
        2>&1 | tee "$OUT/vl_step.log" | grep RESULT || true)
log "vl_step_hf.py (transformers)"
hf_vl=$("$PY" bench/gpu/vl_step_hf.py "$OUT/vl_dump" --device "$DEVICE" --precision "$HF_PREC" --warmup 1 2>&1 |
        tee "$OUT/vl_step_hf.log" | grep RESULT || true)
mm_ms=$(field step_ms "$mm_vl"); hf_ms=$(field step_ms "$hf_vl")
if [[ -n "$mm_ms" && -n "$hf_ms" ]]; then
  ratio=$("$PY" -c "print(f'{$hf_ms/$mm_ms:.2f}')")
  row "Qwen2-VL-2B arch fine-tune step, same $STEPS batches (mm vision tower share: $(field vision_ms "$mm_vl") ms)" \
      "mm $mm_ms ms/step" "transformers + SDPA $hf_ms ms/step (loss $(field loss_first "$hf_vl"))" "${ratio}x (goal >= 1.5x)"
else
  row "Qwen2-VL-2B arch step" "mm: ${mm_ms:-failed}" "transformers: ${hf_ms:-failed}" "see vl_step*.log"
  tail -5 "$OUT/vl_step.log" "$OUT/vl_step_hf.log"
fi
# --- 3. Wan2.1 DiT train step against diffusers (diffusers is pure Python: carried in
# .gpu-deps/py by prepare_deps.sh when the machine lacks it)
[[ -d .gpu-deps/py ]] && export PYTHONPATH="$ROOT/.gpu-deps/py${PYTHONPATH:+:$PYTHONPATH}"
if "$PY" -c "import diffusers" 2>/dev/null; then
  if [[ "$DRY" == 1 ]]; then
    DIT=(--heads 2 --head-dim 32 --ffn 128 --layers 2 --text-dim 64 --size 8); DIT_PREC=fp32
    DIT_LABEL="tiny Wan DiT step (dry run)"
  else
    DIT=(--heads 12 --head-dim 128 --ffn 8960 --layers 4 --text-dim 4096 --text-len 512 --frames 21 --size 60 --batch 1); DIT_PREC=bf16
    DIT_LABEL="Wan2.1-1.3B-width DiT step (4 of 30 blocks, 21x60x60 latents = 18900 tokens, 512 text, bf16)"
  fi
  rm -rf "$OUT/dit"; mkdir -p "$OUT/dit"
  log "dit_step: prepare (${DIT[*]})"
  "$PY" bench/dit_step_baseline.py --prepare "$OUT/dit" --steps 3 --warmup 1 "${DIT[@]}" > "$OUT/dit_prepare.log" 2>&1
  mm_dit=$("$BUILD/dit_step" --dir "$OUT/dit" --steps 3 --warmup 1 --precision "$DIT_PREC" --device "$DEVICE" 2>&1 |
           tee "$OUT/dit_step.log" | grep RESULT || true)
  df_dit=$("$PY" bench/dit_step_baseline.py --dir "$OUT/dit" --steps 3 --warmup 1 --precision "$DIT_PREC" --device "$DEVICE" \
           "${DIT[@]}" 2>&1 | tee "$OUT/dit_step_diffusers.log" | grep RESULT || true)
  mm_ms=$(field step_ms "$mm_dit"); df_ms=$(field step_ms "$df_dit")
  if [[ -n "$mm_ms" && -n "$df_ms" ]]; then
    row "$DIT_LABEL" "mm $mm_ms ms/step (loss $(field loss_first "$mm_dit"))" \
        "diffusers $df_ms ms/step (loss $(field loss_first "$df_dit"))" "$("$PY" -c "print(f'{$df_ms/$mm_ms:.2f}x')")"
  else
    row "Wan2.1 DiT step" "mm: ${mm_ms:-failed}" "diffusers: ${df_ms:-failed}" "see dit_step*.log"
    tail -5 "$OUT/dit_step.log" "$OUT/dit_step_diffusers.log"
  fi
else
  row "Wan2.1 DiT step" "skipped" "diffusers not importable" "run bench/gpu/prepare_deps.sh"
fi

# --- 4. attention per token on one GPU (the context-parallel baseline)
if [[ "$DRY" == 1 ]]; then SEQS=(1024); CP_PREC=fp32; else SEQS=(4096 16384 65536); CP_PREC=bf16; fi
for S in "${SEQS[@]}"; do
  line=$("$BUILD/cp_attention" --algo one --seq "$S" --dtype "$CP_PREC" --device "$DEVICE" --iters 3 --warmup 1 2>&1 |
         tee -a "$OUT/cp_attention.log" | tail -1)
  row "causal attention fwd+bwd, $S tokens, 8/2 heads of 64, $CP_PREC, one process" "$(sed -E 's/.*, ([0-9.]+ us per token)/\1/' <<<"$line")" "-" "baseline for CP on several GPUs"
done

log "done"
echo
cat "$TABLE"
