"""Which CPU-Adam rate per core the published host rows allow, and whether a DRAM roofline
predicts them (issue 44, leave-one-source-out).

Two calibration rows set the hosts' `adam_params_per_s_per_core` (zfbench/sims/host_step.py,
`CALIBRATION_ROWS`): ZeRO-Offload's Table 4 (one process, DGX-2, 2 x Xeon 8168) and the
ZenFlow blog's Figure 3 (4 ranks of 128 CPU-Adam threads, A100 node, EPYC host). Out of
sample both fall back to one judgment, 29.5e6 (DeepSpeed PR #735 over an assumed 48
cores). This script sets each host's rate to three candidates and simulates the host rows
the rate decides, through `python -m zfbench.validate --published`'s own `simulate_row`:

- `calibrated`: the presets (each calibration row reproduced by construction);
- `pr735_judgment`: the judgment LOSO uses now;
- `dram_roofline` (`dram_roofline_rate`): CPU-Adam bound by DRAM alone, every constant a
  preset field with its source: theoretical bandwidth x STREAM triad fraction /
  `adam_bytes_per_param`, shared by all the host's cores (a local rate: the simulator
  applies its NUMA factor on top, as for every rate; `HostCPU.adam_params_per_s` already
  caps the cores' rate by the same DRAM bound, so this is the per-core rate at which the
  compute bound stops binding).

Beside the two calibration rows it simulates the core-binding blog's ZeRO-Offload rows
(2 x A100 on a DGX-A100 with 2 x EPYC 7742, bound and unbound): an independent source on
the same class of host, which tells whether the EPYC's low rate is the blog's setting (4
ranks x 128 threads) or the host.

    python bench/host_adam_rates.py [--out bench/results/host_adam_rates]

Writes `rows.csv` (row, candidate, per-core rate, simulated, error %) and `summary.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core import hardware  # noqa: E402
from zfbench.core.trace import write_csv_atomic  # noqa: E402
from zfbench.sims.host_step import CALIBRATION_ROWS  # noqa: E402
from zfbench.validate.published import (bundled_path, published_value,  # noqa: E402
                                        read_rows, row_settings, simulate_row)

FIELD = "adam_params_per_s_per_core"
HOSTS = sorted({preset for preset, _ in CALIBRATION_ROWS.values()})
# The rows a host's Adam rate decides: the two calibration rows and the core-binding
# blog's ZeRO-Offload rows (same host class as the ZenFlow blog: DGX-A100, 2 x EPYC 7742).
ROW_IDS = ("zo-table4-cpuadam-10b", "zf-blog-fig3-llama7b-adam", "cb-qwen1.5b-zo-bound",
           "cb-qwen3b-zo-bound", "cb-qwen3b-zo-unbound")
CANDIDATES = ("calibrated", "pr735_judgment", "dram_roofline")


def dram_roofline_rate(host) -> float:
    """Local CPU-Adam parameters per second per core if only DRAM bounded it: the host's
    STREAM-triad bandwidth (`dram_bytes_per_s`: theoretical x triad fraction, node total)
    over the bytes CPU-Adam streams per parameter, shared by every core; the rate at which
    `HostCPU.adam_params_per_s`'s two bounds meet on all cores."""
    return host.dram_bytes_per_s / host.adam_bytes_per_param / host.cores


def candidate_rates(name: str) -> dict[str, tuple[float, str]]:
    """{candidate: (per-core rate, its source)} for host preset `name`."""
    host = hardware.lookup("hosts", name)
    judged = hardware.judgments("hosts", name)[FIELD]
    return {"calibrated": (getattr(host, FIELD), host.sources[FIELD]),
            "pr735_judgment": judged,
            "dram_roofline": (dram_roofline_rate(host), "judgment: DRAM roofline "
                              "(bench/host_adam_rates.py, dram_roofline_rate)")}


def write_hosts(rates: dict[str, tuple[float, str]], path: Path) -> str:
    """A hardware file whose host presets `rates` names hold that CPU-Adam rate (value,
    source); every other number the preset's. Its path."""
    hosts = {}
    for name, (value, source) in rates.items():
        obj = hardware.lookup("hosts", name)
        hosts[name] = hardware.entry_of("hosts", replace(
            obj, sources={**obj.sources, FIELD: source}, **{FIELD: value}))
    path.write_text(json.dumps({"description": "host CPU-Adam rate candidates "
                                               "(bench/host_adam_rates.py)", "hosts": hosts}))
    return str(path)


def simulate_candidates(row_ids=ROW_IDS, candidates=CANDIDATES) -> pd.DataFrame:
    """One line per (row, candidate): the rate of the row's host, published, simulated,
    error %."""
    _, rows = read_rows(bundled_path())
    by_id = {r["id"]: r for r in rows}
    rates = {name: candidate_rates(name) for name in HOSTS}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for cand in candidates:
            path = None if cand == "calibrated" else write_hosts(
                {n: rates[n][cand] for n in HOSTS}, Path(tmp) / f"{cand}.json")
            anchors: dict = {}
            for rid in row_ids:
                row = by_id[rid]
                host = row_settings(row).as_dict()["host"]
                got = simulate_row(row, by_id, anchors, path)
                out.append({"id": rid, "candidate": cand, "host": host,
                            "rate_per_core": rates[host][cand][0],
                            "published": published_value(row), "simulated": got["simulated"],
                            "error_pct": got["error_pct"], "status": got["status"]})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "host_adam_rates")
    args = parser.parse_args(argv)
    frame = simulate_candidates()
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(frame, args.out / "rows.csv")
    summary = {c: {"rows": {r.id: round(r.error_pct, 1) for r in g.itertuples()},
                   "rates_per_core": {h: candidate_rates(h)[c][0] for h in HOSTS}}
               for c, g in frame.groupby("candidate", sort=False)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(frame.drop(columns=["status"]).to_string(index=False, float_format="%.4g"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
