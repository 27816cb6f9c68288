"""What the simulator expects for the machine that just ran `python -m zfbench.run`.

A one-rank run measures this machine's profile for its shape (zfbench.real.profile) as
`zfbench.validate` does, because the machine drifts (`Calibration`): once before the
strategies run and once after (the mean is used), and the memory-bound host and link
rates again right before and after each strategy (each strategy is simulated with its
own). `expect_here` simulates every strategy with its profile and returns one row per
strategy, measured and simulated step, stall and its parts side by side
(`format_expectation`); `describe_lanes` says what bounds the gain here (each lane's
threads and achieved rates, beside the bandwidth the host kernels reach alone). The
profiles are written beside the run's files (OUT/profile.json, the mean;
OUT/profiles/<strategy>.json, an earlier run's of other strategies removed) so
`python -m zfbench.simulate --profile` can replay them.

Several ranks on this CPU (`--gpus 4` without a GPU) are simulated as they run: rank 0
measures the profile and rates alone while the others wait at a barrier (with the threads
the engine gives each rank, `zfbench.real.distributed.rank_threads`), every rank then
times the engine's own all-reduce and all-gather together (zfbench.real.collective_probe),
and the simulator runs the ranks on the machine's cores (zfbench.sims.emulated.cpu_share).
With CUDA the expectation is not printed (zfbench.validate covers one GPU).

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
    then `paths[strategy]` is the profile each strategy is simulated with. With several
    ranks (`ctx`, a launched run) every rank calls each of them; rank 0 measures (module
    docstring) and alone gets the paths."""

    def __init__(self, spec, ctx=None, cores: int | None = None) -> None:
        self.spec = spec
        self.ctx = ctx if ctx is not None and ctx.active else None
        self.lead = self.ctx is None or self.ctx.rank == 0
        self.cores = cores  # the machine's cores the ranks share (None: bound apart)
        self.rates: dict[str, dict] = {}
        self.paths: dict[str, Path] = {}
        self.collectives: list[dict] = []

    def _rank_spec(self):
        """The spec with each lane's threads as the engine gives them on one of the ranks."""
        from dataclasses import replace

        from zfbench.real.distributed import rank_threads

        if self.ctx is None:
            return self.spec
        device, host = rank_threads(self.ctx.world)
        return replace(self.spec, device_threads=self.spec.device_threads or device,
                       host_threads=self.spec.host_threads or host)

    def _rank_lanes(self) -> dict[str, int] | None:
        """Each strategy's host threads on a GPU as the engine gives them on one of the
        ranks (None: one rank, the profile's own default); none where --host-threads
        fixed one count for all."""
        from zfbench.real.distributed import host_threads_by_strategy

        if self.ctx is None:
            return None
        if self.spec.host_threads:
            return {}
        return host_threads_by_strategy(0.5, self.ctx.world, active=True)

    def _sync(self, op: str) -> None:
        if self.ctx is not None:
            from zfbench.real.distributed import barrier

            barrier(self.ctx, op)

    def _time_collectives(self) -> None:
        if self.ctx is None:
            return
        from zfbench.real.collective_probe import measure_collectives
        from zfbench.real.flat import device_dtype

        cfg = self.spec.engine_config("device", self.ctx.world)
        self.collectives.append(measure_collectives(
            self.ctx, self.spec.shape().total_params, device_dtype(cfg.precision)))

    def begin(self) -> None:
        from zfbench.real.engine import resolve_device
        from zfbench.real.flat import device_dtype
        from zfbench.real.profile import measure_profile
        from zfbench.real.rate_probe import RateProbe, strategy_threads_of

        if self.lead:
            self.before = measure_profile(self._rank_spec(),
                                          strategy_threads=self._rank_lanes())
            cal = self.before["calibration"]
            self.probe = RateProbe(self.spec.shape().total_params,
                                   device_dtype(cal["precision"]), cal["host_threads"],
                                   device=resolve_device(self.spec.device),
                                   strategy_threads=strategy_threads_of(cal))
        self._sync("calibration_begin")
        self._time_collectives()

    def _probe_alone(self) -> dict | None:
        """Rank 0's host and link rates while the other ranks wait."""
        self._sync("rate_probe")
        rates = self.probe.measure(PROBE_REPEATS) if self.lead else None
        self._sync("rate_probe_done")
        return rates

    @contextmanager
    def around(self, strategy: str):
        from zfbench.real.profile_record import mean_profile

        ahead = self._probe_alone()
        yield
        after = self._probe_alone()
        if self.lead:
            self.rates[strategy] = mean_profile([ahead, after])

    def finish(self, out: Path) -> Path | None:
        """Write OUT/profile.json (the mean of before and after) and one profile per
        strategy; return the mean's path (None on ranks other than 0)."""
        from zfbench.core.trace import write_json_atomic
        from zfbench.real.profile import measure_profile
        from zfbench.real.profile_record import mean_profile, with_rates
        from zfbench.report import remove_stale
        from zfbench.run.report import PROFILE_FILES

        self._time_collectives()
        if not self.lead:
            return None
        self.probe.close()
        del self.probe
        profile = mean_profile([self.before, measure_profile(self._rank_spec())])
        if self.ctx is not None:  # the ranks' collectives and the cores they share
            profile = with_rates(profile, {**mean_profile(self.collectives),
                                           "cpu_cores": self.cores})
        path = out / "profile.json"
        write_json_atomic(path, profile)
        for strategy, rates in self.rates.items():
            self.paths[strategy] = out / "profiles" / f"{strategy}.json"
            write_json_atomic(self.paths[strategy], with_rates(profile, rates))
        # an earlier run's profiles of strategies this one did not run
        remove_stale(out, PROFILE_FILES, [p.relative_to(out) for p in self.paths.values()])
        return path


def expect_here(spec, configs: dict, strategies: list[str], profiles: dict,
                ranks: int = 1) -> list[dict]:
    """Simulate each strategy with its profile (`profiles[strategy]`, a path) at the
    run's shape, steps, ranks and ZenFlow knobs: one row per strategy
    (zfbench.simulation.summary_row)."""
    from zfbench.sims.settings import for_engine_run
    from zfbench.sims.simulator import simulate, steps_needed
    from zfbench.simulation import summary_row

    rows = []
    for strategy in strategies:
        settings = for_engine_run(configs[strategy], model=spec.model, layers=spec.layers,
                                  gpus=ranks, micro_batch=spec.micro_batch, seq=spec.seq,
                                  profile=str(profiles[strategy]), steps=spec.steps)
        settings = settings.with_(steps=max(settings.measurement.steps, steps_needed(settings)))
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
    ranks = cal.get("collective_ranks")
    if ranks:
        cores = cal.get("cpu_cores")
        threads = ranks * (cal["device_threads"] + cal["host_threads"])
        parts.append((f"{ranks} ranks' {threads} lane threads share {cores} core(s)"
                      if cores else f"{ranks} ranks, each bound to cores of its own") +
                     f"; gloo all-reduce {_gb_per_s(cal['allreduce_s_per_byte'])} and "
                     f"all-gather {_gb_per_s(cal['allgather_s_per_byte'])} of the "
                     f"buffer (+{1e3 * cal['allreduce_s_fixed']:.1f} and "
                     f"+{1e3 * cal['allgather_s_fixed']:.1f} ms each), measured with every "
                     f"rank in them")
    return "; ".join(parts)


def _gb_per_s(seconds_per_byte: float) -> str:
    return f"{1e-9 / seconds_per_byte:.2f} GB/s" if seconds_per_byte > 0 else "no per-byte cost"


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
                      profile_path: Path, profiles: dict, ranks: int = 1) -> list[dict]:
    """The simulator's expectation for this machine beside each measured strategy
    (zfbench.run.expect), what the lanes are, and whether ZenFlow reached its target."""
    import json

    pairs = side_by_side(measured, expect_here(spec, configs, strategies, profiles, ranks))
    print(f"\nSIMULATED FOR THIS MACHINE (the profiles measured around the run, "
          f"{profile_path.parent / 'profiles'}), beside the measured run:")
    print(format_expectation(pairs))
    print("  " + describe_lanes(json.loads(Path(profile_path).read_text())))
    said = verdict(pairs)
    if said:
        print("  " + said)
    return pairs
