"""Measured stall reduction: `zero-offload` vs `zenflow` on this machine, side by side.

Scenario: the default shape of `python -m zfbench.run` (tinyllama-1.1b[1L], batch 1 x seq
4; precision as given, else measured as the run measures it; it also reports
forward+backward and host AdamW seconds per step). In one process, per repeat: ZeRO-Offload,
ZenFlow on the engine's column-major weights, ZenFlow on row-major weights
(`zfbench.column_major: false`, the layout before the change) and the `device` strategy
(one full device AdamW pass over the same weights), the order reversed every other
repeat so drift on a shared machine hits all alike. `zenflow_device_work_s` is ZenFlow's
device-side update per step (column gather, AdamW on the selected columns, scatter, and
applying host updates): its ratio to the device strategy's full AdamW pass says what the
column work costs. Each run's steady-state step time and stall fraction come from the
same breakdown code as every other figure. Each setting (plain, and
`THP_MEM_ALLOC_ENABLE=1` for torch's huge-page allocation) runs in its own subprocess,
since the variable must be set before torch allocates.

    python bench/engine_overlap.py                 # writes bench/results/engine_overlap.*
    python bench/engine_overlap.py --steps 40 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

STRATEGIES = ("zero-offload", "zenflow")
# (label, strategy, zfbench.column_major): what one repeat runs
RUNS = (("zero-offload", "zero-offload", True), ("zenflow", "zenflow", True),
        ("zenflow-row-major", "zenflow", False), ("device", "device", True))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zfbench.core.memory_model import element_bytes  # noqa: E402
from zfbench.core.provenance import machine  # noqa: E402
from zfbench.run.defaults import DEFAULT_SEQ  # noqa: E402


def measure(args) -> list[dict]:
    import torch

    from zfbench.analysis.breakdown import summarize
    from zfbench.real.memory import check_fits
    from zfbench.real.runner import RunSpec, train

    base = dict(model=args.model, layers=args.layers, micro_batch=args.batch, seq=args.seq,
                steps=args.steps, device="cpu", precision=args.precision)
    spec = RunSpec(**base)
    # refuse, as `zfbench.run` does, a shape that cannot fit (instead of the OOM killer)
    check_fits(spec.shape(), [r[1] for r in RUNS], spec.micro_batch, spec.seq,
               element_bytes(args.precision), use_cuda=False)
    rows = []
    for repeat in range(args.repeats):
        order = RUNS if repeat % 2 == 0 else RUNS[::-1]
        for label, strategy, column_major in order:
            spec = RunSpec(**base, overrides={"column_major": column_major})
            result = train(spec, strategy, progress=not args.quiet)
            tl = result.timeline
            skip = min(8, args.steps - 2)
            s = summarize(tl.spans_frame(), tl.steps_frame(), skip)
            rows.append({"setting": args.setting, "repeat": repeat, "strategy": label,
                         "column_major": column_major,
                         "step_time_s": s["step_time_s"], "stall_fraction": s["stall_fraction"],
                         "host_wait_s": s["host_wait_s"], "exposed_io_s": s["exposed_io_s"],
                         "compute_s": s["compute_s"], **op_seconds(tl.spans_frame(), skip),
                         "torch_threads_device":
                         result.engine.device_threads, "torch_threads_host":
                         result.engine.host_threads, "torch": torch.__version__})
    return rows


def op_seconds(spans, skip: int) -> dict:
    """Seconds per steady-state step of forward+backward and of the host AdamW alone (the
    regime: ZenFlow is for host AdamW longer than forward+backward). The host lane's
    `host_optim` job also uploads each chunk it finished (the `h2d_param` spans inside
    it): those seconds are `h2d_s`, left out of `host_adam_s`."""
    steady = spans[spans["step"] >= skip]
    steps = max(1, steady["step"].nunique())
    dur = steady["t_end_s"] - steady["t_start_s"]

    def per_step(ops) -> float:
        return float(dur[steady["op"].isin(ops)].sum()) / steps
    h2d = per_step(["h2d_param"])
    return {"forward_backward_s": per_step(["forward", "backward"]),
            "host_adam_s": per_step(["host_optim"]) - h2d, "h2d_s": h2d,
            "d2h_s": per_step(["d2h_grad"]), "device_optim_s": per_step(["device_optim"])}


def ratios(rows: list[dict]) -> list[dict]:
    out = []
    for setting in sorted({r["setting"] for r in rows}):
        for repeat in sorted({r["repeat"] for r in rows}):
            pick = {r["strategy"]: r for r in rows
                    if r["setting"] == setting and r["repeat"] == repeat}
            if len(pick) < len(RUNS):
                continue
            off, zen, row, dev = (pick[k] for k in ("zero-offload", "zenflow",
                                                     "zenflow-row-major", "device"))
            out.append({"setting": setting, "repeat": repeat,
                        "zenflow_over_zero_offload_step": zen["step_time_s"] /
                        off["step_time_s"],
                        "zenflow_row_major_over_zero_offload_step": row["step_time_s"] /
                        off["step_time_s"],
                        # ZenFlow's device-side work per step vs one full device AdamW pass
                        "zenflow_device_work_s": zen["device_optim_s"],
                        "zenflow_row_major_device_work_s": row["device_optim_s"],
                        "device_adam_s": dev["device_optim_s"],
                        "zenflow_device_work_over_device_adam":
                            zen["device_optim_s"] / dev["device_optim_s"],
                        "zenflow_row_major_device_work_over_device_adam":
                            row["device_optim_s"] / dev["device_optim_s"],
                        "speedup_zenflow_over_zero_offload":
                            off["step_time_s"] / zen["step_time_s"],
                        "stall_fraction_zero_offload": off["stall_fraction"],
                        "stall_fraction_zenflow": zen["stall_fraction"],
                        "stall_reduction": 1 - zen["stall_fraction"] * zen["step_time_s"] /
                        (off["stall_fraction"] * off["step_time_s"]),
                        # the regime, from the zero-offload run (its host AdamW runs alone)
                        "host_adam_over_forward_backward":
                            off["host_adam_s"] / off["forward_backward_s"]})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    from zfbench.real.runner import RunSpec

    d = RunSpec()
    p.add_argument("--model", default=d.model)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--batch", type=int, default=d.micro_batch)
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ)
    p.add_argument("--precision", choices=("fp32", "bf16"), default=None,
                   help="default: measured, as python -m zfbench.run measures it")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--settings", default="plain,thp", help="plain and/or thp")
    p.add_argument("--setting", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    probe = None
    if args.precision is None:
        from zfbench.real.engine import default_thread_split
        from zfbench.real.precision_probe import choose_precision

        spec = RunSpec(model=args.model, layers=args.layers, micro_batch=args.batch, seq=args.seq)
        probe = choose_precision(spec.shape(), spec.micro_batch, spec.seq,
                                 default_thread_split()[0])
        args.precision = probe["precision"]
    if args.setting is not None:  # child: measure one setting, print JSON rows
        print(json.dumps(measure(args)))
        return 0
    rows = []
    for setting in args.settings.split(","):
        env = dict(os.environ, THP_MEM_ALLOC_ENABLE="1" if setting == "thp" else "0")
        cmd = [sys.executable, __file__, "--setting", setting, "--model", args.model,
               "--layers", str(args.layers), "--batch", str(args.batch), "--seq",
               str(args.seq), "--precision", args.precision, "--steps", str(args.steps),
               "--repeats", str(args.repeats)] + (["--quiet"] if args.quiet else [])
        print(f"setting {setting}: {' '.join(cmd[1:])}", file=sys.stderr)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            print(f"setting {setting} failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        rows.extend(json.loads(proc.stdout.strip().splitlines()[-1]))
    summary = ratios(rows)
    import pandas as pd

    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out / "engine_overlap.csv", index=False)
    payload = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": machine(),
               "shape": {"model": args.model, "layers": args.layers, "batch": args.batch,
                         "seq": args.seq, "precision": args.precision,
                         "precision_probe": probe, "steps": args.steps}, "runs": rows,
               "ratios": summary}
    (args.out / "engine_overlap.json").write_text(json.dumps(payload, indent=1))
    print(pd.DataFrame(rows)[["setting", "repeat", "strategy", "step_time_s",
                              "stall_fraction", "host_wait_s", "forward_backward_s",
                              "host_adam_s", "d2h_s", "h2d_s", "device_optim_s"]
                             ].to_string(index=False))
    print(pd.DataFrame(summary).to_string(index=False))
    print(f"wrote {args.out}/engine_overlap.json and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
