#!/usr/bin/env bash
# The accelerator measurements docs/results.md reports, on the GPU (or TPU) this runs on:
#   0. the kernels' tilings tuned on this chip (bench kernels --tune: the fastest of a grid per
#      kernel, pass and length, written to minilm_jax/kernels/tuned_tilings.json, which the steps
#      below read; a copy in RESULTS_DIR);
#   1. the fused kernels checked against the explicit path and timed, each beside its own bound on
#      the chip (python -m minilm_jax.bench kernels);
#   2. the distillation step at the paper's shapes (BERT-base shape -> STUDENTS, batch 256, bfloat16)
#      against torch.compile, one (student, length) per process, so that each row's measured peak
#      memory (bench distill's ours_device_peak_gib) is its own; and where its time goes (a
#      profile of three steps: the table in distill.log and profile_<student>_<length>/parts.json);
#      at the first length also the train program, two windows of TRAIN_STEPS steps (default 100).
# Usage: bash launch/chip_benchmarks.sh RESULTS_DIR [STUDENTS (default 6x384)] [LENGTHS (default "512 128")]
set -uo pipefail
out=${1:?usage: bash launch/chip_benchmarks.sh RESULTS_DIR [STUDENTS] [LENGTHS]}
mkdir -p "$out"
python=${PYTHON:-python3}
# STAGE_TIMEOUT_S: seconds each program may run (0, the default: no limit).
limit=${STAGE_TIMEOUT_S:-0}
# JAX allocates from a share of the GPU's memory that it takes at start; the PyTorch peers, in the
# same process, allocate from the rest.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.45} PYTHONUNBUFFERED=1
status=0
timeout "$limit" "$python" -m minilm_jax.bench kernels --tune --seq_len 128,512 --batch 256 --dtype bfloat16 --repeats 5 \
  --json "$out/tuning.json" >"$out/tuning.log" 2>&1 || status=1
cp minilm_jax/kernels/tuned_tilings.json "$out/" 2>/dev/null
tail -n 3 "$out/tuning.log"
timeout "$limit" "$python" -m minilm_jax.bench kernels --seq_len 128,512 --batch 256 --dtype bfloat16 --repeats 20 --json "$out/kernels.json" \
  >"$out/kernels.log" 2>&1 || status=1
tail -n 5 "$out/kernels.log"
read -r -a lengths <<<"${3:-512 128}"
for student in ${2:-6x384}; do
  for length in "${lengths[@]}"; do
    train_steps=0
    [[ $length == "${lengths[0]}" ]] && train_steps=${TRAIN_STEPS:-100}
    timeout "$limit" "$python" -m minilm_jax.bench distill --case paper --student "$student" --seq_len "$length" --dtype bfloat16 \
      --peers compile --train_steps "$train_steps" --repeats 10 --json "$out/distill_${student}_${length}.json" \
      --profile "$out/profile_${student}_${length}" \
      >>"$out/distill.log" 2>&1 || status=1
    tail -n 3 "$out/distill.log"
  done
done
exit $status
