"""Each setup's error bar: how far the simulator was from measurements of the same regime.

This module owns that number. A regime is a strategy (what crosses the link and where
AdamW runs decide what the simulator can get wrong). Where measurements exist:

- device, ZeRO-Offload, ZeRO-Offload + DPU, ZeRO-Infinity: the mean absolute error of
  `python -m zfbench.validate --published` over the bundled rows of that strategy
  (zfbench/data/published/offload_measurements.csv; each row simulated as validate does,
  with its anchor, calibration rows left out as validate leaves them out), computed here
  by validate's own `simulate_row` (a few seconds; no result of it is committed; kept in
  zfbench's cache until the simulator or the data change);
- ZenFlow, which no published row measures: DeepSpeed 0.19.5's ZenFlow measured on the
  CPU lanes against `python -m zfbench.predict`'s prediction (bench/results/
  predict_deepspeed.json, `mean_abs_error`: `zenflow_overlap` with overlap_step on,
  `zenflow_seq` off; docs/results.md).

Not used: the engine-side `python -m zfbench.validate` on a GPU (bench/results/gpu/*/
validate/validate_summary.json: the simulator with a profile measured on that machine,
every strategy's cells pooled into one error), which checks another way of simulating
than the presets advise runs from, and gives no number per strategy.

The bar is symmetric: step_s x (1 +- error). It says how far off a single number was
where it was checked, not a bound.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from zfbench.core.strategies import STRATEGY_LIST, has_windows

PREDICT_DEEPSPEED = (Path(__file__).resolve().parents[2] / "bench" / "results"
                     / "predict_deepspeed.json")


@dataclass(frozen=True)
class ErrorBar:
    """A regime's error (a fraction: 0.2 is 20 %) and where it came from."""
    fraction: float
    rows: int
    source: str


def published_errors() -> dict[str, ErrorBar]:
    """Per strategy, validate --published's mean absolute error over its bundled rows."""
    from zfbench.validate.published import _counted, simulate_row
    from zfbench.validate.rows import bundled_path, read_rows

    _, rows = read_rows(bundled_path())
    by_id, anchors = {r["id"]: r for r in rows}, {}
    done = [{**r, **simulate_row(r, by_id, anchors)} for r in rows]
    out = {}
    for s in STRATEGY_LIST:
        mine = [r for r in done if r["strategy"] == s.name and _counted(r)]
        if not mine:
            continue
        metrics = sorted({r["metric"] for r in mine})
        mae = sum(abs(r["error_pct"]) for r in mine) / len(mine) / 100
        out[s.name] = ErrorBar(mae, len(mine), (
            f"validate --published, {len(mine)} bundled {s.name} rows "
            f"({', '.join(metrics)}): mean absolute error {100 * mae:.1f}%"))
    return out


def zenflow_error(overlap_step: bool, path: Path = PREDICT_DEEPSPEED) -> ErrorBar | None:
    """ZenFlow's: DeepSpeed's ZenFlow measured against predict (None without the file)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    key = "zenflow_overlap" if overlap_step else "zenflow_seq"
    value = data.get("mean_abs_error", {}).get(key)
    if value is None:
        return None
    rows = sum(r.get("mode") == key for r in data.get("rows", [])) or len(data["rows"])
    return ErrorBar(float(value), rows, (
        f"DeepSpeed 0.19.5's ZenFlow on the CPU lanes vs predict, {rows} runs "
        f"(bench/results/predict_deepspeed.json mean_abs_error.{key}): {100 * value:.1f}%"))


def fingerprint() -> str:
    """What validate's errors depend on: the simulator, the analysis, zfbench.core and
    validate's code, and the bundled data (a digest of every file's bytes)."""
    import zfbench.analysis
    import zfbench.core
    import zfbench.sims
    import zfbench.validate

    digest = hashlib.sha256()
    folders = [Path(m.__file__).parent for m in (zfbench.sims, zfbench.analysis,
                                                zfbench.core, zfbench.validate)]
    folders.append(folders[2].parent / "data")
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.suffix in (".py", ".json", ".csv") and path.is_file():
                digest.update(path.name.encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def cached_published_errors() -> dict[str, ErrorBar]:
    """`published_errors`, kept in zfbench's cache directory (`$ZFBENCH_CACHE_DIR`, else
    ~/.cache/zfbench) under the `fingerprint` of what they depend on: computed again
    whenever any of it changes."""
    from zfbench.real.host_native import cache_root

    path, key = cache_root() / "advise_published_errors.json", fingerprint()
    try:
        found = json.loads(path.read_text())
        if found.get("key") == key:
            return {k: ErrorBar(**v) for k, v in found["errors"].items()}
    except (OSError, ValueError, TypeError, KeyError):
        pass
    errors = published_errors()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "errors": {k: asdict(v) for k, v
                                                          in errors.items()}}))
        os.replace(tmp, path)
    except OSError:  # a read-only cache: computed every time
        pass
    return errors


@lru_cache(maxsize=1)
def regime_errors(overlap_step: bool = True) -> dict[str, ErrorBar]:
    """Every strategy's error bar where one was measured (computed once a process, and
    validate's kept in the cache between runs: `cached_published_errors`)."""
    out = cached_published_errors()
    for s in STRATEGY_LIST:
        if has_windows(s.name):
            found = zenflow_error(overlap_step)
            if found is not None:
                out[s.name] = found
    return out


def unknown(strategy: str) -> ErrorBar:
    return ErrorBar(math.nan, 0, f"no measurement of the {strategy} regime")
