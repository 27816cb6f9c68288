#!/usr/bin/env bash
# One call of a time-limited GPU lease: bench/gpu_check.sh's steps in the order given, each
# under its own time limit and all of them inside BUDGET seconds, with the results folder
# packed into PACK (a .tgz) after every step, so that what finished comes back even when a
# later step runs out of time. Session 26 ran the H200 checks this way (two calls of 343 and
# 405 s; bench/results/gpu/NVIDIA-H200/2026-11-28/README.md).
#
#   BUDGET=540 SUBDIR=2026-11-28 PACK=$OUT/gpu.tgz \
#     bash bench/gpu_calls.sh cuda_tests:90 deepspeed_side:330 reference_step:90 run_model:200
#
# Each argument is STEP:MAX_SECONDS with STEP one of gpu_check.sh's ONLY names; a step is
# skipped once fewer than 40 s of the budget are left, and cut to what is left. Each step's
# output goes to STEP.out beside PACK. The other gpu_check.sh variables (STEPS, MODEL,
# DS_TIMEOUT_S, VALIDATE_MIN, ...) pass through. Exit code: gpu_check.sh's last.
set -u
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-540}
PACK=${PACK:?PACK=FILE.tgz: where the results folder is packed after each step}
SUBDIR=${SUBDIR:?SUBDIR: the results folder under bench/results/gpu/<gpu-name>/}
export SUBDIR
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
pack() {
  local dirs
  dirs=$(cd bench/results/gpu && ls -d */"$SUBDIR" 2>/dev/null)
  [ -z "$dirs" ] || tar czf "$PACK" -C bench/results/gpu $dirs
}
rc=0
for spec in "$@"; do
  name=${spec%%:*}; max=${spec##*:}
  left=$(( BUDGET - $(elapsed) ))
  if [ "$left" -lt 40 ]; then echo "[gpu_calls] skip $name: $left s of the budget left"; continue; fi
  limit=$(( max < left - 15 ? max : left - 15 ))
  echo "[gpu_calls] $name (at most $limit s) at $(elapsed) s"
  ONLY="$name" timeout -k 5 "$limit" bash bench/gpu_check.sh > "$(dirname "$PACK")/$name.out" 2>&1
  rc=$?
  echo "[gpu_calls] $name exit $rc at $(elapsed) s"
  pack
done
exit $rc
