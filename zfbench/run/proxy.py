"""What `python -m zfbench.run` measures when the named model cannot be measured whole
here, and what it then says about the whole model on a GPU node.

`llama2-7b` on 4 ranks of a 24 GiB machine without a GPU needs about 800 GiB: every rank
holds a replica. Instead of refusing, the run measures a proxy, a slice of the named
model (zfbench.core.models: `with_layers`, `with_width`), and says so in its first lines
and in summary.json (`proxy`):

- **Which slice** (`choose_proxy`): full width first, then each power-of-two width down to
  one attention head; at each width the greatest depth that fits memory with room to
  spare (zfbench.real.memory.MemoryCheck.suggestable) and within the time budget. A width
  slice shrinks every matrix, embedding and head included, so the shares of embedding,
  layers and head, and with them the per-parameter ratios of compute, host optimizer
  work and bytes copied, stay those of the same depth at full width.
- **The time budget**: at most `PROXY_HOST_ADAM_S` of host AdamW per step at the rate
  measured here (its measurements beside it). **Steps**, unless --steps is given: warm-up
  plus two of the longest window (zfbench.run.report.measurement_window): 16 with U = 4.

After the measured table, `project_to_node` simulates the named model whole on a GPU
node (`SimSettings`' defaults), stating what carries over from this machine (host
accumulation's rate per core, measured with the engine's kernel; the regime, host AdamW
over forward+backward, on the proxy beside the node's); every other number comes from the
node's presets, each with its source: a CPU cannot measure a GPU. Part of the command
`python -m zfbench.run`: like it, it imports real/ and sims/ (docs/design.md's arrows).
"""
from __future__ import annotations

import os

from zfbench.core.models import ModelShape
from zfbench.core.strategies import BASELINE, windowed_of

# Seconds of host AdamW per step the proxy may need, at the rate measured here on one
# rank's host threads before the run (`measure_host_rates`, the engine's own kernels). A
# judgment: on gloo ranks that share the CPU, a whole offloaded step took 10-40x its host
# AdamW alone (the collectives dominate: an AMD EPYC Zen 4 with 2 cores, 4 ranks,
# llama2-7b[1L][w0.25], 29 M parameters: 0.5 s per zero-offload step, the whole run of
# four strategies 48 s; at [w0.5], 116 M parameters, 5 s per step), so 0.1 s keeps four
# strategies within a few minutes on a 2-core machine (there, on 2026-11-25: 1.4 G
# params/s measured on one thread gave llama2-7b[4L][w0.25], 67 M parameters, and the
# whole command took 2 minutes; 0.6 G params/s, measured while other work shared the
# cores, gave [7L][w0.125] at half the budget, 70 s).
PROXY_HOST_ADAM_S = 0.1
# the probe's tensors: at most this many elements (the kernels are memory-bound: linear)
RATE_PROBE_ELEMS = 1 << 23


def measure_host_rates(params: int, precision: str, threads: int) -> dict:
    """Host AdamW parameters/s and host accumulation elements/s on `threads` threads, with
    the functions the engine calls (zfbench.real.rate_probe.RateProbe), over at most
    RATE_PROBE_ELEMS elements."""
    from zfbench.real.flat import device_dtype
    from zfbench.real.rate_probe import RateProbe

    probe = RateProbe(min(int(params), RATE_PROBE_ELEMS), device_dtype(precision), threads)
    try:
        rates = probe.measure(repeats=3)
    finally:
        probe.close()
    return {"host_adam_params_per_s": rates["host_adam_params_per_s"],
            "host_accum_elems_per_s": rates["host_accum_elems_per_s"],
            "threads": threads, "elements": probe.total}


def _widths(shape: ModelShape) -> list[float]:
    """1, 1/2, 1/4, ... of the base's heads, down to one head."""
    heads, out = shape.base.heads, [1.0]
    while heads > 1:
        heads //= 2
        out.append(heads / shape.base.heads)
    return out


def choose_proxy(shape: ModelShape, fits, budget_params: float) -> tuple[ModelShape, str]:
    """(the slice to measure, what bounded it: "memory" or "time"). The widest width at
    which some depth `fits` (memory, with room) within `budget_params`, at the greatest
    such depth; where no slice is within the budget, the smallest that fits (its run
    is then longer than the budget) and "memory"."""
    bound = "memory"
    smallest = None
    for fraction in _widths(shape):
        narrow = shape.base if fraction == 1.0 else shape.base.with_width(fraction)
        for depth in range(shape.base.layers, 0, -1):
            candidate = narrow.with_layers(depth)
            if not fits(candidate):
                continue
            smallest = candidate
            if candidate.total_params <= budget_params:
                return candidate, bound
            bound = "time"
    if smallest is None:
        raise ValueError(f"{shape.name}: not even one layer of one attention head fits "
                         f"this machine; use a smaller --batch/--seq or fewer --gpus")
    return smallest, "memory"


def proxy_record(named: ModelShape, proxy: ModelShape, bound: str, rates: dict,
                 budget_params: float, why: str, ranks: int, cores: int,
                 steps: int, batch: int = 1, seq: int = 1) -> dict:
    """What summary.json keeps under `proxy` (and the header prints)."""
    return {"model": named.name, "measured": proxy.name, "layers": proxy.layers,
            "micro_batch": batch, "seq": seq, "tokens_per_rank_step": batch * seq,
            "of_layers": named.base.layers, "width_fraction": float(proxy.width_ratio),
            "params": proxy.total_params, "of_params": named.base.total_params,
            "bound_by": bound, "why": why, "ranks": ranks, "cores": cores,
            "steps": steps, "budget_params": budget_params,
            "budget_host_adam_s": PROXY_HOST_ADAM_S, **rates}


def describe_proxy(r: dict, batch: int, seq: int) -> list[str]:
    """The header's lines on what is measured instead of the named model, and why."""
    width = r["width_fraction"]
    at = "full width" if width == 1 else (
        f"{width:g} of the width (every matrix, embedding and head included: about "
        f"{width * width:.3g} of its parameters)")
    return [
        f"{r['model']} cannot be measured whole here: {r['why']}",
        f"measuring the proxy {r['measured']}: {r['layers']} of {r['of_layers']} layers at "
        f"{at}"
        f", {r['params'] / 1e6:.1f}M of {r['of_params'] / 1e9:.2f}B parameters, batch "
        f"{batch} x seq {seq} tokens per rank, {r['ranks']} rank(s) sharing {r['cores']} "
        f"core(s), {r['steps']} steps per strategy",
        f"  chosen as the largest slice that fits memory with room to spare and needs at "
        f"most {r['budget_host_adam_s']:g} s of host AdamW per step at the "
        f"{r['host_adam_params_per_s'] / 1e6:.0f}M params/s measured here on "
        f"{r['threads']} thread(s) ({r['budget_params'] / 1e6:.0f}M parameters; bound by "
        f"{r['bound_by']})"]


def regime(row: dict, params: float) -> float:
    """Host AdamW over forward+backward in one step of a zero-offload row: each rank's
    shard at the row's host AdamW rate, over the row's compute seconds."""
    host_s = params / row["ranks"] / row["host_adam_params_per_s"]
    return host_s / row["compute_s"]


def node_regime(model: str = "llama2-7b", ranks: int = 4) -> float:
    """Host AdamW over forward+backward per ZeRO-Offload step of `model` whole on the
    default GPU node (`SimSettings`' defaults, `ranks` GPUs), simulated: the regime a
    measured run is compared with."""
    from zfbench.core.models import get_model
    from zfbench.sims.costs import SimSettings
    from zfbench.sims.simulator import simulate, steps_needed
    from zfbench.simulation import summary_row

    settings = SimSettings.from_knobs(model=model, gpus=ranks)
    settings = settings.with_(steps=max(steps_needed(settings), 8))
    row = summary_row(simulate(settings, "zero-offload"))
    return regime(row, get_model(model).total_params)


def project_to_node(record: dict, configs: dict, strategies: list[str],
                    ranks: int) -> tuple[list[dict], dict]:
    """Simulate the named model whole on the default GPU node with the run's ranks and
    ZenFlow knobs, host accumulation at the measured rate ratio: (one row per strategy,
    the settings and what carried over)."""
    from zfbench.report import add_speedups
    from zfbench.sims.costs import CostModel, SimSettings
    from zfbench.sims.settings import zenflow_knobs
    from zfbench.sims.simulator import simulate, steps_needed
    from zfbench.simulation import summary_row

    per_core = record["host_accum_elems_per_s"] / record["threads"]
    zf_cfg = windowed_of(configs)
    knobs = zenflow_knobs(zf_cfg.zenflow if zf_cfg is not None else None)
    settings = SimSettings.from_knobs(model=record["model"], gpus=ranks,
                                      host_accum_per_core=per_core, **knobs)
    settings = settings.with_(steps=max(settings.measurement.steps, steps_needed(settings)))
    rows = [{**summary_row(simulate(settings, s)), "model": record["model"],
             "projected": True} for s in strategies]
    add_speedups(rows)
    m = settings.machine
    node = {"gpu": m.gpu, "gpus": m.gpus, "pcie": m.pcie,
            "host": settings.machine.host, "micro_batch": settings.scenario.micro_batch,
            "seq": settings.scenario.seq, "precision": settings.scenario.precision,
            "select_interval": settings.zenflow.select_interval,
            "host_accum_per_core": per_core,
            "preset_host_accum_per_core": CostModel(settings.with_(
                host_accum_per_core=None)).accum_units_per_core_s}
    return rows, node


def what_bounds(here: dict, there: dict) -> str:
    """One sentence from two zero-offload rows (measured on the proxy, simulated on the
    node): which part of the stall each is made of, so the gain ZenFlow can show on
    each reads from the numbers (it hides the host's wait, not the exposed transfers and
    collectives)."""
    def parts(row: dict) -> str:
        return (f"{row['stall_fraction']:.0%} of its {row['step_time_s']:.3g} s step stalls: "
                f"{row['exposed_io_s']:.3g} s exposed transfers and collectives, "
                f"{row['host_wait_s']:.3g} s waiting for the host")
    side = ("the host's wait, which ZenFlow hides" if there["host_wait_s"] >
            there["exposed_io_s"] else "the exposed transfers, which ZenFlow shortens")
    lead = ("the host's wait, which ZenFlow hides" if here["host_wait_s"] >
            here["exposed_io_s"] else "transfers and collectives (gloo's, on ranks that "
            "share the CPU), which ZenFlow shortens but does not hide")
    return (f"  what bounds ZenFlow's gain: here ZeRO-Offload's {parts(here)}, so the "
            f"measured gain is bounded by {lead}; on the node its {parts(there)}, mostly "
            f"{side}")


def proxy_spec(spec, configs: dict, use_cuda: bool, err, steps_given: bool):
    """The named model does not fit (`err`, the refusal): (the RunSpec of the proxy that
    `choose_proxy` picks instead, checked with the run's engine `configs`, and its
    `proxy_record` without the host rates of the run's precision)."""
    from dataclasses import replace

    from zfbench.real.distributed import rank_threads
    from zfbench.real.engine import default_thread_split
    from zfbench.real.memory import MemoryCheck
    from zfbench.real.scenario_probe import host_adam_params_per_s

    from zfbench.run.report import measurement_window

    named, world = spec.shape(), spec.world
    threads = spec.host_threads or (rank_threads(world)[1] if world > 1
                                    else default_thread_split()[1])
    rate = host_adam_params_per_s(named.total_params, threads)
    budget = PROXY_HOST_ADAM_S * rate
    check = MemoryCheck.of_configs(configs, spec.seq, use_cuda)
    proxy, bound = choose_proxy(named, check.suggestable, budget)
    steps = spec.steps
    if not steps_given:
        windows = [measurement_window(c) for c in configs.values()]
        skip = max(w[0] for w in windows)
        steps = skip + 2 * max(w[1] - w[0] for w in windows)
    why = str(err).split(": ", 1)[1].split(". ")[0]  # needed vs available
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    record = proxy_record(named, proxy, bound, {"budget_adam_params_per_s": rate,
                          "threads": threads}, budget, why, world, cores, steps,
                          spec.micro_batch * spec.grad_accum, spec.seq)
    return replace(spec, model=proxy.name, layers=None, steps=steps), record


def print_projection(proxy: dict, configs: dict, strategies: list[str], ranks: int,
                     measured: list[dict]) -> list[dict]:
    """The named model whole on the default GPU node, simulated (zfbench.run.proxy), with
    what carried over from this run; its rows, for summary.csv."""
    from zfbench.report import format_table

    rows, node = project_to_node(proxy, configs, strategies, ranks)
    proxy["projection"] = node
    print(f"\nPROJECTED (simulated, not measured): {proxy['model']} whole "
          f"({proxy['of_params'] / 1e9:.2f}B parameters) on {node['gpus']} x {node['gpu']}, "
          f"PCIe {node['pcie']}, host {node['host']}, batch {node['micro_batch']} x seq "
          f"{node['seq']}, {node['precision']}; GPU, link and host rates from the presets "
          f"(zfbench/data/hardware.json, each with its source)")
    print(f"  from this run: host accumulation {node['host_accum_per_core'] / 1e9:.2f} G "
          f"elements/s per core, measured here with the engine's kernel on "
          f"{proxy['threads']} thread(s) (the preset would assume "
          f"{node['preset_host_accum_per_core'] / 1e9:.2f}); the node's DRAM still caps it")
    here = {r["strategy"]: r for r in measured}
    there = {r["strategy"]: r for r in rows}
    if BASELINE in here and BASELINE in there:
        proxy["regime_measured"] = regime(here[BASELINE], proxy["params"])
        proxy["regime_projected"] = regime(there[BASELINE], proxy["of_params"])
        print(f"  regime: host AdamW / forward+backward per ZeRO-Offload step "
              f"{proxy['regime_measured']:.2f}x measured on the proxy, "
              f"{proxy['regime_projected']:.2f}x simulated on the node")
        print(what_bounds(here[BASELINE], there[BASELINE]))
    print(format_table(rows))
    return rows
