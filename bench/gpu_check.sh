#!/usr/bin/env bash
# `make gpu-check`: everything zfbench can check on an NVIDIA GPU, in one command, on a
# fresh clone (issue 14, item 5). Uses the python that already holds a CUDA torch
# (GPU_PY, default python3; no venv, nothing of torch installed), the pure-Python
# dependencies it lacks from ./wheels (`make wheels` on a machine with a package index)
# or else from the index (into .gpu-site, on PYTHONPATH), and this checkout installed
# into that python in editable mode without dependencies (`pip install --no-deps -e .`,
# as `make setup` does in .venv): pyproject's package-dir maps real/, sims/ and analysis/
# to zfbench.real, .sims and .analysis, so the commands and the tests import this
# checkout's sources (any Python 3.10+).
# Writes bench/results/gpu/<gpu-name>/: machine.txt (nvidia-smi, torch, CPU), and per
# step its log and files:
#   cuda_tests.log             tests/test_cuda.py (CUDA against the CPU engine, resume,
#                              step accounting, bf16 staging)
#   run_default/               python -m zfbench.run --device cuda (all four strategies)
#   run_<model>/               the same at a real size: MODEL (default qwen2.5-1.5b) full
#                              depth, bf16, seq SEQ (default 1024), STEPS steps (default 12)
#   profile/                   python -m zfbench.run --profile at that size
#   predict/                   python -m zfbench.predict --from-run run_<model>: ZenFlow
#                              predicted from the ZeRO-Offload row, beside the measured one
#   contention/                bench/link_host_contention.py: host AdamW and the links side
#                              by side on page-locked buffers (about 15 s on one H100)
#   chunk_size/                bench/host_chunk_size.py: the host AdamW whole, with the wire,
#                              and in the engine's chunks of 1M-64M elements, on half the
#                              cores and on all (what the chunking costs; about 30 s)
#   validate/                  python -m zfbench.validate --device cuda: engine against
#                              simulator on the GPU (VALIDATE_MIN minutes at most, default 1.5:
#                              one shape; more with a longer device lease)
#   op_efficiency/             bench/op_efficiency.py: GEMM, attention and element-wise
#                              efficiency at fine-tuning token counts (qwen2.5-1.5b and
#                              llama2-7b shapes), beside the GPU's measured peaks and its
#                              launch floor (issue 44)
#   reference_step/            bench/reference_step.py: a plain-PyTorch step (AdamW on the
#                              device) beside the engine's device strategy, MODEL at SEQ,
#                              micro-batch 1 and 4, with a profile of each and a Chrome
#                              trace of both at batch 1 (issue 45)
#   kernel_census/             bench/kernel_census.py: the kernels one decoder layer launches
#                              and the host time to issue them (one- and two-layer slices of
#                              llama2-7b, qwen2.5-1.5b and opt-1.3b at micro-batch 1)
#   deepspeed_side/            bench/ds_gpu_side.py: DeepSpeed 0.19.5's ZeRO-Offload and
#                              overlapped ZenFlow beside zfbench's, MODEL at SEQ, bf16,
#                              micro-batch 1, the same config (issue 45); DeepSpeed comes
#                              from ./wheels/deepspeed (`make wheels-deepspeed`) when the
#                              python lacks it, its CPU Adam built there with g++/ninja;
#                              DS_TIMEOUT_S (default 600) bounds each engine's process
#   ds_window_copy/            bench/ds_window_copy.py: DeepSpeed's ZenFlow window-end copy
#                              (its fp32 master into the GPU's bf16 weights) timed as it runs
#                              and part by part, on MODEL's parameters (issue 44/45)
#   ds_window_copy_faults/     bench/window_copy_faults.py (with ONLY=ds_window_copy too):
#                              the fresh host temporary's page faults at MODEL's bf16 size,
#                              on DeepSpeed's training-side threads (half the cores) and all
#                              (the rate zfbench.sims.window_copy takes; the profile step's
#                              probe measures it on the profile's host threads)
#   status.txt                 each step's exit code (a failed step does not stop the rest)
# DEFAULT_STEPS=N gives run_default --steps N (the shape stays the GPU-sized default);
# GPU_PRESET (default: the preset of the GPU torch names, else h100-sxm) is predict's --gpu.
# PACK=FILE.tgz packs bench/results/gpu/<gpu-name>/ into one file at the end (a lent
# machine whose files come back a few at a time). On a time-limited lease
# bench/gpu_calls.sh runs chosen steps in order under one budget, packing after each.
# ONLY="profile validate" runs only the named steps (cuda_tests op_efficiency
# reference_step kernel_census run_default run_model host_share profile predict contention
# chunk_size deepspeed_side ds_window_copy validate), e.g. to fit each call of a
# time-limited session.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${GPU_PY:-python3}
MODEL=${MODEL:-qwen2.5-1.5b}
SEQ=${SEQ:-1024}
# The whole check no longer fits one 10-minute device call: on one H200 it took 470 s
# with 8 steps and VALIDATE_MIN=1.5 (bench/results/gpu/NVIDIA-H200), before op_efficiency,
# reference_step and kernel_census. Split it with ONLY across calls; measured on one H200
# (2026-11-27): cuda_tests op_efficiency reference_step(failed early) run_model profile
# predict contention in 460 s at STEPS=12; reference_step + contention + kernel_census
# (micro-batch 1) in 142 s, install included (bench/results/gpu/NVIDIA-H200/2026-11-27).
STEPS=${STEPS:-12}
GPU_PRESET=${GPU_PRESET:-}  # default: the preset of the GPU torch names (else h100-sxm)
DEFAULT_STEPS=${DEFAULT_STEPS:-12}  # run_default's --steps (empty: the run's own, 30)
VALIDATE_MIN=${VALIDATE_MIN:-1.5}
DS_TIMEOUT_S=${DS_TIMEOUT_S:-600}  # deepspeed_side: each engine's process at most this long
ONLY=${ONLY:-}
PACK=${PACK:-}  # a .tgz path: the results folder packed into one file at the end
SUBDIR=${SUBDIR:-}  # results under bench/results/gpu/<gpu-name>/SUBDIR (a later session's)

if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu-check: $PY's torch sees no CUDA device; run this where one is (GPU_PY=... to pick the python)" >&2
  exit 2
fi
missing=$($PY - <<'PYEOF'
import importlib.util
need = {"numpy": "numpy", "pandas": "pandas", "matplotlib": "matplotlib", "simpy": "simpy",
        "tqdm": "tqdm", "pytest": "pytest", "hypothesis": "hypothesis"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PYEOF
)
SITE=""
if [ -n "$missing" ]; then
  SITE="$PWD/.gpu-site"
  if [ -d wheels ]; then
    echo "gpu-check: installing $missing from ./wheels into $SITE"
    $PY -m pip install -q --no-index --find-links wheels --target "$SITE" $missing || {
      echo "gpu-check: ./wheels lacks some of: $missing (make wheels carries the pure-Python ones; numpy, pandas and matplotlib must come with the GPU's python)" >&2; exit 2; }
  else
    echo "gpu-check: installing $missing from the package index into $SITE"
    $PY -m pip install -q --target "$SITE" $missing || {
      echo "gpu-check: no package index here: run 'make wheels' on a machine with one and copy ./wheels" >&2; exit 2; }
  fi
fi
[ -z "$SITE" ] || export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
this_checkout() {  # zfbench, zfbench.real, .sims and .analysis resolve to this checkout
  $PY - "$PWD" <<'PYEOF'
import importlib.util, pathlib, sys
root = pathlib.Path(sys.argv[1]).resolve()
want = {"zfbench": "zfbench", "zfbench.real": "real", "zfbench.sims": "sims",
        "zfbench.analysis": "analysis"}
def origin(name):
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        return None
    return pathlib.Path(spec.origin).resolve() if spec and spec.origin else None
sys.exit(0 if all(origin(n) == root / f / "__init__.py" for n, f in want.items()) else 1)
PYEOF
}
if ! this_checkout; then
  echo "gpu-check: installing this checkout into $PY (pip install --no-deps -e .)"
  FROM=()
  [ -d wheels ] && FROM=(--no-index --find-links wheels)
  # the python's own setuptools (>= 64) builds it; else pip fetches one (./wheels or index)
  $PY -m pip install -q ${FROM[@]+"${FROM[@]}"} --no-deps --no-build-isolation -e . 2>/dev/null ||
    $PY -m pip install -q ${FROM[@]+"${FROM[@]}"} --no-deps -e . || {
      echo "gpu-check: could not install this checkout into $PY (it needs setuptools >= 64: 'make wheels' carries it)" >&2; exit 2; }
  this_checkout || {
    echo "gpu-check: $PY does not import zfbench.real from this checkout after the install" >&2; exit 2; }
fi
export PYTHONUNBUFFERED=1
NAME=$($PY -c "import torch, re; print(re.sub(r'[^A-Za-z0-9._-]+', '-', torch.cuda.get_device_name()))")
[ -n "$GPU_PRESET" ] || GPU_PRESET=$($PY -c "import torch; from zfbench.run.report import gpu_preset; print(gpu_preset(torch.cuda.get_device_name()) or 'h100-sxm')")
OUT="bench/results/gpu/$NAME${SUBDIR:+/$SUBDIR}"
mkdir -p "$OUT"
[ -n "$ONLY" ] || : > "$OUT/status.txt"  # ONLY: append to the earlier steps' codes
touch "$OUT/status.txt"
{ nvidia-smi 2>&1 || true
  $PY -c "import torch, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', platform.python_version())"
  lscpu 2>/dev/null | grep -E 'Model name|^CPU\(s\)' || true; } > "$OUT/machine.txt"

step() {  # step NAME COMMAND...: run, log, record the exit code, go on
  local name=$1; shift
  local key=$name
  case $name in run_default) ;; run_*) key=run_model ;; ds_window_copy_*) key=ds_window_copy ;; esac
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $key "* ]]; then return 0; fi
  echo "== gpu-check: $name: $*"
  "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name $rc" >> "$OUT/status.txt"
}
step cuda_tests $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py
step op_efficiency $PY bench/op_efficiency.py --out "$OUT/op_efficiency"
step reference_step $PY bench/reference_step.py --model "$MODEL" --seq "$SEQ" --traces \
  --out "$OUT/reference_step"
step kernel_census $PY bench/kernel_census.py --micro-batches 1 --seq "$SEQ" \
  --out "$OUT/kernel_census"
STEPS_FLAG=()
[ -z "$DEFAULT_STEPS" ] || STEPS_FLAG=(--steps "$DEFAULT_STEPS")
step run_default $PY -m zfbench.run --device cuda ${STEPS_FLAG[@]+"${STEPS_FLAG[@]}"} --quiet \
  --out "$OUT/run_default"
step "run_$MODEL" $PY -m zfbench.run --device cuda --model "$MODEL" --seq "$SEQ" \
  --precision bf16 --steps "$STEPS" --quiet --out "$OUT/run_$MODEL"
# ZeRO-Offload's host step on half the cores (the engine's split before session 16):
# beside run_model's zero-offload row (all the cores, as DeepSpeed) it says how much the
# earlier GPU runs' ZenFlow speedups were overstated (docs/results.md, session 16)
HALF=$(( ( $(nproc) + 1 ) / 2 ))
step host_share $PY -m zfbench.run --device cuda --model "$MODEL" --seq "$SEQ" \
  --precision bf16 --strategy zero-offload --host-threads "$HALF" --steps "$STEPS" --quiet \
  --out "$OUT/host_share"
step profile $PY -m zfbench.run --device cuda --model "$MODEL" --seq "$SEQ" \
  --precision bf16 --strategy zenflow --steps 4 --profile --quiet --out "$OUT/profile"
step predict $PY -m zfbench.predict --from-run "$OUT/run_$MODEL" --gpu "$GPU_PRESET" \
  --quiet --out "$OUT/predict"
step contention $PY bench/link_host_contention.py --out "$OUT/contention"
step chunk_size $PY bench/host_chunk_size.py --elems 176M --threads "$HALF,$(nproc)" \
  --out "$OUT/chunk_size"
if { [ -z "$ONLY" ] || [[ " $ONLY " == *" deepspeed_side "* ]]; } &&
   ! $PY -c "import deepspeed" 2>/dev/null && [ -d wheels/deepspeed ]; then
  DS_SITE="$PWD/.gpu-site"  # the carried wheels, no index: `make wheels-deepspeed`
  echo "gpu-check: installing DeepSpeed from ./wheels/deepspeed into $DS_SITE"
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$DS_SITE" \
    wheels/deepspeed/*.whl && export PYTHONPATH="$DS_SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
step deepspeed_side $PY bench/ds_gpu_side.py --model "$MODEL" --seq "$SEQ" \
  --timeout-s "$DS_TIMEOUT_S" --out "$OUT/deepspeed_side"
ELEMS=$($PY -c "from zfbench.core.models import get_model; print(get_model('$MODEL').total_params)")
step ds_window_copy $PY bench/ds_window_copy.py --elems "$ELEMS" --out "$OUT/ds_window_copy"
step ds_window_copy_faults $PY bench/window_copy_faults.py --sizes-mb $(( ELEMS * 2 / 1000000 )) \
  --threads "$HALF" "$(nproc)" --out "$OUT/ds_window_copy_faults"
step validate $PY -m zfbench.validate --device cuda --budget-min "$VALIDATE_MIN" --quiet \
  --out "$OUT/validate"
echo "== gpu-check: wrote $OUT (exit codes in status.txt)"
cat "$OUT/status.txt"
if [ -n "$PACK" ]; then  # one file to carry back from a lent machine
  tar czf "$PACK" -C "$(dirname "$OUT")" "$(basename "$OUT")" && echo "== gpu-check: packed $OUT into $PACK"
fi
! grep -qv ' 0$' "$OUT/status.txt"
