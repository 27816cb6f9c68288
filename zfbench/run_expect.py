"""What the simulator expects for the machine that just ran `python -m zfbench.run`.

A one-rank run measures this machine's profile for its shape (zfbench.real.profile:
per-block compute, the lanes' copy rates alone and together, host AdamW, accumulation and
conversion rates on the host lane's threads, and how much the lanes slow each other over
the shared DRAM) as `zfbench.validate` does, because the machine drifts (`Calibration`):
once before the strategies run and once after (the mean is used), and the memory-bound
host and link rates again right before and after each strategy (each strategy is
simulated with its own). `expect_here` simulates every strategy with its profile, and
returns one row per strategy with the measured and the simulated step, stall and its
parts side by side (`format_expectation`). `describe_lanes` says what bounds the gain here:
the threads of each lane and the rates each lane achieved, beside the bandwidth the host
kernels reach alone. The profiles are written beside the run's files (OUT/profile.json,
the mean; OUT/profiles/<strategy>.json, with that strategy's rates) so
`python -m zfbench.simulate --profile` can replay them.

Several ranks that share this CPU are not simulated here: the simulator's emulated lanes
give every rank cores of its own, which 4 ranks on 2 cores do not have, so the run says
so instead of printing a comparison that would mislead.

Part of the command `python -m zfbench.run`: like the command, it imports real/ and sims/
(docs/design.md's arrows).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

# The columns compared, measured vs simulated.
PARTS = ("step_time_s", "stall_fraction", "exposed_io_s", "host_wait_s")
PROBE_REPEATS = 3  # host and link rates around each strategy: median of this many


class Calibration:
    """This machine's profile for one run, measured around it: `begin()` before the first
    strategy, `around(strategy)` (a context) around each, `finish(out)` after the last;
    then `paths[strategy]` is the profile each strategy is simulated with."""

    def __init__(self, spec) -> None:
        self.spec = spec
        self.rates: dict[str, dict] = {}
        self.paths: dict[str, Path] = {}

    def begin(self) -> None:
        from zfbench.real.engine import resolve_device
        from zfbench.real.flat import device_dtype
        from zfbench.real.profile import measure_profile
        from zfbench.real.rate_probe import RateProbe

        self.before = measure_profile(self.spec)
        cal = self.before["calibration"]
        self.probe = RateProbe(self.spec.shape().total_params,
                               device_dtype(cal["precision"]), cal["host_threads"],
                               device=resolve_device(self.spec.device))

    @contextmanager
    def around(self, strategy: str):
        from zfbench.real.profile import mean_profile

        ahead = self.probe.measure(PROBE_REPEATS)
        yield
        self.rates[strategy] = mean_profile([ahead, self.probe.measure(PROBE_REPEATS)])

    def finish(self, out: Path) -> Path:
        """Write OUT/profile.json (the mean of before and after) and one profile per
        strategy; return the mean's path."""
        from zfbench.core.trace import write_json_atomic
        from zfbench.real.profile import mean_profile, measure_profile, with_rates

        self.probe.close()
        del self.probe
        profile = mean_profile([self.before, measure_profile(self.spec)])
        path = out / "profile.json"
        write_json_atomic(path, profile)
        for strategy, rates in self.rates.items():
            self.paths[strategy] = out / "profiles" / f"{strategy}.json"
            write_json_atomic(self.paths[strategy], with_rates(profile, rates))
        return path


def expect_here(spec, configs: dict, strategies: list[str], profiles: dict) -> list[dict]:
    """Simulate each strategy with its profile (`profiles[strategy]`, a path) at the
    run's shape, steps and ZenFlow knobs: one row per strategy
    (zfbench.simulate_report.summary_row)."""
    from zfbench.run_report import zenflow_knobs
    from zfbench.sims.costs import SimSettings
    from zfbench.sims.simulator import simulate, steps_needed
    from zfbench.simulation import summary_row

    rows = []
    for strategy in strategies:
        profile_path = profiles[strategy]
        cfg = configs[strategy]
        knobs = zenflow_knobs(cfg.zenflow)
        settings = SimSettings(model=spec.model, layers=spec.layers, gpus=1,
                               micro_batch=spec.batch, seq=spec.seq,
                               precision=cfg.precision, transfers="full",
                               profile=str(profile_path), steps=spec.steps, **knobs)
        settings = settings.with_(steps=max(settings.steps, steps_needed(settings)))
        rows.append(summary_row(simulate(settings, strategy)))
    return rows


def side_by_side(measured: list[dict], simulated: list[dict]) -> list[dict]:
    """One row per strategy: each of PARTS measured and simulated, and the step's error."""
    sims = {r["strategy"]: r for r in simulated}
    out = []
    for row in measured:
        sim = sims.get(row["strategy"])
        if sim is None:
            continue
        pair = {"strategy": row["strategy"]}
        for part in PARTS:
            pair[f"measured_{part}"] = row[part]
            pair[f"simulated_{part}"] = sim[part]
        pair["step_error_pct"] = 100 * (sim["step_time_s"] - row["step_time_s"]) / \
            row["step_time_s"]
        out.append(pair)
    base = {p["strategy"]: p for p in out}.get("zero-offload")
    for pair in out:
        for side in ("measured", "simulated"):
            pair[f"{side}_over_zero_offload"] = (
                pair[f"{side}_step_time_s"] / base[f"{side}_step_time_s"]
                if base else float("nan"))
    return out


def format_expectation(pairs: list[dict]) -> str:
    """The table: step, stall and its parts, measured | simulated."""
    head = (f"{'strategy':>16}  {'step_s meas|sim':>17}  {'err%':>6}  "
            f"{'/zero-offload':>13}  {'stall% meas|sim':>15}  {'exp_io_s meas|sim':>17}  "
            f"{'host_wait_s meas|sim':>20}")
    lines = [head]
    for p in pairs:
        lines.append(
            f"{p['strategy']:>16}  {p['measured_step_time_s']:>8.3f}|"
            f"{p['simulated_step_time_s']:<8.3f}  {p['step_error_pct']:>+6.1f}  "
            f"{p['measured_over_zero_offload']:>6.2f}|{p['simulated_over_zero_offload']:<6.2f}  "
            f"{100 * p['measured_stall_fraction']:>7.1f}|"
            f"{100 * p['simulated_stall_fraction']:<7.1f}  "
            f"{p['measured_exposed_io_s']:>8.3f}|{p['simulated_exposed_io_s']:<8.3f}  "
            f"{p['measured_host_wait_s']:>10.3f}|{p['simulated_host_wait_s']:<9.3f}")
    return "\n".join(lines)


def describe_lanes(profile: dict) -> str:
    """The lanes this machine gave the run and the rates the profile measured on them."""
    cal = profile["calibration"]
    adam = cal["host_adam_params_per_s"]
    accum = cal["host_accum_elems_per_s"]
    parts = [f"lanes here: device {cal['device_threads']} thread(s), host "
             f"{cal['host_threads']} thread(s), over one DRAM",
             f"host AdamW {adam / 1e6:.0f}M params/s ({adam * 28 / 1e9:.1f} GB/s at 28 B "
             f"per parameter), accumulation {accum / 1e6:.0f}M elements/s",
             f"d2h {cal['d2h_bytes_per_s'] / 1e9:.1f} GB/s, h2d "
             f"{cal['h2d_bytes_per_s'] / 1e9:.1f} GB/s"]
    factors = (cal.get("compute_factor_when_host_busy"),
               cal.get("host_factor_when_compute_busy"))
    if None not in factors:
        parts.append(f"while both lanes run, compute goes at {factors[0]:.2f}x and host "
                     f"work at {factors[1]:.2f}x of their rates alone")
    return "; ".join(parts)


def verdict(pairs: list[dict], target: float = 0.8) -> str | None:
    """Whether ZenFlow's step reached `target` x ZeRO-Offload's, measured, and whether the
    simulator expected it could on this machine; None without both strategies."""
    zf = {p["strategy"]: p for p in pairs}.get("zenflow")
    if zf is None or zf["measured_over_zero_offload"] != zf["measured_over_zero_offload"]:
        return None
    measured, simulated = zf["measured_over_zero_offload"], zf["simulated_over_zero_offload"]
    if measured <= target:
        return (f"ZenFlow's step is {measured:.2f}x ZeRO-Offload's here (simulated "
                f"{simulated:.2f}x): within the {target}x target")
    if simulated > target:
        return (f"ZenFlow's step is {measured:.2f}x ZeRO-Offload's here, and the simulator "
                f"expects {simulated:.2f}x for this machine's lanes: the {target}x target is "
                f"out of reach on this machine, not a fault of the run (see the lanes above)")
    return (f"ZenFlow's step is {measured:.2f}x ZeRO-Offload's here, but the simulator "
            f"expects {simulated:.2f}x for this machine's lanes: the run is slower than its "
            f"model says; compare the parts above (and python -m zfbench.validate)")


def print_expectation(spec, configs: dict, strategies: list[str], measured: list[dict],
                      profile_path: Path, profiles: dict) -> list[dict]:
    """The simulator's expectation for this machine beside each measured strategy
    (zfbench.run_expect), what the lanes are, and whether ZenFlow reached its target."""
    import json

    pairs = side_by_side(measured, expect_here(spec, configs, strategies, profiles))
    print(f"\nSIMULATED FOR THIS MACHINE (the profiles measured around the run, "
          f"{profile_path.parent / 'profiles'}), beside the measured run:")
    print(format_expectation(pairs))
    print("  " + describe_lanes(json.loads(Path(profile_path).read_text())))
    said = verdict(pairs)
    if said:
        print("  " + said)
    return pairs
