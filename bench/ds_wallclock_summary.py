"""What bench/ds_wallclock.py makes of its per-step rows: one run's steady means
(`summarize`: step time mean and median, per-window means, update and other steps, phase
means, foreign CPU and run-queue wait shares, quiet windows, DeepSpeed's timers), the
repeats of a shape and engine pooled (`pool`: summary.json's `pooled`), and the table
printed at the end (`report`).
"""

from __future__ import annotations

import statistics


def summarize(rows: list, U: int, cores: int) -> dict:
    steady = [r for r in rows if r["steady"]]
    if not steady:
        return {"steady_steps": 0}
    times = [r["step_s"] for r in steady]
    wins = [steady[i:i + U] for i in range(0, len(steady) - U + 1, U)]
    windows = [sum(r["step_s"] for r in w) / U for w in wins]
    quiet = [m for m, w in zip(windows, wins)  # our threads waited < 5 % of the window
             if sum(r["runq_wait_s"] for r in w) < 0.05 * U * m]
    timers = {k: {"mean_s": _mean(r["timers"][k] for r in steady if k in r["timers"]),
                  "n": sum(k in r["timers"] for r in steady)}
              for k in sorted({k for r in steady for k in r["timers"]})}
    foreign = sum(r["foreign_cpu_s"] for r in steady)
    return {"steady_steps": len(steady), "step_s_mean": statistics.fmean(times),
            "step_s_median": statistics.median(times),
            "window_means_s": [round(w, 5) for w in windows],
            "update_step_s_mean": _mean(r["step_s"] for r in steady if r["update"]),
            "other_step_s_mean": _mean(r["step_s"] for r in steady if not r["update"]),
            "phase_mean_s": {k: statistics.fmean(r[k] for r in steady)
                             for k in ("fwd_s", "bwd_s", "opt_s")},
            "foreign_cpu_share": foreign / (sum(times) * cores),
            "runq_wait_share": sum(r["runq_wait_s"] for r in steady) / sum(times),
            "quiet_windows": len(quiet), "quiet_step_s_mean": _mean(quiet),
            "timers_mean_over_steady_steps_printing_them": timers}


def _mean(xs):
    xs = list(xs)
    return statistics.fmean(xs) if xs else None


def pool(summaries: list) -> list[dict]:
    """Per (shape, engine): the repeats' steady means averaged (equal step counts)."""
    groups: dict[tuple, list] = {}
    for s in summaries:
        groups.setdefault((s["shape"], s["batch"], s["seq"], s["engine"]), []).append(s)
    out = []
    for (name, batch, seq, engine), runs in groups.items():
        tm = [r["timers_mean_over_steady_steps_printing_them"] for r in runs]
        quiet = [r["quiet_step_s_mean"] for r in runs if r["quiet_step_s_mean"] is not None]
        out.append({"shape": name, "batch": batch, "seq": seq, "engine": engine,
                    "n_params": runs[0]["n_params"], "repeats": len(runs),
                    "step_s_mean": _mean(r["step_s_mean"] for r in runs),
                    "step_s_mean_per_repeat": [r["step_s_mean"] for r in runs],
                    "step_s_median_of_repeat_medians": statistics.median(
                        r["step_s_median"] for r in runs),
                    "quiet_step_s_mean_of_repeats": _mean(quiet),
                    "foreign_cpu_share": _mean(r["foreign_cpu_share"] for r in runs),
                    "runq_wait_share": _mean(r["runq_wait_share"] for r in runs),
                    "timers_mean_s": {k: _mean(t[k]["mean_s"] for t in tm if k in t)
                                      for k in sorted({k for t in tm for k in t})}})
    return out


def report(pooled: list) -> None:
    print("\n== steady step time, s (mean over steady steps and repeats); ZeRO-Offload timers ==")
    hdr = ("params", "zero_off", "fwd", "bwd_inner", "bwd_allred", "step", "opt_step",
           "zf_seq", "zf_overlap", "runq_wait")
    print(f"{'shape':<28}" + "".join(f"{h:>11}" for h in hdr))
    by: dict[tuple, dict] = {}
    for p in pooled:
        by.setdefault((p["shape"], p["batch"], p["seq"]), {})[p["engine"]] = p
    for (name, b, q), runs in by.items():
        z = runs.get("zero_offload", {})
        cells = [z.get("step_s_mean")] + [z.get("timers_mean_s", {}).get(k) for k in
                                          ("fwd", "bwd_inner", "bwd_allreduce", "step",
                                           "optimizer_step")]
        cells += [runs.get(e, {}).get("step_s_mean") for e in ("zenflow_seq", "zenflow_overlap")]
        wait = 100 * max(r["runq_wait_share"] for r in runs.values())  # worst engine
        print(f"{f'{name} b{b} s{q}':<28}{next(iter(runs.values()))['n_params'] / 1e6:>10.1f}M"
              + "".join(f"{c:>11.4f}" if c is not None else f"{'n/a':>11}" for c in cells)
              + f"{wait:>10.0f}%")
