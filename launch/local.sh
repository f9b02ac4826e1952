#!/usr/bin/env bash
# Starts a minilm_jax program on this machine: one process, or NUM_PROCESSES processes joined by
# JAX's distributed runtime on loopback (gloo collectives on CPU), each with CPU_DEVICES fake CPU
# devices: the multi-host code path without a cluster. If any process fails, the others are
# stopped and the script fails; rerunning the same command resumes from the last checkpoint.
#
#   launch/local.sh [NUM_PROCESSES=2] [CPU_DEVICES=4] [PORT=12355] [PROGRAM=train] [INIT_TIMEOUT=60] \
#       --config configs/demo.py --workdir workdirs/demo_2x4 [--config.<field>=<value> ...]
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"
NUM_PROCESSES=1
CPU_DEVICES=""
PORT=12355
PROGRAM=train
INIT_TIMEOUT=60
parse_settings "NUM_PROCESSES CPU_DEVICES PORT PROGRAM INIT_TIMEOUT" "$@"
require_count NUM_PROCESSES "$NUM_PROCESSES"
[[ -z "$CPU_DEVICES" ]] || require_count CPU_DEVICES "$CPU_DEVICES"
require_count PORT "$PORT"
require_count INIT_TIMEOUT "$INIT_TIMEOUT"
require_program "$PROGRAM"
if [[ -n "$CPU_DEVICES" ]]; then
  export JAX_PLATFORMS=cpu
  export JAX_NUM_CPU_DEVICES="$CPU_DEVICES"  # the distributed CPU client reads this, not the XLA flag
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=${CPU_DEVICES}"
fi
if ((NUM_PROCESSES == 1)); then
  exec python -m "minilm_jax.${PROGRAM}" "${PROGRAM_ARGS[@]}"
fi

pids=()
stop_all() {  # $1: the signal. TERM lets every process save the same step (preemption); KILL ends a broken run.
  for pid in "${pids[@]}"; do kill "-$1" "$pid" 2>/dev/null || true; done
}
trap 'stop_all TERM; wait; exit 143' TERM INT
for ((i = 0; i < NUM_PROCESSES; i++)); do
  MINILM_DISTRIBUTED=1 MINILM_COORDINATOR="127.0.0.1:${PORT}" MINILM_NUM_PROCESSES="$NUM_PROCESSES" \
    MINILM_PROCESS_ID="$i" MINILM_INIT_TIMEOUT="$INIT_TIMEOUT" \
    python -m "minilm_jax.${PROGRAM}" "${PROGRAM_ARGS[@]}" &
  pids+=("$!")
done
for ((n = 0; n < NUM_PROCESSES; n++)); do
  if ! wait -n; then
    echo "error: a process of the run failed; stopping the others (rerun the same command to resume)" >&2
    stop_all KILL  # the survivors would wait forever in collectives with the failed one
    wait || true
    exit 1
  fi
done
