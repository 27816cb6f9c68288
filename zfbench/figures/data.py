"""The simulated datasets behind `python -m zfbench.figures`, and their cache.

A `Dataset` is a list of simulation jobs (or a direct computation) whose rows land in
CSV files under `<out>/data/`, beside a `<name>.spec.json` holding the exact settings;
`is_fresh` says whether the files on disk were made with the settings asked for now, and
`generate` runs the stale ones under one progress bar, each file through a rename and
the spec written last (an interrupted run leaves no fresh-looking half).

Part of the command `python -m zfbench.figures` (its concept: what each simulated figure
needs computed, apart from drawing it): like the command, it imports sims/
(docs/design.md's arrows).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
from zfbench.core.progress import progress
from zfbench.core.strategies import OFFLOAD_STRATEGIES

from zfbench.sims.costs import SimSettings
from zfbench.sims.simulator import simulate

# Figures 1-4 tell the ZenFlow paper's story (ZeRO-Offload's stall, DPU's limit, ZenFlow's
# pipeline); zero-infinity is compared in figures 5 and 8 (zfbench/figures/command.py), not here.
TIMELINE_STRATEGIES = OFFLOAD_STRATEGIES  # the engine's offloading strategies


@dataclass
class Dataset:
    name: str
    jobs: list[tuple[dict, SimSettings, str]]
    rows: Callable  # (labels, result) -> {file: DataFrame part}
    direct: Callable | None = None  # () -> {file: DataFrame}, for data needing no sim
    params: dict | None = None  # what `direct` depends on

    def spec(self) -> dict:
        return {"dataset": self.name, "params": self.params,
                "jobs": [[lab, s.as_dict(), st] for lab, s, st in self.jobs]}


def _files(data_dir: Path, ds: Dataset) -> list[Path]:
    if ds.direct is not None:
        return [data_dir / f"{ds.name}.csv"]
    if ds.name == "timeline":
        return [data_dir / f"timeline_{s}.{k}.csv" for s in TIMELINE_STRATEGIES
                for k in ("spans", "steps")]
    return [data_dir / f"{ds.name}.csv"]


def is_fresh(data_dir: Path, ds: Dataset) -> bool:
    spec = data_dir / f"{ds.name}.spec.json"
    if not spec.exists() or not all(p.exists() for p in _files(data_dir, ds)):
        return False
    return json.loads(spec.read_text()) == json.loads(json.dumps(ds.spec()))


def generate(data_dir: Path, stale: list[Dataset], quiet: bool) -> None:
    """Run every job of the stale datasets under one progress bar, then write each
    dataset's files (through a rename) and its spec last."""
    data_dir.mkdir(parents=True, exist_ok=True)
    total = sum(len(ds.jobs) for ds in stale)
    bar = progress(total=total, desc="simulating", unit="run", quiet=quiet or not total)
    for ds in stale:
        parts: dict[str, list[pd.DataFrame]] = {}
        if ds.direct is not None:
            parts = {k: [v] for k, v in ds.direct().items()}
        for labels, settings, strategy in ds.jobs:
            bar.set_postfix_str(f"{ds.name}: {settings.scenario.model} {strategy}")
            for file, frame in ds.rows(labels, simulate(settings, strategy)).items():
                parts.setdefault(file, []).append(frame)
            bar.update()
        for file, frames in parts.items():
            tmp = data_dir / f".{file}.tmp"
            pd.concat(frames, ignore_index=True).to_csv(tmp, index=False)
            os.replace(tmp, data_dir / file)
        tmp = data_dir / f".{ds.name}.spec.json.tmp"
        tmp.write_text(json.dumps(ds.spec(), indent=1))
        os.replace(tmp, data_dir / f"{ds.name}.spec.json")
    bar.close()
