"""Run the whole test suite several times in a row and list every test whose outcome changed.

A test that passes on a quiet machine and fails when the machine is slower, busier or just
unlucky is a test that rejects good submissions (issue 30). This runs `pytest` over
`tests/` `--runs` times in a row (default 5), the last `--hog-runs` of them (default 1)
with a CPU hog beside it (`--hog-cores` processes spinning, default 1 of the 2 cores the
project's machines have), reads each run's JUnit XML, and lists every test whose outcome
(passed, failed, error, skipped) was not the same in every run, and every test that failed
in all of them.

    python bench/suite_stability.py                 # 5 runs, the last with one core hogged
    python bench/suite_stability.py --runs 3 --hog-runs 2 -- -k predict   # args to pytest

Writes to `--out` (default bench/results/stability/): `outcomes.csv` (one row per test, a
column per run, `changed`), `stability.json` (the machine, each run's wall seconds, exit
code, counts and whether it was hogged, the changed and always-failing tests) and the JUnit
XML of each run. Exits 1 when a test changed or always failed, else 0.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

from zfbench.core.provenance import provenance
from zfbench.core.trace import write_csv_atomic, write_json_atomic

ROOT = Path(__file__).resolve().parent.parent


def _spin() -> None:
    while True:
        pass


def outcomes(junit_xml: Path) -> dict[str, str]:
    """test id (file::name) -> passed / failed / error / skipped, from a JUnit XML file."""
    out = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        test_id = f"{path}.py::{case.get('name')}"
        tags = {child.tag for child in case}
        out[test_id] = ("failed" if "failure" in tags else "error" if "error" in tags
                        else "skipped" if "skipped" in tags else "passed")
    return out


def run_suite(index: int, out: Path, hog_cores: int, pytest_args: list[str]) -> dict:
    """One pytest run (with `hog_cores` spinning processes beside it); its record."""
    xml = out / f"run{index}.xml"
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(hog_cores)]
    for hog in hogs:
        hog.start()
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"--junitxml={xml}", *pytest_args], cwd=ROOT,
                              capture_output=True, text=True)
    finally:
        for hog in hogs:
            hog.terminate()
            hog.join()
    wall = time.perf_counter() - start
    (out / f"run{index}.log").write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if not xml.exists():
        raise SystemExit(f"run {index}: pytest wrote no JUnit XML (exit {done.returncode}): "
                         f"{last}")
    return {"run": index, "hog_cores": hog_cores, "wall_s": round(wall, 1),
            "exit_code": done.returncode, "pytest_summary": last,
            "outcomes": outcomes(xml)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hog-runs", type=int, default=1,
                        help="how many of the last runs have the hog beside them")
    parser.add_argument("--hog-cores", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/stability")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed on to pytest")
    args = parser.parse_args(argv)
    if args.runs < 2 or not 0 <= args.hog_runs <= args.runs or args.hog_cores < 1:
        parser.error("need --runs >= 2, 0 <= --hog-runs <= --runs and --hog-cores >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(1, args.runs + 1):
        hog = args.hog_cores if i > args.runs - args.hog_runs else 0
        print(f"run {i}/{args.runs}{f' with {hog} core(s) hogged' if hog else ''} ...",
              flush=True)
        runs.append(run_suite(i, args.out, hog, args.pytest_args))
        print(f"run {i}: {runs[-1]['pytest_summary']} ({runs[-1]['wall_s']:.0f} s)", flush=True)
    table = pd.DataFrame({f"run{r['run']}": r["outcomes"] for r in runs}).fillna("absent")
    table.index.name = "test"
    columns = list(table.columns)
    table["changed"] = table[columns].nunique(axis=1) > 1
    changed = sorted(table.index[table["changed"]])
    always_failed = sorted(table.index[(table[columns].isin(["failed", "error"])).all(axis=1)])
    write_csv_atomic(table.reset_index(), args.out / "outcomes.csv")
    record = {"provenance": provenance(argv, "python bench/suite_stability.py"),
              "runs": [{k: v for k, v in r.items() if k != "outcomes"} for r in runs],
              "tests": len(table), "changed": changed, "always_failed": always_failed}
    write_json_atomic(args.out / "stability.json", record)
    print(f"{len(table)} tests over {len(runs)} runs: {len(changed)} changed outcome, "
          f"{len(always_failed)} failed every time")
    for test in changed:
        print(f"  changed: {test}: {', '.join(table.loc[test, columns])}")
    for test in always_failed:
        print(f"  failed every run: {test}")
    print(f"wrote {args.out}/outcomes.csv, stability.json and each run's XML and log")
    return 1 if changed or always_failed else 0


if __name__ == "__main__":
    sys.exit(main())
