"""ZenFlow's host lane on the lent H100 and H200: each span kind measured in the run, by the
probes, and as `predict --from-run` costs it, and the candidate mechanisms tested across
the two machines (issue 44, item 2). Reads only committed files; simulates nothing.

Per machine (the qwen2.5-1.5b run, bf16, 1 x 1024, one GPU, its profile, its contention
probe, its `predict_host_lane_deepspeed/` fit, `FIT`):
- accumulation: the run's ZenFlow steps 1..U-2 hold nothing else on the host lane (the
  first window's AdamW is submitted at step U-1): P elements / their host-busy seconds;
- the window job (AdamW + bf16 wire + zeroing + its uploads issued): the zenflow row's
  `host_adam_params_per_s` counts the host_optim spans labelled in its measured steps,
  which hold exactly one window job (the run's last, run with nothing beside it);
- the window's host-busy seconds (every complete window after warm-up): U accumulations
  and the previous window's job interleaved;
- ZeRO-Offload's host job (its row's host_optim rate: wire -> fp32 gradient, AdamW, wire);
- the links (rows' GB/s) and the step (the row, and the steps of every complete window).

Then `mechanisms.csv`: each mechanism's constant derived on one machine, its prediction
for the other, the error, and the verdict (kept only if within `KEEP_WITHIN` both ways).

    python bench/host_lane_evidence.py [--results bench/results/gpu] [--out DIR]

Then `whatif.csv`: ZenFlow simulated again on each run's committed fit with the mechanisms'
costs (a few seconds). Writes the three CSVs into --out (default
bench/results/host_lane_evidence/).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.trace import write_csv_atomic  # noqa: E402
from zfbench.sims import host_traffic  # noqa: E402
from zfbench.sims.costs import ACCUM_BYTES_PER_ELEMENT  # noqa: E402
from zfbench.sims.host_step import CLIP_BYTES_PER_ELEM, CONVERT_BYTES_PER_ELEM  # noqa: E402

# machine name (docs/results.md "Machines") -> its folder under bench/results/gpu and the
# contention probe taken on the same machine as the run (H100: another H100-VM, the only one)
MACHINES = {
    "H100-VM": ("NVIDIA-H100-80GB-HBM3", "contention/link_host_contention.json"),
    "H200-VM": ("NVIDIA-H200/2026-11-27", "contention/link_host_contention.json"),
}
RUN = "run_qwen2.5-1.5b"
# The fit replayed: `predict --from-run RUN --gpu G --host-job deepspeed --out FIT`, the
# fit of DeepSpeed's host passes that these mechanisms were tested on (`predict --from-run`
# itself now fits the engine's own host job, into predict_host_lane/: M5 implemented)
FIT = "predict_host_lane_deepspeed"
# The accumulation's share of the fitted AdamW's stream these runs' committed fits were made
# with (sims/host_traffic.py's ACCUM_OVER_ADAM_STREAM until session 26): the runs' engine
# accumulated with torch ops, before the fused host kernels, and the replays here and in
# bench/host_accum_rules.py keep the fits' rule so that they reproduce them
FIT_ACCUM_OVER_ADAM_STREAM = 0.5
# Bytes a parameter of the engine's host jobs moved in these runs (real/strategies.py at
# the runs' commits, before the fused host kernels; the run's config): AdamW reads the fp32
# gradient and reads and writes the fp32 master, m and v (28 B); then the master goes into
# the bf16 h2d wire (4 B read + 2 B written). ZeRO-Offload's job first converts the bf16
# d2h wire into the fp32 gradient (2 B read + 4 B written); no clip pass
# (gradient_clipping 0.0: `clip_` returns at once). ZenFlow's window job zeroes the fp32
# window after AdamW (4 B written). With the fused kernels (AdamW writing the wire and
# zeroing in its pass) they are 36 and 34 B: the same ratio within 1%.
ENGINE_ZO_JOB_BYTES = 6.0 + 28.0 + 6.0       # 40
ENGINE_WINDOW_JOB_BYTES = 28.0 + 4.0 + 6.0   # 38
# DeepSpeed's host step as the presets simulate it (sims/host_step.py deepspeed_update)
DEEPSPEED_ZO_BYTES = CLIP_BYTES_PER_ELEM + host_traffic.ADAM_BYTES_PER_PARAM + CONVERT_BYTES_PER_ELEM
KEEP_WITHIN = 0.10  # a mechanism's cross-machine prediction error kept (judgment)


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def rounds_mean(probe: dict, key: str) -> float | None:
    vals = [r[key] for name, r in probe.items() if name.startswith("round") and key in r]
    return sum(vals) / len(vals) if vals else None


def complete_windows(steps: pd.Series, U: int) -> list[list[int]]:
    """Step numbers of each complete window after the first (warm-up) one: [kU .. kU+U-1]."""
    last = int(steps.max())
    return [list(range(s, s + U)) for s in range(U, last + 2 - U, U)]


def machine_facts(results: Path, name: str) -> dict:
    """Every number this table reads for one machine, with the file it came from (its
    `sim_*` numbers: the `FIT` folder's)."""
    folder, probe_path = MACHINES[name]
    base = results / folder
    run = base / RUN
    meta = _json(run / "summary.json")
    P = float(meta["settings"]["params"])
    U = int(meta["configs"]["zenflow"]["zenflow"]["update_interval"])
    rows = pd.read_csv(run / "summary.csv").set_index("strategy")
    steps = pd.read_csv(run / "steps.csv")
    zf = steps[steps["strategy"] == "zenflow"].set_index("step")
    zf_row, zo_row = rows.loc["zenflow"], rows.loc["zero-offload"]
    accum_steps = list(range(1, U - 1))
    prof_steps = pd.read_csv(base / "profile" / "steps.csv")
    prof_zf = prof_steps[prof_steps["strategy"] == "zenflow"].set_index("step")
    cal = _json(base / "profile" / "profile.json")["calibration"]
    probe = _json(base / probe_path)
    pred_rows = pd.read_csv(base / FIT / "summary.csv").set_index("strategy")
    pred_spans = pd.read_csv(base / FIT / "zenflow_spans_per_step.csv"
                             ).set_index("span")
    zf_threads, zo_threads = int(zf_row["host_threads"]), int(zo_row["host_threads"])
    lanes = cal.get("host_lanes") or {}
    wide = lanes.get("zero-offload") if zo_threads != zf_threads else None
    n_meas = int(zf_row["steps_measured"])
    windows = complete_windows(zf.index.to_series(), U)
    sim_zo_host = float(pred_rows.loc["zero-offload", "step_time_s"]
                        * pred_rows.loc["zero-offload", "host_busy_fraction"])
    return {
        "name": name, "folder": folder, "P": P, "U": U,
        "zf_threads": zf_threads, "zo_threads": zo_threads,
        "accum_steps": accum_steps,
        "accum_run_s": float(zf.loc[accum_steps, "host_busy_s"].mean()),
        "accum_profile_s": float(prof_zf.loc[accum_steps, "host_busy_s"].mean()),
        "accum_probe_eps": float(cal["host_accum_elems_per_s"]),
        "adam_probe_pps": float(cal["host_adam_params_per_s"]),
        "window_alone_s": P / U * n_meas / float(zf_row["host_adam_params_per_s"]),
        "windows": windows,
        "window_busy_s": [float(zf.loc[w, "host_busy_s"].sum()) for w in windows],
        "window_step_s": [float(zf.loc[w, "wall_s"].mean()) for w in windows],
        "row_steps": list(range(int(zf.index.max()) - n_meas + 1, int(zf.index.max()) + 1)),
        "row_step_s": float(zf_row["step_time_s"]),
        "zo_job_s": P / float(zo_row["host_adam_params_per_s"]),
        "chunk_probe_pps": rounds_mean(probe, "engine_chunks_adam_convert_zero_Gparams") * 1e9,
        "adam_alone_probe_pps": rounds_mean(probe, "adam_page_locked_alone_Gparams") * 1e9,
        "adam_beside_h2d_pps": rounds_mean(probe, "adam_page_locked_beside_h2d_Gparams") * 1e9,
        "h2d_beside_adam_Bps": rounds_mean(probe, "h2d_chunks_beside_adam_GBps") * 1e9,
        "h2d_alone_Bps": rounds_mean(probe, "h2d_chunks_alone_GBps") * 1e9,
        "convert_alone_eps": rounds_mean(probe, "convert_alone_Gelems") * 1e9,
        "zero_alone_eps": rounds_mean(probe, "zero_alone_Gelems") * 1e9,
        "h2d_run_Bps": float(zf_row["h2d_gb_per_s"]) * 1e9,
        "d2h_run_Bps": float(zf_row["d2h_gb_per_s"]) * 1e9,
        # threads scaling measured by the profile on this machine (None: one thread count)
        "adam_wide_over_narrow": (wide["host_adam_params_per_s"] / cal["host_adam_params_per_s"]
                                  if wide else None),
        "accum_wide_over_narrow": (wide["host_accum_elems_per_s"] / cal["host_accum_elems_per_s"]
                                   if wide else None),
        "sim_accum_s": float(pred_spans.loc["host_accum", "simulated_now_s_per_step"]),
        "sim_window_s": P / float(pred_rows.loc["zenflow", "host_adam_params_per_s"]),
        "sim_h2d_s": float(pred_spans.loc["h2d_param", "simulated_now_s_per_step"]),
        "sim_d2h_s": float(pred_spans.loc["d2h_grad", "simulated_now_s_per_step"]),
        "sim_step_s": float(pred_rows.loc["zenflow", "step_time_s"]),
        "sim_zo_host_s": sim_zo_host,
        "sim_zo_adam_s": P / float(pred_rows.loc["zero-offload", "host_adam_params_per_s"]),
    }


WIRE_BYTES = 2.0  # bf16: the runs' precision (their summary.json settings)


def span_rows(f: dict) -> list[dict]:
    """The per-span table of one machine: measured in the run, a reference (the probe, or
    the same span measured in isolation) and as `predict --from-run` costs it."""
    P, U, m = f["P"], f["U"], f["name"]
    run, prof = f"{f['folder']}/{RUN}", f"{f['folder']}/profile"

    def row(quantity, unit, measured, source, steps="", reference=None, reference_is="",
            simulated=None):
        return {"machine": m, "quantity": quantity, "unit": unit, "steps": steps,
                "measured": measured, "measured_from": source, "reference": reference,
                "reference_is": reference_is, "simulated": simulated,
                "measured_over_simulated": (measured / simulated
                                            if measured is not None and simulated else None)}
    acc = " ".join(map(str, f["accum_steps"]))
    probe_accum = "profile.json host_accum_elems_per_s (8 threads)"
    out = [
        row("accumulation rate", "G elements/s", P / f["accum_run_s"] / 1e9,
            f"{run}/steps.csv zenflow host_busy_s (accumulation only)", acc,
            f["accum_probe_eps"] / 1e9, probe_accum, P / f["sim_accum_s"] / 1e9),
        row("accumulation rate, the profile's run", "G elements/s",
            P / f["accum_profile_s"] / 1e9, f"{prof}/steps.csv zenflow host_busy_s", acc,
            f["accum_probe_eps"] / 1e9, probe_accum, P / f["sim_accum_s"] / 1e9),
        row("accumulation in the step", "s a step", f["accum_run_s"],
            f"{run}/steps.csv zenflow host_busy_s (accumulation only)", acc, None, "",
            f["sim_accum_s"]),
        row("window job alone (AdamW+wire+zero+uploads)", "s a window", f["window_alone_s"],
            f"{run}/summary.csv zenflow host_adam_params_per_s (its last window job)",
            " ".join(map(str, f["row_steps"])), P / f["chunk_probe_pps"],
            "contention probe engine_chunks_adam_convert_zero_Gparams", f["sim_window_s"]),
        row("ZeRO-Offload host job", "s a step", f["zo_job_s"],
            f"{run}/summary.csv zero-offload host_adam_params_per_s "
            f"({f['zo_threads']} threads)", "", f["sim_zo_adam_s"],
            "simulated: its AdamW part (the rest: clip and conversion)", f["sim_zo_host_s"]),
        row("uploads", "GB/s", f["h2d_run_Bps"] / 1e9, f"{run}/summary.csv zenflow h2d_gb_per_s",
            "", f["h2d_alone_Bps"] / 1e9, "contention probe h2d_chunks_alone_GBps",
            P * WIRE_BYTES / U / f["sim_h2d_s"] / 1e9),
        row("gradients down", "GB/s", f["d2h_run_Bps"] / 1e9,
            f"{run}/summary.csv zenflow d2h_gb_per_s", "", None, "",
            P * WIRE_BYTES / f["sim_d2h_s"] / 1e9),
        row("step, the row", "s", f["row_step_s"], f"{run}/summary.csv zenflow step_time_s",
            " ".join(map(str, f["row_steps"])), None, "", f["sim_step_s"]),
    ]
    sim_window_busy = U * f["sim_accum_s"] + f["sim_window_s"]
    for w, busy, step in zip(f["windows"], f["window_busy_s"], f["window_step_s"]):
        label = f"{w[0]}-{w[-1]}"
        out.append(row("window host busy", "s a window", busy,
                       f"{run}/steps.csv zenflow host_busy_s summed", label,
                       U * f["accum_run_s"] + f["window_alone_s"],
                       "U accumulations + the window job, each measured alone",
                       sim_window_busy))
        out.append(row("window's own job (busy - U accumulations)", "s a window",
                       busy - U * f["accum_run_s"], f"{run}/steps.csv", label,
                       f["window_alone_s"], "the window job measured alone",
                       f["sim_window_s"]))
        out.append(row("step, mean over the window", "s", step,
                       f"{run}/steps.csv zenflow wall_s", label, None, "", f["sim_step_s"]))
    return out


def thread_factor(f: dict, key: str) -> float:
    """How much slower ZenFlow's lane runs a pass than ZeRO-Offload's lane, from this
    machine's profile (1 where both lanes had the same threads)."""
    wide = f[key]
    return 1.0 if f["zo_threads"] == f["zf_threads"] or wide is None else wide


def verdict(errors: list[float | None]) -> str:
    errs = [e for e in errors if e is not None]
    if len(errs) < 2:
        return "not cross-checked (one machine)"
    return ("kept" if all(abs(e) <= KEEP_WITHIN for e in errs)
            else "rejected")


def mechanism_rows(fs: dict[str, dict]) -> list[dict]:
    """Each mechanism's constant from one machine, checked on the other."""
    names = list(fs)
    out = []

    def add(mech, derived_on, checked_on, constant, value, predicted, measured, unit, note=""):
        err = predicted / measured - 1.0 if predicted is not None and measured else None
        out.append({"mechanism": mech, "derived_on": derived_on, "checked_on": checked_on,
                    "constant": constant, "constant_value": value, "unit": unit,
                    "predicted": predicted, "measured": measured, "error": err,
                    "verdict": "", "note": note})
        return err

    def cross(mech, constant, derive, predict, measure, unit, note=""):
        errs = []
        for a in names:
            for b in names:
                if a != b:
                    v = derive(fs[a])
                    errs.append(add(mech, a, b, constant, v, predict(fs[b], v), measure(fs[b]),
                                    unit, note))
        return errs

    def close(errs, start):
        for r in out[start:]:
            r["verdict"] = verdict(errs)

    # M1: host DRAM shared between the AdamW stream and the uploads' DMA reads: a ceiling on
    # the two together, from the probe's AdamW beside the h2d copy loop
    start = len(out)
    close(cross("M1 host DRAM shared by AdamW and DMA uploads",
                "AdamW bytes/s + h2d bytes/s, beside each other (GB/s)",
                lambda f: (f["adam_beside_h2d_pps"] * host_traffic.ADAM_BYTES_PER_PARAM
                           + f["h2d_beside_adam_Bps"]) / 1e9,
                lambda f, c: min(f["adam_alone_probe_pps"],
                                 (c * 1e9 - f["h2d_beside_adam_Bps"])
                                 / host_traffic.ADAM_BYTES_PER_PARAM) / 1e9,
                lambda f: f["adam_beside_h2d_pps"] / 1e9, "G params/s (probe, beside h2d)"),
          start)
    # M1b: the same, as a byte budget on the window job: its uploads add WIRE/34 of traffic
    start = len(out)
    errs = [add("M1b uploads' bytes beside the window job (byte budget)", n, n,
                "upload bytes / window job bytes", WIRE_BYTES / ENGINE_WINDOW_JOB_BYTES,
                fs[n]["sim_window_s"] * (1 + WIRE_BYTES / ENGINE_WINDOW_JOB_BYTES),
                fs[n]["window_alone_s"], "s a window",
                "at most this share slower if DRAM-bound") for n in names]
    for r in out[start:]:
        r["verdict"] = ("rejected" if any(abs(e) > KEEP_WITHIN for e in errs) else "kept")
    # M2: the AdamW-then-wire chunk's extra passes: the probe's chunk rate carried to the run
    start = len(out)
    close(cross("M2 the chunk's extra passes (probe chunk -> run)",
                "run window job rate / probe chunk rate",
                lambda f: (f["P"] / f["window_alone_s"]) / f["chunk_probe_pps"],
                lambda f, k: f["P"] / (f["chunk_probe_pps"] * k),
                lambda f: f["window_alone_s"], "s a window"), start)
    start = len(out)
    errs = [add("M2b the chunk as the sum of its passes (probe)", n, n, "none", None,
                1e-9 / (1 / fs[n]["adam_alone_probe_pps"] + 1 / fs[n]["convert_alone_eps"]
                        + 1 / fs[n]["zero_alone_eps"]),
                fs[n]["chunk_probe_pps"] / 1e9, "G params/s (probe chunk)") for n in names]
    for r in out[start:]:
        r["verdict"] = ("kept" if all(abs(e) <= KEEP_WITHIN for e in errs) else "rejected")
    # M3: the host lane's threads (ZenFlow's pt_reserved_cores_perc share of ZeRO-Offload's
    # lane): the simulator's ZenFlow window over its ZeRO-Offload AdamW (both on the fitted
    # node) against the profile's AdamW on ZenFlow's threads over ZeRO-Offload's
    start = len(out)
    for n in names:
        f = fs[n]
        sim_scaling = f["sim_zo_adam_s"] / f["sim_window_s"]
        add("M3 host-lane threads: simulated scaling vs the profile's", n, n,
            "ZenFlow lane's AdamW rate / ZeRO-Offload lane's, simulated", sim_scaling,
            sim_scaling, 1.0 / thread_factor(f, "adam_wide_over_narrow"), "rate ratio",
            f"threads {f['zf_threads']} of {f['zo_threads']}; the profile measured "
            + ("both lanes" if f["adam_wide_over_narrow"] else "one thread count"))
    for r in out[start:]:
        r["verdict"] = "rejected (the simulator already scales as measured)"
    # M4: NUMA: the fitted host is the preset's two sockets, unbound (numa_factor on every
    # pass); the fit absorbs it into AdamW and the ratio carries it to the accumulation
    for n in names:
        add("M4 NUMA (the preset's two sockets)", n, n, "change in ZenFlow's host spans", 0.0,
            None, None, "-", "the factor multiplies the fitted AdamW and the accumulation "
            "alike and cancels; the VMs' NUMA layout is not recorded")
        out[-1]["verdict"] = "rejected (no effect in the model)"
    # M5: the fit splits ZeRO-Offload's host time as DeepSpeed's passes (clip, AdamW,
    # conversion at the preset's judged stream); the engine runs one job of its own bytes.
    # The window job = ZeRO-Offload's job x its bytes ratio (38/40) x the thread scaling measured
    # on the machine
    def m5(f, k=1.0):
        return (f["zo_job_s"] * ENGINE_WINDOW_JOB_BYTES / ENGINE_ZO_JOB_BYTES
                * thread_factor(f, "adam_wide_over_narrow") * k)
    start = len(out)
    for n in names:
        add("M5 engine's host job in the fit (no constant)", n, n, "none", None, m5(fs[n]),
            fs[n]["window_alone_s"], "s a window",
            f"ZeRO-Offload job {fs[n]['zo_job_s']:.3f} s x 38/40 x threads "
            f"{thread_factor(fs[n], 'adam_wide_over_narrow'):.3f}")
    errs = cross("M5 engine's host job in the fit (residual carried)",
                 "window job measured / M5 predicted",
                 lambda f: f["window_alone_s"] / m5(f), m5,
                 lambda f: f["window_alone_s"], "s a window")
    close(errs, start)
    # M6: the accumulation at a share of the engine ZeRO-Offload job's stream
    def stream(f):  # bytes/s of ZeRO-Offload's job on ZenFlow's threads
        return (f["P"] * ENGINE_ZO_JOB_BYTES / f["zo_job_s"]
                / thread_factor(f, "adam_wide_over_narrow"))
    start = len(out)
    close(cross("M6 accumulation at a share of the ZeRO-Offload job's stream",
                "accumulation bytes/s / job stream on ZenFlow's threads",
                lambda f: f["P"] / f["accum_run_s"] * ACCUM_BYTES_PER_ELEMENT / stream(f),
                lambda f, r: stream(f) * r / ACCUM_BYTES_PER_ELEMENT / 1e9,
                lambda f: f["P"] / f["accum_run_s"] / 1e9, "G elements/s"), start)
    return out


def replay_rows(results: Path, fs: dict[str, dict]) -> list[dict]:
    """ZenFlow simulated again on each run's fitted node (`FIT/inferred*.json`),
    with M5's window job in place of the fitted AdamW: what the mechanism would do to the
    predicted step. A what-if on the committed fit, not a change to the simulator."""
    from zfbench.sims.costs import SimSettings
    from zfbench.simulation import run

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, f in fs.items():
            base = results / f["folder"] / FIT
            hw = _json(base / "inferred_hardware.json")
            host_name = next(iter(hw["hosts"]))
            adam = hw["hosts"][host_name]["adam_params_per_s_per_core"]["value"]
            knobs = {k: v for k, v in _json(base / "inferred.json")["settings"].items()
                     if v is not None}
            knobs.update(gpu=next(iter(hw["gpus"])), pcie=next(iter(hw["host_links"])),
                         host=host_name)
            accum0 = host_traffic.accum_elems_per_s(adam, FIT_ACCUM_OVER_ADAM_STREAM)
            # M5: the window job costs 38/40 of ZeRO-Offload's whole fitted host job, not
            # its AdamW part: the fitted AdamW slowed by that share (the simulator's own
            # thread scaling kept: M3)
            m5 = f["sim_zo_adam_s"] / (f["sim_zo_host_s"] * ENGINE_WINDOW_JOB_BYTES
                                       / ENGINE_ZO_JOB_BYTES)
            variants = [
                ("now (committed fit)", adam, accum0),
                ("M5: window job from the fitted ZeRO-Offload host job (x38/40)",
                 adam * m5, accum0),
                ("M5, accumulation following the slower AdamW (ratio rule kept)",
                 adam * m5, host_traffic.accum_elems_per_s(adam * m5, FIT_ACCUM_OVER_ADAM_STREAM)),
            ]
            first = f["window_step_s"][0]
            for i, (label, adam_core, accum_core) in enumerate(variants):
                h = json.loads(json.dumps(hw))
                h["hosts"][host_name]["adam_params_per_s_per_core"]["value"] = adam_core
                path = Path(tmp) / f"{n}-{i}.json"
                path.write_text(json.dumps(h), encoding="utf-8")
                settings = SimSettings.from_knobs(**{**knobs, "hardware": str(path),
                                                     "host_accum_per_core": accum_core})
                rows, _ = run([({}, settings)], ["zenflow"], quiet=True)
                step = float(rows[0]["step_time_s"])
                out.append({"machine": n, "variant": label,
                            "adam_scale": adam_core / adam,
                            "accum_per_core_G": accum_core / 1e9, "step_s": step,
                            "measured_row_s": f["row_step_s"],
                            "error_vs_row": step / f["row_step_s"] - 1.0,
                            "measured_first_window_s": first,
                            "error_vs_first_window": step / first - 1.0})
    return out


def bench_parser(doc: str, out: str) -> argparse.ArgumentParser:
    """The flags of this script and of bench/host_accum_rules.py: --results (the committed
    machines' folder) and --out (default bench/results/OUT)."""
    p = argparse.ArgumentParser(description=doc, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "gpu")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / out)
    return p


def parse_checked(doc: str, out: str, argv, folders) -> argparse.Namespace:
    """bench_parser's flags parsed, with one clear error when a machine of `folders` (under
    --results) has no committed run."""
    p = bench_parser(doc, out)
    args = p.parse_args(argv)
    missing = [str(args.results / d / RUN) for d in folders
               if not (args.results / d / RUN).is_dir()]
    if missing:
        p.error(f"no committed run at {', '.join(missing)}: give --results the folder "
                f"holding bench/results/gpu's machines")
    return args


def write_and_show(out: Path, tables: dict[str, tuple[pd.DataFrame, pd.DataFrame]],
                   colwidth: int = 48) -> None:
    """Each table into out/NAME (atomically), then its shown view printed."""
    out.mkdir(parents=True, exist_ok=True)
    for name, (table, _) in tables.items():
        write_csv_atomic(table, out / name)
    with pd.option_context("display.width", 200, "display.max_columns", 20,
                           "display.max_colwidth", colwidth, "display.precision", 3):
        for _, shown in tables.values():
            print(shown.to_string(index=False))
    print(f"wrote {', '.join(tables)} in {out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_checked(__doc__, "host_lane_evidence", argv,
                         [d for d, _ in MACHINES.values()])
    fs = {n: machine_facts(args.results, n) for n in MACHINES}
    spans = pd.DataFrame([r for f in fs.values() for r in span_rows(f)])
    mechs = pd.DataFrame(mechanism_rows(fs))
    whatif = pd.DataFrame(replay_rows(args.results, fs))
    write_and_show(args.out, {
        "host_lane_spans.csv": (spans, spans.drop(columns=["measured_from"])),
        "mechanisms.csv": (mechs, mechs.drop(columns=["note", "constant"])),
        "whatif.csv": (whatif, whatif)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
