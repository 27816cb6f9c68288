"""`python -m zfbench.validate --published [FILE.csv] [--out DIR]`: the simulator against
what other people measured on real GPUs.

This module owns that check: reading a published-measurements CSV (the bundled
`zfbench/data/published/offload_measurements.csv` when FILE is left out; its columns are
documented in docs/published.md), turning each row into `SimSettings`, simulating it,
reading the row's metric off the simulated timeline, fixing the compute efficiency from
an anchor row, and the table, summary and files it prints and writes. It fits nothing:
every row is simulated with the presets' numbers (an anchored row with the MFU its anchor
implies), and the error is what it is.

The metrics and how each is read off a simulation: zfbench.validate.metrics.

Anchors: a row whose `anchor` names another row (measured on the same machine without
offload) is simulated with the MFU that makes the anchor row's simulation reproduce the
anchor's measurement. The anchor row is simulated at one MFU m0 for every block (first
the whole model's MFU by shape, zfbench.sims.compute_efficiency); its
forward+backward compute time per step is C (which scales as 1/MFU) and the rest of its
step O = step - C (optimizer, exposed collectives). The anchor's measured step time P
(its `step_time_s`, or the step time its throughput metric implies) then gives MFU
m = m0 C / (P - O);
the anchor is simulated again at m and the rule repeated until m moves by less than
1e-6 of itself (at most `ANCHOR_ROUNDS` times; on one GPU the first m is already exact).
Every row also gets `simulated_no_anchor` and `error_pct_no_anchor`, by shape.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import time
from importlib import resources
from pathlib import Path

from zfbench.cli_checks import CliError, OneLineParser, check_input_file, check_out_dir, fail
from zfbench.core.progress import progress
from zfbench.sims.costs import STRATEGIES, CostModel, SimSettings, SimSettingsError
from zfbench.sims import compute_efficiency
from zfbench.sims.host_step import CALIBRATION_ROWS
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import default_skip_steps, simulate, steps_needed
from zfbench.sims.partitioning import ZERO2_STRATEGIES
from zfbench.validate.metrics import (METRICS, THROUGHPUT_METRICS, Unsupported,
                                      fwd_bwd_and_step_s, implied_step_s, measure,
                                      step_parts)

PROG = "python -m zfbench.validate --published"
BUNDLED = "zfbench/data/published/offload_measurements.csv"
# Every column the format has, in its order; REQUIRED must be present (the rest may be
# left out of a file, or left empty in a row, for their defaults).
COLUMNS = ("id", "source", "metric", "value", "strategy", "hardware", "gpu", "gpus", "model",
           "micro_batch", "seq", "grad_accum", "precision", "activation_checkpointing",
           "offload_params", "offload_optimizer", "offload_activations", "bind_cores",
           "pin_memory", "overlap_comm", "fused_param_upload", "anchor", "note")
REQUIRED = ("id", "source", "metric", "value", "strategy", "hardware", "gpus", "model",
            "micro_batch", "seq")
OUTPUT_COLUMNS = ("simulated", "error_pct", "status", "calibration", "mfu",
                  "simulated_no_anchor", "error_pct_no_anchor", "fits", "sim_step_time_s",
                  "sim_compute_s", "sim_exposed_io_s", "sim_host_wait_s", "pub_non_compute_s")
ANCHOR_METRICS = ("step_time_s", *THROUGHPUT_METRICS)
FUSED_UPLOAD_STRATEGIES = ("zero-offload", "zero-offload-dpu")
STEPS, SKIP_STEPS = 4, 2  # steps simulated per row and left out of the averages
ANCHOR_ROUNDS = 5


# -- reading ------------------------------------------------------------------------
def bundled_path() -> Path:
    return Path(str(resources.files("zfbench").joinpath("data/published/"
                                                          "offload_measurements.csv")))


def read_rows(path: str | Path) -> tuple[list[str], list[dict]]:
    """The file's columns (in its order) and rows; an unknown or missing column, an empty
    or repeated id is a CliError naming it."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        rows = [dict(r) for r in reader]
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise CliError(f"{path}: unknown column {unknown[0]!r}; the columns are "
                       f"{', '.join(COLUMNS)} (docs/published.md)")
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise CliError(f"{path}: missing column {missing[0]!r}; required: "
                       f"{', '.join(REQUIRED)}")
    seen: set[str] = set()
    for n, row in enumerate(rows, 2):
        if None in row:  # more cells than columns
            raise CliError(f"{path}: line {n} has more cells than the header's columns")
        rid = (row["id"] or "").strip()
        if not rid or rid in seen:
            raise CliError(f"{path}: line {n}: id {rid!r} is " +
                           ("empty" if not rid else "given twice") + "; ids are unique")
        seen.add(rid)
        for c in COLUMNS:
            row[c] = (row.get(c) or "").strip()
    return columns, rows


def _int(row: dict, key: str, default: int | None = None) -> int:
    text = row[key]
    if not text and default is not None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise Unsupported(f"{key} {text!r} is not a positive integer")
    return int(text)


def _bool(row: dict, key: str, default: bool) -> bool:
    text = row[key].lower()
    if not text:
        return default
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise Unsupported(f"{key} {row[key]!r} is not true or false")


def published_value(row: dict) -> float:
    try:
        value = float(row["value"])
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise Unsupported(f"value {row['value']!r} is not a positive number")
    return value


def row_settings(row: dict) -> SimSettings:
    """The simulation of one row, its compute by shape (Unsupported with the reason)."""
    if row["metric"] not in METRICS:
        raise Unsupported(f"metric {row['metric']!r} is not one of {', '.join(METRICS)}")
    if row["strategy"] not in STRATEGIES:
        raise Unsupported(f"strategy {row['strategy']!r} is not simulated; choose one of "
                          f"{', '.join(STRATEGIES)}")
    if not row["hardware"]:
        raise Unsupported("hardware is empty; name a node preset (python -c 'from "
                          "zfbench.core.hardware import node_names; print(node_names())')")
    try:
        knobs = node_knobs(row["hardware"], _int(row, "gpus"))
        if row["gpu"]:
            knobs["gpu"] = row["gpu"]
        knobs.update(model=row["model"], micro_batch=_int(row, "micro_batch"),
                     seq=_int(row, "seq"), grad_accum=_int(row, "grad_accum", 1),
                     activation_checkpointing=_bool(row, "activation_checkpointing", True),
                     bind_cores=_bool(row, "bind_cores", False),
                     pin_memory=_bool(row, "pin_memory", True),
                     overlap_comm=_bool(row, "overlap_comm", True),
                     fused_param_upload=_bool(row, "fused_param_upload", False))
        if row["precision"]:
            knobs["precision"] = row["precision"]
        if not knobs["overlap_comm"] and row["strategy"] not in ZERO2_STRATEGIES:
            raise Unsupported(f"overlap_comm false is simulated for "
                              f"{', '.join(ZERO2_STRATEGIES)} (DeepSpeed's ZeRO-2); "
                              f"leave it empty for {row['strategy']}")
        if knobs["fused_param_upload"] and row["strategy"] not in FUSED_UPLOAD_STRATEGIES:
            raise Unsupported(f"fused_param_upload is DeepSpeed's ZeRO-2 offload step "
                              f"({', '.join(FUSED_UPLOAD_STRATEGIES)}); leave it empty for "
                              f"{row['strategy']}")
        for key in ("offload_params", "offload_optimizer"):
            if row[key]:
                if row["strategy"] != "zero-infinity":
                    raise Unsupported(f"{key} is a zero-infinity setting; leave it empty")
                knobs[key] = row[key]
        if _bool(row, "offload_activations", False):
            if row["strategy"] != "zero-infinity":
                raise Unsupported("offload_activations is a zero-infinity setting "
                                  "(DeepSpeed's cpu_checkpointing); leave it empty")
            knobs["offload_activations"] = True
        settings = SimSettings(**knobs, steps=STEPS)
        if row["strategy"] == "zenflow":  # its windows: warm-up, two skipped, one measured
            settings = settings.with_(steps=steps_needed(settings))
        return settings
    except (SimSettingsError, ValueError) as err:
        raise Unsupported(" ".join(str(err).split())) from None


def skip_of(settings: SimSettings, strategy: str) -> int:
    return default_skip_steps(settings) if strategy == "zenflow" else SKIP_STEPS


# -- anchors --------------------------------------------------------------------------
def anchor_mfu(anchor: dict) -> float:
    """The MFU at which the anchor row's simulation reproduces its measurement (module
    docstring); Unsupported when none in (0, 1] does."""
    if anchor["metric"] not in ANCHOR_METRICS:
        raise Unsupported(f"anchor {anchor['id']} measures {anchor['metric']}; an anchor "
                          f"gives a step time or a throughput ({', '.join(ANCHOR_METRICS)})")
    settings = row_settings(anchor)
    costs = CostModel(settings)
    published = published_value(anchor)
    target = implied_step_s(settings, costs, anchor["metric"], published)
    mfu = costs.mfu
    skip = skip_of(settings, anchor["strategy"])
    for _ in range(ANCHOR_ROUNDS):
        compute, step = fwd_bwd_and_step_s(simulate(settings.with_(mfu=mfu),
                                                    anchor["strategy"]), skip)
        other = step - compute
        if target <= other:
            raise Unsupported(f"anchor {anchor['id']}: measured {target:.4g} s per step is "
                              f"no more than the simulated non-compute part {other:.4g} s")
        new = mfu * compute / (target - other)
        if new > 1:
            raise Unsupported(f"anchor {anchor['id']} implies MFU {new:.3g} > 1")
        if abs(new - mfu) <= 1e-6 * mfu:
            return new
        mfu = new
    return mfu


# -- one row ------------------------------------------------------------------------
def calibration_of(row: dict) -> str:
    """What a calibration row sets ("preset field"), or "" (zfbench.sims.host_step's and
    zfbench.sims.compute_efficiency's CALIBRATION_ROWS: a constant only a measurement
    gives, taken from that one row)."""
    rows = {**CALIBRATION_ROWS, **compute_efficiency.CALIBRATION_ROWS}
    if row["id"] not in rows:
        return ""
    preset, field = rows[row["id"]]
    return f"{preset} {field}"


def simulate_row(row: dict, by_id: dict, anchors: dict) -> dict:
    """The output columns of one row (`anchors` caches each anchor's MFU or reason)."""
    out = {c: "" for c in OUTPUT_COLUMNS}
    try:
        published = published_value(row)
        settings = row_settings(row)
        skip = skip_of(settings, row["strategy"])
        base = CostModel(settings)
        plain = simulate(settings, row["strategy"])
        no_anchor = measure(plain, row["metric"], skip)
        mfu = base.mfu
        if row["anchor"]:
            if row["anchor"] not in by_id:
                raise Unsupported(f"anchor {row['anchor']!r} names no row of the file")
            if row["anchor"] not in anchors:
                try:
                    anchors[row["anchor"]] = anchor_mfu(by_id[row["anchor"]])
                except Unsupported as err:
                    anchors[row["anchor"]] = err
            found = anchors[row["anchor"]]
            if isinstance(found, Unsupported):
                raise Unsupported(str(found))
            mfu = found
            result = simulate(settings.with_(mfu=mfu), row["strategy"])
            value = measure(result, row["metric"], skip)
        else:
            value, result = no_anchor, plain
        fit = base.fits(row["strategy"])["fits"]
        parts = step_parts(result, skip)
        if row["anchor"] and row["metric"] in ANCHOR_METRICS:  # what the measurement leaves
            parts["pub_non_compute_s"] = implied_step_s(settings, base, row["metric"],
                                                        published) - parts["sim_compute_s"]
    except (Unsupported, SimSettingsError) as err:
        out["status"] = f"unsupported: {' '.join(str(err).split())}"
        return out
    out.update(simulated=value, error_pct=100 * (value - published) / published,
               status="ok", calibration=calibration_of(row), mfu=mfu, simulated_no_anchor=no_anchor,
               error_pct_no_anchor=100 * (no_anchor - published) / published,
               fits=str(bool(fit)).lower(), **parts)
    return out


def validate_rows(rows: list[dict], quiet: bool = False) -> list[dict]:
    """Every row with its output columns added, in order."""
    by_id, anchors, done = {r["id"]: r for r in rows}, {}, []
    bar = progress(total=len(rows), desc="simulating published rows", unit="row",
                   quiet=quiet)
    for row in rows:
        bar.set_postfix_str(row["id"])
        done.append({**row, **simulate_row(row, by_id, anchors)})
        bar.update()
    bar.close()
    return done


# -- summary, table, files ----------------------------------------------------------
def _counted(r: dict) -> bool:
    """A row that counts in the error: simulated, and not a calibration row."""
    return r["status"] == "ok" and not r.get("calibration")


def _mae(rows: list[dict], key: str) -> float:
    ok = [abs(r[key]) for r in rows if _counted(r)]
    return sum(ok) / len(ok) if ok else math.nan


def summary(rows: list[dict]) -> dict:
    """Mean absolute error (%) overall and per source, with and without anchors; rows
    within 25 %; unsupported rows. Calibration rows are left out of all but `calibration`."""
    ok = [r for r in rows if _counted(r)]
    sources = list(dict.fromkeys(r["source"] for r in rows))
    return {
        "rows": len(rows), "ok": len(ok),
        "unsupported": sum(r["status"] != "ok" for r in rows),
        "calibration": [r["id"] for r in rows if r["status"] == "ok" and r.get("calibration")],
        "mae_pct": _mae(rows, "error_pct"),
        "mae_no_anchor_pct": _mae(rows, "error_pct_no_anchor"),
        "within_25_pct": (100 * sum(abs(r["error_pct"]) <= 25 for r in ok) / len(ok)
                          if ok else math.nan),
        "per_source": [{"source": s, "rows": sum(r["source"] == s for r in ok),
                        "mae_pct": _mae([r for r in rows if r["source"] == s], "error_pct"),
                        "mae_no_anchor_pct": _mae([r for r in rows if r["source"] == s],
                                                  "error_pct_no_anchor")}
                       for s in sources]}


def _fmt(value, spec: str) -> str:
    return "" if value == "" or value is None or value != value else format(value, spec)


def format_table(rows: list[dict], head: dict) -> str:
    anchored = any(r["anchor"] for r in rows)
    header = ["id", "metric", "published", "simulated", "error%"] + \
        (["no-anchor%"] if anchored else []) + ["status"]
    body = []
    for r in rows:
        line = [r["id"], r["metric"], _fmt(float(r["value"]), ".4g") if r["status"] == "ok"
                else r["value"],
                _fmt(r["simulated"], ".4g"), _fmt(r["error_pct"], "+.1f")]
        if anchored:
            line.append(_fmt(r["error_pct_no_anchor"], "+.1f") if r["anchor"] else "")
        status = r["status"] + (f" (calibration: {r['calibration']})"
                                if r.get("calibration") else "")
        line.append(status + (" (does not fit)" if r["fits"] == "false" else ""))
        body.append(line)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
             for line in [header, *body]]
    lines.append("")
    lines.append(f"mean absolute error {head['mae_pct']:.1f}% over {head['ok']} rows "
                 f"(anchors ignored: {head['mae_no_anchor_pct']:.1f}%); "
                 f"{head['within_25_pct']:.0f}% of rows within 25%; "
                 f"{head['unsupported']} unsupported"
                 + (f"; calibration rows left out: {', '.join(head['calibration'])}"
                    if head["calibration"] else ""))
    for s in head["per_source"]:
        if not s["rows"]:
            lines.append(f"  calibration rows only: {s['source']}")
            continue
        lines.append(f"  {_fmt(s['mae_pct'], '5.1f')}% (anchors ignored "
                     f"{_fmt(s['mae_no_anchor_pct'], '5.1f')}%) over {s['rows']:2d} rows: "
                     f"{s['source']}")
    return "\n".join(lines)


def write_outputs(out: Path, columns: list[str], rows: list[dict], head: dict) -> None:
    """DIR/published.csv (input columns, then OUTPUT_COLUMNS) and published_summary.json,
    each through a rename."""
    out.mkdir(parents=True, exist_ok=True)
    path, tmp = out / "published.csv", out / ".published.csv.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, [*columns, *OUTPUT_COLUMNS], extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (format(v, ".10g") if isinstance(v, float) else v)
                             for k, v in r.items()})
    os.replace(tmp, path)
    tmp = out / ".published_summary.json.tmp"
    tmp.write_text(json.dumps(head, indent=1, default=str))
    os.replace(tmp, out / "published_summary.json")


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--published", nargs="?", const="", metavar="FILE.csv", required=True,
                   help=f"published measurements (default: the bundled {BUNDLED})")
    p.add_argument("--out", type=Path, default=Path("runs/validate"),
                   help="directory for published.csv and published_summary.json "
                        "(default runs/validate)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: list[str] | None = None) -> int:
    from zfbench.core.provenance import provenance

    started = time.perf_counter()
    try:
        args = build_parser().parse_args(argv)
        path = Path(args.published) if args.published else bundled_path()
        if args.published:
            check_input_file(path, "--published")
        check_out_dir(args.out)
        columns, rows = read_rows(path)
    except (CliError, OSError, UnicodeDecodeError) as err:
        return fail(err)
    done = validate_rows(rows, args.quiet)
    head = summary(done)
    print(format_table(done, head))
    head.update(file=str(args.published or BUNDLED), wall_s=time.perf_counter() - started,
                provenance=provenance(argv, PROG))
    try:
        write_outputs(args.out, columns, done, head)
    except OSError as err:
        return fail(f"writing {args.out}: {err}")
    print(f"wrote {args.out}/published.csv and published_summary.json "
          f"({time.perf_counter() - started:.0f} s)")
    return 0
