"""Host AdamW throughput vs the machine's memory bandwidth, side by side in one run.

    python bench/host_adam.py [--params 16M,64M] [--repeats 10] [--threads N] [--out DIR]

For each THP setting (THP_MEM_ALLOC_ENABLE=0 and =1, set in a worker subprocess's
environment because torch reads it before its first allocation) the worker measures

* a numpy STREAM triad, a = b + s*c on fp64 arrays far larger than the caches, split over
  --threads Python threads (numpy releases the GIL): a cache-blocked single-pass version
  and a plain two-ufunc version; GB/s counts 3 arrays x 8 B per element, as STREAM does;
  "triad" below is the better of the two (the conservative denominator);
* torch's own single-pass triad (torch.add(b, c, alpha=s, out=a), fp32) and an in-place
  a += b (12 B per element, no write-allocate: the access pattern of Adam's p, m, v), for
  reference;
* every zfbench.real.host_adam method (and chunk size) on preallocated, warmed-up flat fp32
  buffers, round-robin across configurations so machine noise hits them alike; best and
  median of --repeats calls; parameters/s and effective GB/s at 28 B per parameter (read
  p, g, m, v; write p, m, v), and the ratio to the best triad of the whole run.

Writes DIR/host_adam.json and DIR/host_adam.csv (machine info, env settings, load
averages) and prints a table. With --rounds R (default 2) the two THP workers alternate R
times and each configuration's statistics pool all its timed calls.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BYTES_PER_PARAM = 28  # fp32 p, g, m, v read + p, m, v written
TRIAD_ELEMS = 1 << 25  # 32M fp64 = 256 MiB per array
TRIAD_BLOCK = 1 << 16  # 512 KiB fp64 temporary per thread (stays in L2)
ENV_KEYS = ("THP_MEM_ALLOC_ENABLE", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "OMP_PROC_BIND", "OMP_WAIT_POLICY", "KMP_AFFINITY", "LD_PRELOAD")


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if text[-1:] in "KMG" else text) * mult)


def configs(n: int) -> list[tuple[str, int | None, int | None]]:
    """(method, chunk_elems, foreach window in chunks) measured for a buffer of n."""
    out = [("fused", None, None), ("fused", 1 << 20, None)]
    out += [("inplace", c, None) for c in (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, None)]
    out += [("foreach", c, 1) for c in (1 << 16, 1 << 18, 1 << 20, None)]
    out += [("foreach", 1 << 16, 16)]
    seen, uniq = set(), []
    for method, chunk, window in out:
        chunk = n if chunk is None or chunk >= n else chunk
        if window is not None and chunk == n:
            window = 1
        if (method, chunk, window) not in seen:
            seen.add((method, chunk, window))
            uniq.append((method, chunk, window))
    return uniq


# ----------------------------------------------------------------------------- worker
def _triad(threads: int, repeats: int) -> dict:
    import numpy as np

    n = TRIAD_ELEMS
    a, b, c = np.zeros(n), np.full(n, 1.0), np.full(n, 2.0)
    s = 3.0
    tmps = [np.empty(TRIAD_BLOCK) for _ in range(threads)]
    bounds = [n * i // threads for i in range(threads + 1)]

    def blocked(k: int) -> None:
        tmp = tmps[k]
        for i in range(bounds[k], bounds[k + 1], TRIAD_BLOCK):
            j = min(i + TRIAD_BLOCK, bounds[k + 1])
            t = tmp[: j - i]
            np.multiply(c[i:j], s, out=t)
            np.add(b[i:j], t, out=a[i:j])

    def twopass(k: int) -> None:
        lo, hi = bounds[k], bounds[k + 1]
        np.multiply(c[lo:hi], s, out=a[lo:hi])
        np.add(a[lo:hi], b[lo:hi], out=a[lo:hi])

    def timed(fn) -> list[float]:
        ts = []
        for _ in range(repeats + 1):
            ths = [threading.Thread(target=fn, args=(k,)) for k in range(threads)]
            t0 = time.perf_counter()
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            ts.append(time.perf_counter() - t0)
        return ts[1:]

    out = {}
    for name, fn in (("blocked", blocked), ("twopass", twopass)):
        ts = timed(fn)
        out[f"triad_{name}_best_gbs"] = 24 * n / min(ts) / 1e9
        out[f"triad_{name}_median_gbs"] = 24 * n / statistics.median(ts) / 1e9
    assert float(a[12345]) == 7.0
    out["triad_gbs"] = max(out["triad_blocked_best_gbs"], out["triad_twopass_best_gbs"])
    out["triad_elems"] = n
    out["triad_dtype"] = "float64"
    out["numpy_madvise_hugepage"] = _numpy_madvise()
    return out


def _numpy_madvise():
    try:
        from numpy._core import multiarray as ma
    except ImportError:  # numpy < 2
        from numpy.core import multiarray as ma
    return bool(ma._get_madvise_hugepage()) if hasattr(ma, "_get_madvise_hugepage") else None


def _torch_triad(repeats: int) -> dict:
    import torch

    n = TRIAD_ELEMS * 2
    a, b, c = torch.zeros(n), torch.ones(n), torch.full((n,), 2.0)
    ts = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        ts.append(time.perf_counter() - t0)
    ts, rmw = ts[1:], []
    for _ in range(repeats + 1):  # in place a += b: read a, read b, write a, no write-allocate
        t0 = time.perf_counter()
        a.add_(b)
        rmw.append(time.perf_counter() - t0)
    rmw = rmw[1:]
    return {"torch_triad_best_gbs": 12 * n / min(ts) / 1e9,
            "torch_triad_median_gbs": 12 * n / statistics.median(ts) / 1e9,
            "torch_rmw_best_gbs": 12 * n / min(rmw) / 1e9,
            "torch_rmw_median_gbs": 12 * n / statistics.median(rmw) / 1e9}


def worker(args) -> None:
    import torch

    from zfbench.real import host_adam as H

    torch.set_num_threads(args.threads)  # the bench process's own budget
    res = {"thp": os.environ.get("THP_MEM_ALLOC_ENABLE"), "threads": torch.get_num_threads(),
           "loadavg_start": os.getloadavg(), "rows": []}
    res.update(_triad(args.threads, args.repeats * 2))
    res.update(_torch_triad(args.repeats))
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    for n in args.sizes:
        gen = torch.Generator().manual_seed(0)
        p = torch.randn(n, generator=gen)
        g = torch.randn(n, generator=gen)
        m = torch.randn(n, generator=gen).mul_(0.01)
        v = torch.rand(n, generator=gen).mul_(0.01)
        cfgs = [c for c in configs(n) if c[0] in args.methods]
        times = {i: [] for i in range(len(cfgs))}
        step = [1]

        def call(cfg) -> float:
            method, chunk, window = cfg
            if window is not None:
                H.FOREACH_WINDOW_CHUNKS = window
            step[0] += 1
            t0 = time.perf_counter()
            H.host_adamw_(p, g, m, v, step=step[0], lr=1e-4, beta1=0.9, beta2=0.999,
                          eps=1e-8, weight_decay=0.01, method=method, chunk_elems=chunk)
            return time.perf_counter() - t0

        total = len(cfgs) * (args.repeats + 1)
        bar = tqdm(total=total, desc=f"THP={res['thp']} n={n:,}", file=sys.stderr,
                   leave=False) if tqdm else None
        for rep in range(args.repeats + 1):  # rep 0 is the warm-up
            for i, cfg in enumerate(cfgs):
                dt_s = call(cfg)
                if rep:
                    times[i].append(dt_s)
                if bar:
                    bar.update()
        if bar:
            bar.close()
        assert torch.isfinite(p).all() and torch.isfinite(v).all()
        for i, (method, chunk, window) in enumerate(cfgs):
            res["rows"].append({"params": n, "method": method, "chunk_elems": chunk,
                                "foreach_window_chunks": window, "times_s": times[i]})
    res["loadavg_end"] = os.getloadavg()
    Path(args.result_file).write_text(json.dumps(res))


# ----------------------------------------------------------------------------- parent
def machine_info(threads: int) -> dict:
    """The machine (zfbench.core.provenance: CPU model, ISA flags, cores, torch) plus what
    decides host AdamW's speed here: torch's CPU capability, THP settings, env knobs."""
    import numpy
    import torch

    from zfbench.core.provenance import machine

    def sysfs(path):
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None

    return {
        **machine(),
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(), "threads": threads, "numpy_version": numpy.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "sys_thp_enabled": sysfs("/sys/kernel/mm/transparent_hugepage/enabled"),
        "sys_thp_defrag": sysfs("/sys/kernel/mm/transparent_hugepage/defrag"),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "bytes_per_param": BYTES_PER_PARAM,
    }


def run_worker(args, thp: str) -> dict:
    env = dict(os.environ, THP_MEM_ALLOC_ENABLE=thp)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "res.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--result-file",
               str(out), "--threads", str(args.threads), "--repeats", str(args.repeats),
               "--params", ",".join(str(n) for n in args.sizes), "--methods", ",".join(args.methods)]
        subprocess.run(cmd, env=env, check=True)
        return json.loads(out.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="16M,64M", help="comma list of buffer sizes in elements")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--thp", default="0,1", help="THP_MEM_ALLOC_ENABLE values to run")
    ap.add_argument("--rounds", type=int, default=2,
                    help="worker runs per THP setting, alternating; statistics pool them")
    ap.add_argument("--methods", default="fused,inplace,foreach",
                    help="comma list of zfbench.real.host_adam methods to measure")
    ap.add_argument("--tag", default="", help="results go to host_adam_<tag>.json/.csv")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.params.split(",") if s.strip()]
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.worker:
        worker(args)
        return 0

    info = machine_info(args.threads)
    runs = []
    for rnd in range(args.rounds):  # alternate the settings so drifting load hits both alike
        for thp in args.thp.split(","):
            runs.append(dict(run_worker(args, thp), round=rnd))
    triad = max(r["triad_gbs"] for r in runs)
    merged: dict[tuple, list[float]] = {}
    for r in runs:
        for row in r["rows"]:
            key = (r["thp"], row["params"], row["method"], row["chunk_elems"],
                   row["foreach_window_chunks"])
            merged.setdefault(key, []).extend(row["times_s"])
    rows = []
    for (thp, n, method, chunk, window), ts in merged.items():
        best, med = min(ts), statistics.median(ts)
        gbs, mgbs = BYTES_PER_PARAM * n / best / 1e9, BYTES_PER_PARAM * n / med / 1e9
        rows.append({"thp": thp, "params": n, "method": method, "chunk_elems": chunk,
                     "foreach_window_chunks": window, "samples": len(ts), "best_s": best,
                     "median_s": med, "params_per_s": n / best, "median_params_per_s": n / med,
                     "gbs": gbs, "median_gbs": mgbs, "pct_of_triad": 100 * gbs / triad,
                     "median_pct_of_triad": 100 * mgbs / triad})
    big = max(args.sizes)
    cand = [r for r in rows if r["params"] == big]
    best = max(cand, key=lambda r: r["params_per_s"])
    from zfbench.real.host_adam import AUTO_METHOD

    summary = {"triad_gbs": triad, "best": {k: best[k] for k in (
        "method", "chunk_elems", "thp", "params_per_s", "gbs", "pct_of_triad")},
        "module_auto_method": AUTO_METHOD, "goal_pct_of_triad": 70.0,
        "goal_met": best["pct_of_triad"] >= 70.0}
    runs_meta = [{k: v for k, v in r.items() if k != "rows"} for r in runs]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "host_adam" + (f"_{args.tag}" if args.tag else "")
    (out_dir / f"{stem}.json").write_text(json.dumps(
        {"machine": info, "argv": sys.argv[1:], "runs": runs_meta, "summary": summary,
         "rows": rows}, indent=1))
    cols = ["thp", "params", "method", "chunk_elems", "foreach_window_chunks", "samples",
            "best_s", "median_s", "params_per_s", "median_params_per_s", "gbs", "median_gbs",
            "pct_of_triad", "median_pct_of_triad"]
    meta = {"triad_gbs": triad, "date_utc": info["date_utc"], "nproc": info["nproc"],
            "threads": info["threads"], "torch_version": info["torch_version"],
            "cpu_model": info["cpu_model"], "OPENBLAS_CORETYPE": info["env"]["OPENBLAS_CORETYPE"],
            "sys_thp_enabled": info["sys_thp_enabled"]}
    with open(out_dir / f"{stem}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols + list(meta))
        w.writeheader()
        for r in rows:
            w.writerow({**{c: r[c] for c in cols}, **meta})

    print(f"\n{info['cpu_model']}, nproc {info['nproc']}, threads {args.threads}, "
          f"torch {info['torch_version']} ({info['torch_cpu_capability']}), {info['date_utc']}")
    for r in runs_meta:
        print(f"round {r['round']} THP_MEM_ALLOC_ENABLE={r['thp']}: numpy triad blocked {r['triad_blocked_best_gbs']:.1f}"
              f" / two-pass {r['triad_twopass_best_gbs']:.1f} GB/s (best; medians "
              f"{r['triad_blocked_median_gbs']:.1f} / {r['triad_twopass_median_gbs']:.1f}), torch "
              f"triad {r['torch_triad_best_gbs']:.1f}, torch in-place a+=b "
              f"{r['torch_rmw_best_gbs']:.1f} GB/s; load avg {r['loadavg_start'][0]:.1f}"
              f" -> {r['loadavg_end'][0]:.1f}")
    print(f"triad (denominator, best of all runs) = {triad:.1f} GB/s; {BYTES_PER_PARAM} B/param;"
          f" best and median over {args.rounds} x {args.repeats} timed calls\n")
    hdr = (f"{'THP':>3} {'params':>6} {'method':<8} {'chunk':>7} {'win':>3} {'Gparam/s':>9} "
           f"{'GB/s':>6} {'%triad':>7} {'med GB/s':>8} {'med %':>6}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        chunk = "all" if r["chunk_elems"] == r["params"] else f"{r['chunk_elems'] >> 10}K"
        print(f"{r['thp']:>3} {r['params'] >> 20:>5}M {r['method']:<8} {chunk:>7} "
              f"{r['foreach_window_chunks'] or '':>3} {r['params_per_s'] / 1e9:9.3f} "
              f"{r['gbs']:6.1f} {r['pct_of_triad']:6.0f}% {r['median_gbs']:8.1f} "
              f"{r['median_pct_of_triad']:5.0f}%")
    b = summary["best"]
    print(f"\nbest at {big >> 20}M: {b['method']} (chunk {b['chunk_elems']}, THP={b['thp']}): "
          f"{b['params_per_s'] / 1e9:.2f} G params/s, {b['gbs']:.1f} GB/s = "
          f"{b['pct_of_triad']:.0f}% of triad (goal 70%: {'met' if summary['goal_met'] else 'NOT met'});"
          f" module auto = {AUTO_METHOD}")
    print(f"wrote {out_dir / (stem + '.json')} and {out_dir / (stem + '.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
