"""`python -m zfbench.validate --published [FILE.csv] [--out DIR]`: the simulator against
what other people measured on real GPUs.

This module owns that check: simulating each row of a published-measurements CSV (the
bundled `zfbench/data/published/offload_measurements.csv` when FILE is left out; the
format and a row's `SimSettings` are zfbench.validate.rows'), reading the row's metric
off the simulated timeline (zfbench.validate.metrics), fixing the compute efficiency from
an anchor row (`anchor_mfu`), the leave-one-source-out error (each source's rows
simulated again with the constants its own rows calibrate at their judgments:
zfbench.validate.calibrated), and the table, summary and files it prints and writes. It
fits nothing: every row is simulated with the presets' numbers (an anchored row with the
MFU its anchor implies), and the error is what it is.

Anchors: a row whose `anchor` names another row (measured on the same machine without
offload) is simulated at the MFU m = m0 C / (P - O) that makes the anchor's simulation
reproduce its measurement (C the anchor's compute per step at MFU m0, O the rest of its
step, P its measured step), iterated until m moves by less than 1e-6 of itself (at most
`ANCHOR_ROUNDS` times); every row also gets `simulated_no_anchor` and
`error_pct_no_anchor`. docs/published.md has the CSV format and the rule in full.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import tempfile
import time
from pathlib import Path

from zfbench.cli_checks import CliError, OneLineParser, check_input_file, check_out_dir, fail
from zfbench.core.progress import progress
from zfbench.sims.costs import CostModel, SimSettingsError
from zfbench.sims.simulator import simulate
from zfbench.validate.calibrated import BY_ROW, write_judged_hardware
from zfbench.validate.metrics import (METRICS, THROUGHPUT_METRICS,  # noqa: F401
                                      Unsupported, fwd_bwd_and_step_s, implied_step_s,
                                      measure, step_parts)
# the format and a row's settings, read from here too
from zfbench.validate.rows import (BUNDLED, COLUMNS, REQUIRED, STEPS, SKIP_STEPS,  # noqa: F401
                                   bundled_path, published_value, read_rows, row_settings,
                                   skip_of)

PROG = "python -m zfbench.validate --published"
OUTPUT_COLUMNS = ("simulated", "error_pct", "status", "calibration", "mfu",
                  "simulated_no_anchor", "error_pct_no_anchor", "fits", "sim_step_time_s",
                  "sim_compute_s", "sim_exposed_io_s", "sim_host_wait_s", "pub_non_compute_s",
                  "simulated_loso", "error_pct_loso", "loso_judged")
ANCHOR_METRICS = ("step_time_s", *THROUGHPUT_METRICS)
ANCHOR_ROUNDS = 5


# -- anchors --------------------------------------------------------------------------
def anchor_mfu(anchor: dict, hardware_file: str | None = None) -> float:
    """The MFU at which the anchor row's simulation reproduces its measurement (module
    docstring), on the presets or `hardware_file`'s entries; Unsupported when none in
    (0, 1] does."""
    if anchor["metric"] not in ANCHOR_METRICS:
        raise Unsupported(f"anchor {anchor['id']} measures {anchor['metric']}; an anchor "
                          f"gives a step time or a throughput ({', '.join(ANCHOR_METRICS)})")
    settings = row_settings(anchor, hardware_file)
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
    """What a calibration row sets ("preset field"), or "" (zfbench.validate.calibrated:
    a constant only a measurement gives, taken from that one row)."""
    found = BY_ROW.get(row["id"])
    return found.label if found else ""


def simulate_row(row: dict, by_id: dict, anchors: dict,
                 hardware_file: str | None = None) -> dict:
    """The output columns of one row (`anchors` caches each anchor's MFU or reason), on
    the presets or, where given, `hardware_file`'s entries."""
    out = {c: "" for c in OUTPUT_COLUMNS}
    try:
        published = published_value(row)
        settings = row_settings(row, hardware_file)
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
                    anchors[row["anchor"]] = anchor_mfu(by_id[row["anchor"]], hardware_file)
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


def judged_by_source(rows: list[dict]) -> dict[str, list]:
    """{source: the calibrations its rows set (zfbench.validate.calibrated.Calibration)},
    the sources whose rows set none left out."""
    out: dict[str, list] = {}
    for r in rows:
        if r["id"] in BY_ROW:
            out.setdefault(r["source"], []).append(BY_ROW[r["id"]])
    return out


def validate_rows(rows: list[dict], quiet: bool = False) -> list[dict]:
    """Every row with its output columns added, in order. The leave-one-source-out
    columns (`simulated_loso`, `error_pct_loso`, `loso_judged`): each source's rows
    simulated again with the constants calibrated from that source's own rows at their
    judgments (zfbench.validate.calibrated), every other constant as it is; a source
    whose rows calibrate nothing keeps its simulation."""
    by_id, anchors, done = {r["id"]: r for r in rows}, {}, []
    judged = judged_by_source(rows)
    again = [r for r in rows if r["source"] in judged]
    bar = progress(total=len(rows) + len(again), desc="simulating published rows",
                   unit="row", quiet=quiet)
    for row in rows:
        bar.set_postfix_str(row["id"])
        done.append({**row, **simulate_row(row, by_id, anchors)})
        done[-1].update(simulated_loso=done[-1]["simulated"],
                        error_pct_loso=done[-1]["error_pct"], loso_judged="")
        bar.update()
    with tempfile.TemporaryDirectory() as tmp:
        for k, (source, calibrations) in enumerate(judged.items()):
            path = write_judged_hardware(calibrations, Path(tmp) / f"judged{k}.json")
            loso_anchors: dict = {}
            for r in done:
                if r["source"] != source:
                    continue
                bar.set_postfix_str(f"{r['id']} (leave-one-source-out)")
                out = simulate_row(by_id[r["id"]], by_id, loso_anchors, path)
                r.update(simulated_loso=out["simulated"], error_pct_loso=out["error_pct"],
                         loso_judged="; ".join(c.label for c in calibrations))
                bar.update()
    bar.close()
    return done


# -- summary, table, files ----------------------------------------------------------
def _counted(r: dict, loso: bool = False) -> bool:
    """A row that counts in the error: simulated, and not a calibration row; under
    leave-one-source-out (`loso`) every simulated row."""
    return r["status"] == "ok" and (loso or not r.get("calibration"))


def _mae(rows: list[dict], key: str, loso: bool = False) -> float:
    ok = [abs(r[key]) for r in rows if _counted(r, loso)]
    return sum(ok) / len(ok) if ok else math.nan


def _within_25(rows: list[dict], key: str, loso: bool = False) -> float:
    ok = [abs(r[key]) <= 25 for r in rows if _counted(r, loso)]
    return 100 * sum(ok) / len(ok) if ok else math.nan


def summary(rows: list[dict]) -> dict:
    """Mean absolute error (%) overall and per source, with and without anchors; rows
    within 25 %; unsupported rows. Calibration rows are left out of all but `calibration`
    and the leave-one-source-out errors (`*_loso_pct`, over every simulated row: a row is
    judged with its own source's calibrations at their judgments)."""
    ok = [r for r in rows if _counted(r)]
    sources = list(dict.fromkeys(r["source"] for r in rows))
    return {
        "rows": len(rows), "ok": len(ok),
        "unsupported": sum(r["status"] != "ok" for r in rows),
        "calibration": [r["id"] for r in rows if r["status"] == "ok" and r.get("calibration")],
        "mae_pct": _mae(rows, "error_pct"),
        "mae_no_anchor_pct": _mae(rows, "error_pct_no_anchor"),
        "within_25_pct": _within_25(rows, "error_pct"),
        "rows_loso": sum(_counted(r, True) for r in rows),
        "mae_loso_pct": _mae(rows, "error_pct_loso", True),
        "within_25_loso_pct": _within_25(rows, "error_pct_loso", True),
        "per_source": [{"source": s, "rows": sum(r["source"] == s for r in ok),
                        "mae_pct": _mae(mine, "error_pct"),
                        "mae_no_anchor_pct": _mae(mine, "error_pct_no_anchor"),
                        "rows_loso": sum(_counted(r, True) for r in mine),
                        "mae_loso_pct": _mae(mine, "error_pct_loso", True),
                        "loso_judged": next((r["loso_judged"] for r in mine
                                             if r.get("loso_judged")), "")}
                       for s in sources
                       for mine in [[r for r in rows if r["source"] == s]]]}


def _fmt(value, spec: str) -> str:
    return "" if value == "" or value is None or value != value else format(value, spec)


def format_table(rows: list[dict], head: dict) -> str:
    anchored = any(r["anchor"] for r in rows)
    judged = any(r.get("loso_judged") for r in rows)
    header = ["id", "metric", "published", "simulated", "error%"] + \
        (["no-anchor%"] if anchored else []) + (["loso%"] if judged else []) + ["status"]
    body = []
    for r in rows:
        line = [r["id"], r["metric"], _fmt(float(r["value"]), ".4g") if r["status"] == "ok"
                else r["value"],
                _fmt(r["simulated"], ".4g"), _fmt(r["error_pct"], "+.1f")]
        if anchored:
            line.append(_fmt(r["error_pct_no_anchor"], "+.1f") if r["anchor"] else "")
        if judged:  # only where the row's source set a constant: elsewhere it is error%
            line.append(_fmt(r["error_pct_loso"], "+.1f") if r.get("loso_judged") else "")
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
    lines.append(f"leave-one-source-out: {_fmt(head['mae_loso_pct'], '.1f')}% over "
                 f"{head['rows_loso']} rows (each source simulated with the constants its "
                 f"own rows calibrate at their judgments, calibration rows counted); "
                 f"{_fmt(head['within_25_loso_pct'], '.0f')}% of rows within 25%")
    for s in head["per_source"]:
        loso = (f"; leave-one-source-out {_fmt(s['mae_loso_pct'], '.1f')}% over "
                f"{s['rows_loso']} with {s['loso_judged']} at its judgment"
                if s["loso_judged"] else "")
        if not s["rows"]:
            lines.append(f"  calibration rows only{loso}: {s['source']}")
            continue
        lines.append(f"  {_fmt(s['mae_pct'], '5.1f')}% (anchors ignored "
                     f"{_fmt(s['mae_no_anchor_pct'], '5.1f')}%{loso}) over {s['rows']:2d} "
                     f"rows: {s['source']}")
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
