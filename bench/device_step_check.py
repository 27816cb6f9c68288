"""The simulator's preset device step beside the device steps measured on lent GPUs.

Covers: issue 44's device-step target. Scenario: every bench/reference_step.py result
committed under bench/results/gpu/ (reference_step/reference_step.csv at any depth), each
row simulated from presets alone: the GPU preset of the folder's GPU, the host preset of
the lent machines' CPUs (`--host`, default xeon-8480-spr: their Intel Xeons with AMX are
Sapphire Rapids class), one GPU, the row's model, micro-batch, sequence and precision, no
activation checkpointing (the reference step keeps every activation). Each row is
simulated twice: with the host's launch floor (zfbench.sims.compute_efficiency) and
without it (`--dispatch-s-per-kernel 0`), so the floor's share of the error shows.

- `forward_backward` rows are held against the simulated forward + backward (the blocks'
  compute seconds, no optimizer);
- `plain_adamw` rows (torch's AdamW on fp32 masters, no engine) against the simulated
  `device` strategy's step;
- `engine_device` rows are the engine's own step, whose overhead over `plain_adamw` on
  the same machine is reported as measured (`engine_overhead_s`), not simulated.

Beside them, rows nobody measured here: the GPU time (forward + backward) of the
ZenFlow paper's ZeRO-Offload bars (zfbench/data/paper_zero_offload_bars.json, four models
on the A100 and H100 node presets, the simulator's default micro-batch 1 x 1024 with
activation checkpointing: the paper does not state them), against the simulated
ZeRO-Offload compute with and without the floor.

    python bench/device_step_check.py [--host xeon-8480-spr] [--out bench/results/device_step_check]

Writes device_step_check.csv (a row per measured row: its simulated seconds with and
without the floor and the signed errors, simulated over measured minus 1) and
paper_bars_compute.csv (the same for the paper's bars).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.trace import write_csv_atomic  # noqa: E402
from zfbench.run.report import gpu_preset  # noqa: E402
from zfbench.core.scenario import GPU_NODE  # noqa: E402
from zfbench.sims.costs import CostModel, SimSettings  # noqa: E402
from zfbench.sims.settings import node_knobs  # noqa: E402
from zfbench.sims.simulator import simulate  # noqa: E402
from zfbench.simulation import summary_row  # noqa: E402

PRECISION = {"bfloat16": "bf16", "float16": "fp16"}
SIM_STEPS = 12  # enough for the device strategy's measurement window


def settings_for(row, gpu: str, host: str, floor: bool) -> SimSettings:
    return SimSettings.from_knobs(model=row.model, gpus=1, gpu=gpu, host=host,
                                  micro_batch=int(row.micro_batch), seq=int(row.seq),
                                  precision=PRECISION[row.dtype], activation_checkpointing=False,
                                  steps=SIM_STEPS, dispatch_s_per_kernel=None if floor else 0.0)


def simulated_s(row, gpu: str, host: str, floor: bool) -> float:
    """What the simulator says for a measured row's mode (see the module docstring)."""
    settings = settings_for(row, gpu, host, floor)
    if row.mode == "forward_backward":
        costs = CostModel(settings, "device")
        return sum(b.forward_s + b.backward_s for b in costs.buckets)
    return summary_row(simulate(settings, "device"))["step_time_s"]


def measured_rows(results: Path) -> pd.DataFrame:
    """Every committed reference_step.csv, with the GPU folder it came from."""
    frames = []
    for path in sorted(results.glob("*/**/reference_step/reference_step.csv")):
        frame = pd.read_csv(path)
        gpu_folder = path.relative_to(results).parts[0]
        frame["source"] = str(path.relative_to(ROOT))
        frame["gpu_preset"] = gpu_preset(gpu_folder.replace("-", " "))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def check(results: Path, host: str) -> pd.DataFrame:
    measured = measured_rows(results)
    rows = []
    for row in measured.itertuples():
        if row.mode not in ("forward_backward", "plain_adamw") or not row.gpu_preset:
            continue
        with_floor = simulated_s(row, row.gpu_preset, host, True)
        without = simulated_s(row, row.gpu_preset, host, False)
        same = measured[(measured["source"] == row.source)
                        & (measured["micro_batch"] == row.micro_batch)]
        engine = same.loc[same["mode"] == "engine_device", "step_s_median"]
        rows.append({"source": row.source, "gpu_preset": row.gpu_preset, "host": host,
                     "model": row.model, "micro_batch": row.micro_batch, "seq": row.seq,
                     "mode": row.mode, "measured_s": row.step_s_median,
                     "kernels_per_step": row.kernels_per_step,
                     "kernel_busy_s": row.kernel_busy_s_per_step,
                     "simulated_s": with_floor, "simulated_no_floor_s": without,
                     "error": with_floor / row.step_s_median - 1,
                     "error_no_floor": without / row.step_s_median - 1,
                     "engine_device_s": float(engine.iloc[0]) if len(engine) else None,
                     "engine_overhead_s": (float(engine.iloc[0]) - row.step_s_median
                                           if len(engine) and row.mode == "plain_adamw"
                                           else None)})
    return pd.DataFrame(rows)


def paper_bars(path: Path) -> pd.DataFrame:
    """The paper's ZeRO-Offload bars' GPU time against the simulated ZeRO-Offload compute
    on their node presets, with and without the host's launch floor."""
    import json
    data = json.loads(path.read_text())
    rows = []
    for bar in data["bars"]:
        node = data["nodes"][bar["gpu"]]["node"]
        base = SimSettings.from_knobs(**node_knobs(node, data["gpus"]), model=bar["model"],
                                      micro_batch=GPU_NODE.micro_batch, seq=GPU_NODE.seq,
                                      precision=GPU_NODE.precision, steps=SIM_STEPS)
        sims = {floor: summary_row(simulate(base.with_(
            dispatch_s_per_kernel=None if floor else 0.0), "zero-offload"))["compute_s"]
            for floor in (True, False)}
        rows.append({"gpu": bar["gpu"], "node": node, "model": bar["model"],
                     "published_compute_s": bar["compute_s"],
                     "simulated_compute_s": sims[True],
                     "simulated_compute_no_floor_s": sims[False],
                     "error": sims[True] / bar["compute_s"] - 1,
                     "error_no_floor": sims[False] / bar["compute_s"] - 1})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--host", default="xeon-8480-spr")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "gpu")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "device_step_check")
    args = ap.parse_args(argv)
    frame = check(args.results, args.host)
    if frame.empty:
        print(f"device_step_check: no reference_step.csv under {args.results}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(frame, args.out / "device_step_check.csv")
    cols = ["gpu_preset", "model", "micro_batch", "mode", "measured_s", "simulated_s",
            "error", "simulated_no_floor_s", "error_no_floor", "engine_overhead_s"]
    print(frame[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    bars = paper_bars(ROOT / "zfbench" / "data" / "paper_zero_offload_bars.json")
    write_csv_atomic(bars, args.out / "paper_bars_compute.csv")
    print(bars.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {args.out / 'device_step_check.csv'} and paper_bars_compute.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
