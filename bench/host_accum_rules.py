"""ZenFlow's host accumulation on the lent H100 and H200, once `predict --from-run` fits the
engine's own host job (`host_job` "engine", zfbench.sims.sections): which rule for the
accumulation's rate survives the two-machine cross-check (issue 44, item 2).

Reads the committed runs and each machine's `predict_host_lane/` fit (written by
`python -m zfbench.predict --from-run RUN --gpu G --quiet --out .../predict_host_lane`).
Per machine the accumulation measured in the run (ZenFlow's steps 1..U-2: nothing else on
its host lane; bench/host_lane_evidence.py), and per rule the host_accum_per_core that the
rule gives, derived on one machine and applied to the other (or a judgment applied to
both), the accumulation rate the simulator then gives on the fitted node (its ZenFlow
lane's cores, NUMA factor and DRAM), its error, and ZenFlow simulated on the fit with it
(steps against the run's row and its first complete window). A rule is kept only if both
machines' accumulation is within `KEEP_WITHIN`. Also rewrites the `simulated_now` column
of each machine's `predict_host_lane/zenflow_spans_per_step.csv` (ZenFlow simulated on
the fit, as `predict` simulates it).

    python bench/host_accum_rules.py [--results bench/results/gpu] [--out DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from host_lane_evidence import (FIT_ACCUM_OVER_ADAM_STREAM, MACHINES, RUN,  # noqa: E402
                                 bench_parser, machine_facts)
from zfbench.core.trace import write_csv_atomic  # noqa: E402
from zfbench.sims import host_traffic  # noqa: E402
from zfbench.sims.costs import ACCUM_BYTES_PER_ELEMENT, CostModel, SimSettings  # noqa: E402
from zfbench.sims.host_step import ACCUM_ELEMS_PER_CORE_S  # noqa: E402

KEEP_WITHIN = 0.15  # the cross-check's bound on each machine's accumulation rate (judgment)
SPANS = ("host_accum", "host_optim", "d2h_grad", "h2d_param")
ZENFLOW = "zenflow"


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def fitted(results: Path, folder: str, tmp: Path) -> tuple[SimSettings, float]:
    """(the settings of the committed fit, its host's fitted AdamW params/s per core)."""
    base = results / folder / "predict_host_lane"
    hw = _json(base / "inferred_hardware.json")
    path = tmp / (folder.replace("/", "_") + ".json")
    path.write_text(json.dumps(hw), encoding="utf-8")
    knobs = {k: v for k, v in _json(base / "inferred.json")["settings"].items()
             if v is not None}
    knobs.update(gpu=next(iter(hw["gpus"])), pcie=next(iter(hw["host_links"])),
                 host=next(iter(hw["hosts"])), hardware=str(path))
    host = next(iter(hw["hosts"].values()))
    return SimSettings.from_knobs(**knobs), host["adam_params_per_s_per_core"]["value"]


def lane_accum_eps(settings: SimSettings, per_core: float) -> float:
    """Elements/s of ZenFlow's accumulation alone on its host lane at `per_core`: its
    cores x the NUMA factor, capped by the node's DRAM (the pool's rate for one job)."""
    c = CostModel(settings.with_(host_accum_per_core=per_core), ZENFLOW)
    return min(c.cores_per_rank * c.accum_units_per_core_s,
               c.node.host.dram_bytes_per_s / ACCUM_BYTES_PER_ELEMENT)


def simulate_zenflow(settings: SimSettings, per_core: float) -> float:
    from zfbench.simulation import run
    rows, _ = run([({}, settings.with_(host_accum_per_core=per_core))], [ZENFLOW], quiet=True)
    return float(rows[0]["step_time_s"])


def rules(m: dict) -> list[tuple[str, str, callable]]:
    """(name, how it is derived, per_core(machine on which it is applied, machine it is
    derived on)) for each candidate rule. `m`: per machine, its facts, fit and the
    per-core rate that reproduces its own measured accumulation (`need`)."""
    def ratio_of(src):  # the accumulation's bytes/s over the fitted AdamW's stream
        return src["need"] * ACCUM_BYTES_PER_ELEMENT / host_traffic.lane_stream_bytes_per_s(
            src["adam"])
    return [
        ("ratio 0.5 of the fitted AdamW stream (predict's rule)", "judgment, both",
         lambda dst, src: host_traffic.accum_elems_per_s(dst["adam"], FIT_ACCUM_OVER_ADAM_STREAM)),
        ("ratio of the fitted AdamW stream, carried", "derived on the other machine",
         lambda dst, src: host_traffic.accum_elems_per_s(dst["adam"], min(ratio_of(src), 1))),
        ("host_accum_per_core, carried", "derived on the other machine",
         lambda dst, src: src["need"]),
        ("per host-lane thread (the lane's rate over its threads), carried",
         "derived on the other machine",
         lambda dst, src: dst["need"] * (src["measured"] / src["threads"])
         / (dst["measured"] / dst["threads"])),
        ("the preset's per-core judgment (ACCUM_ELEMS_PER_CORE_S)", "judgment, both",
         lambda dst, src: ACCUM_ELEMS_PER_CORE_S),
        ("the machine's own measured accumulation (oracle)", "measured on the machine",
         lambda dst, src: dst["need"]),
    ]


def rule_rows(results: Path, tmp: Path) -> tuple[list[dict], dict]:
    m = {}
    for name, (folder, _) in MACHINES.items():
        f = machine_facts(results, name)
        settings, adam = fitted(results, folder, tmp)
        measured = f["P"] / f["accum_run_s"]
        need = measured / lane_accum_eps(settings, 1.0)  # linear below the DRAM cap
        m[name] = {"facts": f, "settings": settings, "adam": adam, "measured": measured,
                   "need": need, "threads": f["zf_threads"]}
    out = []
    names = list(m)
    for rule, how, per_core_of in rules(m):
        errs = []
        for dst in names:
            src = next(n for n in names if n != dst)
            per_core = per_core_of(m[dst], m[src])
            eps = lane_accum_eps(m[dst]["settings"], per_core)
            err = eps / m[dst]["measured"] - 1.0
            errs.append(err)
            step = simulate_zenflow(m[dst]["settings"], per_core)
            f = m[dst]["facts"]
            out.append({"rule": rule, "derived": how, "applied_on": dst,
                        "derived_on": src if "other" in how else dst,
                        "host_accum_per_core_M": per_core / 1e6,
                        "accum_simulated_G_per_s": eps / 1e9,
                        "accum_measured_G_per_s": m[dst]["measured"] / 1e9,
                        "accum_error": err, "zenflow_step_s": step,
                        "row_s": f["row_step_s"], "error_vs_row": step / f["row_step_s"] - 1,
                        "first_window_s": f["window_step_s"][0],
                        "error_vs_first_window": step / f["window_step_s"][0] - 1})
        kept = all(abs(e) <= KEEP_WITHIN for e in errs)
        for r in out[-len(names):]:
            r["verdict"] = "kept" if kept else "rejected"
    return out, m


def span_table(results: Path, folder: str, settings: SimSettings, adam: float
               ) -> pd.DataFrame:
    """`zenflow_spans_per_step.csv` with `simulated_now` from ZenFlow's spans on the fit,
    its accumulation as `predict` costs it (seconds per measured step), the measured
    column and its sources kept."""
    from zfbench.simulation import run
    table = pd.read_csv(results / folder / "predict_host_lane" / "zenflow_spans_per_step.csv")
    rows, res = run([({}, settings.with_(
        host_accum_per_core=host_traffic.accum_elems_per_s(adam, FIT_ACCUM_OVER_ADAM_STREAM)))],
        [ZENFLOW], quiet=True)
    row, spans = rows[0], res[((), ZENFLOW)].timeline.spans_frame()
    kept = spans[(spans["step"] >= int(row["steps_left_out"])) & (spans["rank"] == 0)]
    per_step = (kept["t_end_s"] - kept["t_start_s"]).groupby(kept["op"]).sum() / \
        int(row["steps_measured"])
    table["simulated_now_s_per_step"] = [float(per_step.get(s, 0.0)) for s in table["span"]]
    table["measured_over_now"] = table["measured_s_per_step"] / table["simulated_now_s_per_step"]
    return table


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, "host_accum_rules")
    args = p.parse_args(argv)
    missing = [str(args.results / d / RUN) for d, _ in MACHINES.values()
               if not (args.results / d / "predict_host_lane" / "inferred.json").is_file()]
    if missing:
        p.error(f"no predict_host_lane/ fit beside {', '.join(missing)}: run python -m "
                f"zfbench.predict --from-run RUN --gpu G --out .../predict_host_lane")
    with tempfile.TemporaryDirectory() as tmp:
        rows, m = rule_rows(args.results, Path(tmp))
        for name, (folder, _) in MACHINES.items():
            spans = span_table(args.results, folder, m[name]["settings"], m[name]["adam"])
            write_csv_atomic(spans, args.results / folder / "predict_host_lane"
                             / "zenflow_spans_per_step.csv")
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(table, args.out / "accum_rules.csv")
    with pd.option_context("display.width", 220, "display.max_columns", 20,
                           "display.max_colwidth", 44, "display.precision", 3):
        print(table.drop(columns=["derived"]).to_string(index=False))
    print(f"wrote {args.out / 'accum_rules.csv'} and each machine's "
          f"predict_host_lane/zenflow_spans_per_step.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
