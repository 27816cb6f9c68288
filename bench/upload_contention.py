"""Do the link's copies run slower while the host lane streams memory? (issues 44 item 2,
45 item 2). Reads only committed files of the lent H100-VM and H200-VM; simulates nothing.

Per machine, each copy direction's rate (GB/s):
- alone: the run's profile (`profile/profile.json`, the rate probe: d2h / h2d alone);
- beside host AdamW: every contention probe on that machine kind
  (bench/link_host_contention.py: the whole wire and the engine's 8 MiB chunks, each
  round) and the profile's own `h2d_factor_when_host_busy` where it has one; as factors
  (beside / alone). Also the probe's engine pipeline (each chunk's upload issued after its
  AdamW) and the same uploads spaced by a spin without memory traffic, where measured;
- in the run: each offloading row's d2h_gb_per_s / h2d_gb_per_s (its copies' own events).

Then the cross-check (`crosscheck.csv`): a mechanism's factor derived on one machine, times
the other's alone rate, is that machine's predicted ZenFlow copy rate; the span error is
measured rate / predicted - 1 (predicted span over measured). A host-busy cost is kept only
if its own and the carried predictions are within KEEP_WITHIN both ways.

    python bench/upload_contention.py [--results bench/results/gpu] [--out DIR]

Writes probe_factors.csv, in_run.csv, crosscheck.csv into --out (default
bench/results/upload_contention/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from host_lane_evidence import RUN, parse_checked, write_and_show  # noqa: E402

# machine -> its folder under bench/results/gpu and its contention probes (the H100's was
# taken on another H100-VM, the only one; the H200's call 1 before the fused host kernels,
# call 2 with them)
MACHINES = {
    "H100-VM": ("NVIDIA-H100-80GB-HBM3", ("contention/link_host_contention.json",)),
    "H200-VM": ("NVIDIA-H200/2026-11-27", ("contention/link_host_contention.json",
                                           "call2/contention/link_host_contention.json")),
}
ROWS = ("zero-offload", "zero-offload-dpu", "zenflow")
ZENFLOW = "zenflow"
CHUNK_BYTES = 8 << 20  # the engine's upload chunk (4M bf16 elements; real/strategies.py)
KEEP_WITHIN = 0.15  # the cross-check's bound on the span error, both ways (the brief's)
# (link, probe's copy, probe key alone, probe key beside AdamW): factor = beside / alone
PAIRS = (("h2d", "whole", "h2d_whole_alone_GBps", "h2d_whole_beside_adam_GBps"),
         ("h2d", "chunks", "h2d_chunks_alone_GBps", "h2d_chunks_beside_adam_GBps"),
         ("h2d", "pipeline", "h2d_chunks_alone_GBps", "engine_pipeline_uploads_GBps"),
         ("h2d", "spaced", "h2d_chunks_alone_GBps", "spaced_uploads_GBps"),
         ("d2h", "whole", "d2h_whole_alone_GBps", "d2h_whole_beside_adam_GBps"))
BESIDE_ADAM = ("whole", "chunks", "profile")  # the copies timed while AdamW repeats


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def probe_factors(results: Path, name: str) -> list[dict]:
    """One row per measured factor on machine `name`: link, copy kind, source, alone and
    beside (GB/s), factor = beside / alone."""
    folder, probes = MACHINES[name]
    rows = []
    for rel in probes:
        probe = _json(results / folder / rel)
        for rnd in sorted(k for k in probe if k.startswith("round")):
            r = probe[rnd]
            for link, kind, alone, beside in PAIRS:
                if alone in r and beside in r:
                    rows.append({"machine": name, "link": link, "copy": kind,
                                 "source": f"{folder}/{rel} {rnd}", "alone_GBps": r[alone],
                                 "beside_GBps": r[beside], "factor": r[beside] / r[alone]})
    cal = _json(results / folder / "profile" / "profile.json")["calibration"]
    if "h2d_factor_when_host_busy" in cal:
        alone = cal["h2d_bytes_per_s"] / 1e9
        f = cal["h2d_factor_when_host_busy"]
        rows.append({"machine": name, "link": "h2d", "copy": "profile",
                     "source": f"{folder}/profile/profile.json", "alone_GBps": alone,
                     "beside_GBps": alone * f, "factor": f})
    return rows


def in_run(results: Path, name: str) -> list[dict]:
    """Each offloading row's copy rates in the run against the profile's alone rates, and
    the extra seconds an 8 MiB copy took in the run over alone."""
    folder, _ = MACHINES[name]
    cal = _json(results / folder / "profile" / "profile.json")["calibration"]
    summary = pd.read_csv(results / folder / RUN / "summary.csv").set_index("strategy")
    rows = []
    for strategy in ROWS:
        for link in ("d2h", "h2d"):
            measured = float(summary.loc[strategy, f"{link}_gb_per_s"])
            alone = cal[f"{link}_bytes_per_s"] / 1e9
            rows.append({"machine": name, "strategy": strategy, "link": link,
                         "alone_GBps": alone, "in_run_GBps": measured,
                         "ratio": measured / alone,
                         "extra_s_per_copy": CHUNK_BYTES / (measured * 1e9)
                         - CHUNK_BYTES / (alone * 1e9)})
    return rows


def span_error(factor: float, alone_GBps: float, measured_GBps: float) -> float:
    """Predicted span over measured, less 1: the copy predicted at `alone_GBps` x `factor`."""
    return measured_GBps / (alone_GBps * factor) - 1.0


def crosscheck_rows(factors: pd.DataFrame, runs: pd.DataFrame) -> list[dict]:
    """Each mechanism's factor (its mean over a machine's measurements) applied to every
    machine's ZenFlow row: on its own machine and carried to the other."""
    zf = runs[runs["strategy"] == ZENFLOW].set_index(["machine", "link"])
    mechanisms = []  # (name, link, host-busy cost?, machine -> factor)
    for link in ("h2d", "d2h"):
        beside = factors[(factors["link"] == link) & factors["copy"].isin(BESIDE_ADAM)]
        mechanisms.append((f"{link} beside host AdamW (probe mean)", link, True,
                           beside.groupby("machine")["factor"].mean().to_dict()))
        mechanisms.append((f"{link} beside host AdamW (probe's slowest)", link, True,
                           beside.groupby("machine")["factor"].min().to_dict()))
    pipe = factors[(factors["link"] == "h2d") & (factors["copy"] == "pipeline")]
    mechanisms.append(("h2d issued behind each chunk's AdamW (probe's pipeline)", "h2d",
                       False, pipe.groupby("machine")["factor"].mean().to_dict()))
    for strategy in ("zero-offload", ZENFLOW):
        r = runs[(runs["strategy"] == strategy) & (runs["link"] == "h2d")]
        mechanisms.append((f"h2d in-run ratio of the {strategy} row", "h2d", False,
                           r.set_index("machine")["ratio"].to_dict()))
    rows = []
    for mech, link, host_busy, by_machine in mechanisms:
        for src, factor in sorted(by_machine.items()):
            for dst in MACHINES:
                if (mech.endswith(f"{ZENFLOW} row") and src == dst):
                    continue  # the row itself: no prediction
                row = zf.loc[(dst, link)]
                rows.append({"mechanism": mech, "link": link, "host_busy_cost": host_busy,
                             "derived_on": src, "applied_on": dst, "factor": factor,
                             "alone_GBps": row["alone_GBps"],
                             "predicted_GBps": row["alone_GBps"] * factor,
                             "measured_GBps": row["in_run_GBps"],
                             "span_error": span_error(factor, row["alone_GBps"],
                                                      row["in_run_GBps"])})
    table = pd.DataFrame(rows)
    table["verdict"] = table["mechanism"].map(
        {m: verdict(g) for m, g in table.groupby("mechanism")})
    return table.to_dict("records")


def verdict(rows: pd.DataFrame) -> str:
    """A mechanism's rows: within KEEP_WITHIN on every machine, carried both ways? Only a
    host-busy cost can be kept (the others are named for what they are)."""
    within = bool((rows["span_error"].abs() <= KEEP_WITHIN).all())
    carried = rows[rows["derived_on"] != rows["applied_on"]]
    both_ways = set(carried["derived_on"]) == set(MACHINES)
    if not within:
        return "rejected" if rows["host_busy_cost"].iloc[0] else "does not carry"
    if not both_ways:
        return "within, one way only (no probe on the other machine)"
    return "kept" if rows["host_busy_cost"].iloc[0] else "carries (not a host-busy cost)"


def main(argv: list[str] | None = None) -> int:
    args = parse_checked(__doc__, "upload_contention", argv,
                         [d for d, _ in MACHINES.values()])
    factors = pd.DataFrame([r for n in MACHINES for r in probe_factors(args.results, n)])
    runs = pd.DataFrame([r for n in MACHINES for r in in_run(args.results, n)])
    cross = pd.DataFrame(crosscheck_rows(factors, runs))
    write_and_show(args.out, {
        "probe_factors.csv": (factors, factors.drop(columns=["source"])),
        "in_run.csv": (runs, runs), "crosscheck.csv": (cross, cross)}, colwidth=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
