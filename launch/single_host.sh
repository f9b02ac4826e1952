#!/usr/bin/env bash
# Starts a minilm_jax program on this host. KEY=VALUE arguments come first, then the program's flags:
#   PROGRAM=train     which program (python -m minilm_jax.$PROGRAM)
#   CPU_DEVICES=N     split the CPU into N fake devices (exercises the data-parallel path without accelerators)
# Example:
#   launch/single_host.sh CPU_DEVICES=8 --config configs/demo.py --workdir workdirs/demo8 --config.batch_size=32
set -euo pipefail
PROGRAM=train
CPU_DEVICES=""
while [[ $# -gt 0 && "$1" == *=* && "$1" != --* ]]; do
  case "${1%%=*}" in
    PROGRAM) PROGRAM="${1#*=}" ;;
    CPU_DEVICES) CPU_DEVICES="${1#*=}" ;;
    *) echo "error: unknown setting ${1%%=*}: use PROGRAM= or CPU_DEVICES=" >&2; exit 2 ;;
  esac
  shift
done
if [[ -n "$CPU_DEVICES" ]]; then
  export JAX_PLATFORMS=cpu
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=${CPU_DEVICES}"
fi
exec python -m "minilm_jax.${PROGRAM}" "$@"
