#!/usr/bin/env bash
# Starts a minilm_jax program on every worker of a Cloud TPU pod slice. Each worker runs one
# process; jax.distributed.initialize() finds the coordinator, process count and index from the
# TPU metadata. The repository must be checked out and installed (pip install -e ".[tpu]") at
# REPO_DIR on every worker, and the workdir must be shared storage (a gs:// bucket or a mounted disk).
#
#   launch/tpu_pod.sh TPU_NAME=my-v4-32 ZONE=us-central2-b [PROJECT=my-project] [REPO_DIR=minilm_jax] \
#       [PROGRAM=train] --config configs/minilm_6x384.py --workdir gs://bucket/workdirs/minilm_6x384
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"
TPU_NAME=""
ZONE=""
PROJECT=""
REPO_DIR=minilm_jax
PROGRAM=train
parse_settings "TPU_NAME ZONE PROJECT REPO_DIR PROGRAM" "$@"
require_program "$PROGRAM"
if [[ -z "$TPU_NAME" || -z "$ZONE" ]]; then
  echo "error: name the pod slice: TPU_NAME=<name> ZONE=<zone>" >&2
  exit 2
fi
command="cd ${REPO_DIR} && MINILM_DISTRIBUTED=1 python -m minilm_jax.${PROGRAM} $(printf '%q ' "${PROGRAM_ARGS[@]}")"
project_flag=()
if [[ -n "$PROJECT" ]]; then
  project_flag=(--project="$PROJECT")
fi
exec gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${project_flag[@]}" --worker=all --command="$command"
