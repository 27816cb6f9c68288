"""Calibration: measure, on this machine, the costs the simulator needs.

`measure_profile(spec)` builds the run's model in the run's precision on the run's device
(`spec.device`, as the engine resolves it), warms up, then measures with the engine's own
lanes, thread split, gradient path (`zfbench.real.inplace_grads`) and kernels
(`zfbench.real.kernels`; tests/test_kernel_identity.py checks they are the same):
- forward and backward seconds of each block kind (embedding, one decoder layer, head
  with the loss), from module hooks around a real training step, median of repeats, and
  what ZeRO-3's gathers and releases on one rank add to them (`zero3_hooks`);
- the device optimizer rate on the selected columns, the selection cost, ZenFlow's column
  gather/scatter, the non-finite check, the clipping norm, the gradients' zeroing (all of
  it, and the part the engine's step does where it defers the rest to backward) and the
  `device` strategy's own update over the whole buffer (its kernels, zeroing included);
- the link and host-lane rates (`zfbench.real.rate_probe.RateProbe`): d2h and h2d alone
  and together, host AdamW and accumulation, the fresh-page rate (`fresh_page_rates`);
- how much the device and host lanes slow each other when they run at once (cores over
  the same DRAM).
On CUDA every device time is the GPU's (synchronized clocks, CUDA events in the hooks:
`zfbench.real.rate_probe.Clock`), the links are the engine's copies to pinned host
buffers on their own streams, and the host lane stays on the CPU threads. The result is a
hardware profile in the layout of `zfbench/data/hardware.json` plus a `calibration`
section (`zfbench.real.profile_record`, which owns that record), which
`python -m zfbench.simulate --profile FILE` reads.
"""

from __future__ import annotations

import contextlib

import statistics
from types import SimpleNamespace

import torch

from zfbench.real import kernels
from zfbench.real.adamw import columns_in_place_ok
from zfbench.real.flat import FlatLayout, device_dtype, take_columns
from zfbench.real.inplace_grads import InplaceGrads, wanted
from zfbench.real.model import build_model
from zfbench.real.distributed import host_threads_by_strategy
from zfbench.real.profile_record import build_profile, describe_device
from zfbench.real.rate_probe import Clock, RateProbe, lane_contention, median_time
from zfbench.real.runner import RunSpec, batches
from zfbench.real.strategies import FlatAdamW
from zfbench.core.config_zenflow import DEFAULT_TOPK_RATIO
from zfbench.core.schedule import topk_count


def block_times(model, data, repeats: int, inplace: InplaceGrads,
                flat_grads: torch.Tensor, device=None,
                passes=lambda name: contextlib.nullcontext()) -> dict[str, dict[str, float]]:
    """Median forward/backward seconds per block kind, from hooks on a training step run
    as the engine runs it (gradients accumulated in place into `flat_grads`); the hooks
    mark `Clock(device)` time: perf_counter on the CPU, CUDA events on a GPU. `passes(name)`:
    the context each pass runs in ("forward", "backward"; ZeRO-3's gathers)."""
    clock = Clock(device)
    stamps: list[tuple[str, str, float]] = []
    blocks = [("embedding", model.embed), *[("decoder", m) for m in model.layers],
              ("head", model.head)]
    handles = []
    for kind, module in blocks:
        handles.append(module.register_forward_pre_hook(
            lambda *_, k=kind: stamps.append(("fwd", k, clock.mark()))))
        # a tensor hook on the block's output marks the start of the block's backward; a
        # module full-backward hook would wrap the block's inputs (the tied embedding
        # weight the head receives), which takes them off the in-place gradient path
        def mark_backward(_module, _inputs, out, k=kind) -> None:
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda grad: stamps.append(("bwd", k, clock.mark())))
        handles.append(module.register_forward_hook(mark_backward))
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(repeats):
            batch = next(data)
            stamps.clear()
            with inplace, passes("forward"):
                loss = model(batch["input_ids"], batch["labels"])
            mid = clock.mark()
            with passes("backward"):
                loss.backward()
            end = clock.mark()
            flat_grads.zero_()
            if isinstance(inplace, InplaceGrads):  # as the engine's zeroing tells it
                inplace.zeroed()
            *marks, mid, end = clock.seconds([s[2] for s in stamps] + [mid, end])
            stamps[:] = [(phase, k, t) for (phase, k, _), t in zip(stamps, marks)]
            fwd = [s for s in stamps if s[0] == "fwd"] + [("fwd", "end", mid)]
            # backward runs head -> layers -> embedding; the loss's own backward counts
            # as the head's, so the head's backward starts when loss.backward() is called
            bwd = [("bwd", "head", mid)] + [s for s in stamps if s[0] == "bwd"
                                            and s[1] != "head"] + [("bwd", "end", end)]
            for series, name in ((fwd, "forward_s"), (bwd, "backward_s")):
                per: dict[str, float] = {}
                for (_, kind, t0), (_, _, t1) in zip(series, series[1:]):
                    if kind != "end":
                        per[kind] = per.get(kind, 0.0) + (t1 - t0)
                for kind, seconds in per.items():
                    samples.setdefault((kind, name), []).append(seconds)
    finally:
        for h in handles:
            h.remove()
    layers = len(model.layers)
    out: dict[str, dict[str, float]] = {}
    for (kind, name), values in samples.items():
        value = statistics.median(values)
        out.setdefault(kind, {})[name] = value / (layers if kind == "decoder" else 1)
    return out


WIDE_TOPK_RATIO = 0.3  # the second ratio of the column gather/scatter measurement


def zero3_hooks(model, data, repeats: int, inplace, flat_params: torch.Tensor,
                flat_grads: torch.Tensor, named, layout, prefetch_elems: int, plain: dict,
                device=None) -> dict[str, dict[str, float]]:
    """What ZeRO-3's gathers and releases (real/zero3.py on one rank: each unit's hooks,
    its shard copied into a buffer of its own, released after) add to each block kind's
    forward and backward seconds: `block_times` under them minus `plain` (without), at
    least 0; seconds per block, not scaled by tokens (the copies and hooks do not
    depend on them). The parameters are views of the flat buffer again after."""
    import time

    from zfbench.real.zero3 import Zero3Params

    stand_in = SimpleNamespace(  # one rank of the engine, as Zero3Params reads it
        backend=SimpleNamespace(name=lambda tensor, _name: tensor,
                                access=lambda *_a, **_k: None),
        dist=SimpleNamespace(active=False), shard_lo=0, shard_hi=layout.total,
        flat_params=flat_params, config=SimpleNamespace(
            prefetch_elems=prefetch_elems), layout=layout, named_params=named, model=model,
        recorder=SimpleNamespace(now=time.perf_counter, add=lambda *_a: None), t=0)
    views = [p.data for _, p in named]
    zero3 = Zero3Params(stand_in)
    zero3.release_all()
    try:
        block_times(model, data, 2, inplace, flat_grads, device, zero3.pass_of)  # warm-up
        hooked = block_times(model, data, repeats, inplace, flat_grads, device, zero3.pass_of)
    finally:
        zero3.close()
        for (_, p), view in zip(named, views):
            p.data = view
    return {kind: {name: max(0.0, hooked[kind][name] - plain[kind][name])
                   for name in ("forward_s", "backward_s")} for kind in plain}


def _selected_columns(mats, dtype, ratio: float, importance: str = "l1"):
    """ZenFlow's device buffers for the top `ratio` columns of each weight ([k, rows]:
    fp32 values, gradient and scratch; a low-precision staging buffer when the weights are
    not fp32), and `column_io`: the gather/convert and the scatter that
    ZenFlowStrategy.device_update (real/zenflow_device.py) runs around its AdamW, with its
    kernels (`zfbench.real.kernels`) on the engine's column-major layout: neither for a weight
    whose AdamW runs on its own and its gradient's columns (real/adamw.py
    `columns_in_place_ok`; the engine keeps the moments on the device here); the division
    by U is in the AdamW pass. And `gather_scatter`: the same gather and scatter of every
    weight's selected columns, in place or not, as ZenFlow's ZeRO-3 device update
    (real/zenflow_zero3.py) gathers its selected gradients and writes its values back.
    The two come as {profile key prefix: pass}."""
    idx = [kernels.top_columns(kernels.column_scores(p.grad, importance),
                               topk_count(p.shape[1], ratio)) for p in mats]
    sel = [take_columns(p.detach(), i).float() for p, i in zip(mats, idx)]
    sel_g = [torch.empty_like(x) for x in sel]
    low = [None if dtype == torch.float32 else torch.empty_like(x, dtype=dtype) for x in sel]
    ms, vs, scratch = ([torch.zeros_like(x) for x in sel] for _ in range(3))

    every = list(zip(mats, idx, sel_g, low, sel))
    # not the weights whose AdamW runs on their own and their gradient's columns
    moved = [w for w in every if not (w[3] is None and columns_in_place_ok(w[0])
                                      and columns_in_place_ok(w[0].grad))]

    def column_io():
        for p, i, g, lo, x in moved:
            kernels.gather_grads_(p.grad, i, g, lo)
            kernels.scatter_(p.data, i, x, lo)

    def gather_scatter():
        for p, i, g, lo, x in every:
            kernels.gather_grads_(p.grad, i, g, lo)
            kernels.scatter_(p.data, i, x, lo)
    return sel, sel_g, ms, vs, scratch, {"column_io": column_io,
                                         "gather_scatter": gather_scatter}


def _per_matrix_and_selected(narrow_s: float, wide_s: float, narrow_sel: int,
                             wide_sel: int, mat_elems: int) -> tuple[float, float]:
    """A column gather/scatter's seconds split into a part per 2-D element (cache lines
    touched) and a part per selected element, by the line through its times at two top-k
    ratios."""
    per_selected = max(0.0, (wide_s - narrow_s) / max(wide_sel - narrow_sel, 1))
    return max(0.0, narrow_s - per_selected * narrow_sel) / mat_elems, per_selected


def _master_copy_s(flat_params, flat_grads, repeats: int, device=None) -> float:
    """The `device` strategy's extra work with low-precision weights: the flat gradients
    copied to fp32 and the fp32 master copied back into the weights, with its kernel
    (`kernels.copy_`; 0 with fp32 weights). The master is the weights' own values, so
    writing it back changes nothing."""
    if flat_params.dtype == torch.float32:
        return 0.0
    master = flat_params.detach().float()
    grads32 = torch.empty_like(master)

    def copies():
        kernels.copy_(grads32, flat_grads)
        kernels.copy_(flat_params, master)
    copies()
    return median_time(copies, repeats, device)


def _device_step_s(flat_params, flat_grads, config, repeats: int, device=None
                   ) -> float | None:
    """Seconds of the `device` strategy's optimizer update over the whole flat buffer: the
    engine's own (real/strategies.py `FlatAdamW.update_`, its buffers, kernels and
    zeroing), at the config's AdamW settings; None where its state does not fit the
    GPU's memory (the simulator then prices it from the selected columns' AdamW rate)."""
    try:
        adam = FlatAdamW(flat_params)
    except torch.OutOfMemoryError:
        return None
    step, opt = [0], config.optimizer

    def device_step():
        step[0] += 1
        adam.update_(flat_params, flat_grads, step[0], opt, adam.zeroes_grads)
    device_step()
    try:
        return median_time(device_step, repeats, device)
    finally:
        del adam


def measure_profile(spec: RunSpec, repeats: int = 5,
                    topk_ratio: float = DEFAULT_TOPK_RATIO,
                    strategy_threads: dict[str, int] | None = None) -> dict:
    """The profile of `spec`'s model on its device. On a GPU the host-lane rates are
    measured again on each strategy's own thread count (`strategy_threads`, default the
    engine's for one rank unless `spec.host_threads` fixes one count for all:
    real/distributed.py `host_threads_by_strategy`), as the calibration's `host_lanes`."""
    from zfbench.real.engine import default_thread_split, resolve_device

    shape = spec.shape()
    device = resolve_device(spec.device)
    cuda = device.type == "cuda"
    if cuda and device.index is None:  # this process's GPU, by index (as the engine)
        device = torch.device("cuda", torch.cuda.current_device())
    dev_threads, host_threads = default_thread_split()
    dev_threads = spec.device_threads or dev_threads
    host_threads = spec.host_threads or host_threads
    if not cuda:  # as the engine: the device lane's threads are the CPU lanes' own
        torch.set_num_threads(dev_threads)
    precision = spec.engine_config("device").precision
    dtype = device_dtype(precision)
    model = build_model(shape, dtype=dtype, device=device, seed=spec.seed)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    # as the engine: parameters and gradients are views of flat buffers, 2-D weights
    # stored column by column
    layout = FlatLayout(named, column_major=spec.engine_config("device").column_major)
    total = layout.total

    def new_flat() -> torch.Tensor:  # layout.new on the run's device
        return torch.zeros(total, dtype=dtype, device=device)
    flat_params = new_flat()
    flat_grads = new_flat()
    for name, p in named:
        view = layout.view(flat_params, name)
        view.copy_(p.detach())
        p.data = view
        p.grad = layout.view(flat_grads, name)
    # the weight gradients' path the engine takes on this device
    inplace = (InplaceGrads(params)
               if wanted(spec.engine_config("device").inplace_grads, cuda)
               else contextlib.nullcontext())
    data = batches(spec, shape.vocab)
    if cuda:
        data = ({k: v.to(device) for k, v in batch.items()} for batch in data)
    block_times(model, data, 2, inplace, flat_grads, device)  # warm-up
    blocks = block_times(model, data, repeats, inplace, flat_grads, device)
    # the slots the engine's step leaves for backward to write over (`defer_zero`): of the
    # parameters these forwards used only as routed linear weights (read before ZeRO-3's
    # hooks, whose copies the mode sees as other uses)
    skip = inplace.deferrable() if isinstance(inplace, InplaceGrads) else frozenset()
    kept = layout.ranges_except({name for name, p in named if id(p) in skip})
    hooks = zero3_hooks(model, data, repeats, inplace, flat_params, flat_grads, named, layout,
                        spec.engine_config("zenflow").prefetch_elems, blocks, device)
    tokens = spec.micro_batch * spec.seq
    for kind, block in zip(("embedding", "decoder", "head"),
                           (shape.blocks()[0], shape.blocks()[1], shape.blocks()[-1])):
        blocks[kind]["forward_flops"] = block.forward_flops(spec.seq, spec.micro_batch)
        blocks[kind]["tokens"] = tokens

    # device optimizer on the selected columns, selection cost (device thread)
    batch = next(data)
    with inplace:
        loss = model(batch["input_ids"], batch["labels"])
    loss.backward()
    mats = [p for p in params if p.dim() == 2]
    mat_elems = sum(p.numel() for p in mats)
    importance = spec.engine_config("zenflow").importance
    sel, sel_g, ms, vs, scratch, passes = _selected_columns(mats, dtype, topk_ratio,
                                                             importance)
    sel_elems = sum(s.numel() for s in sel)

    def device_adam():
        kernels.adamw_foreach_(sel, sel_g, ms, vs, [1] * len(sel), lr=1e-4, beta1=0.9,
                               beta2=0.999, eps=1e-8, weight_decay=0.01, scratch=scratch,
                               grad_divisor=4.0)
    passes["column_io"]()
    device_adam()
    optim_s = median_time(device_adam, repeats, device)
    # the column gather/scatter costs a part per 2-D element (cache lines touched) and a
    # part per selected element: measured at two ratios, split by a line through both
    wide = _selected_columns(mats, dtype, WIDE_TOPK_RATIO, importance)
    wide_sel = sum(s.numel() for s in wide[0])
    column_rates = {}
    for key, narrow in passes.items():
        wide[-1][key]()
        column_rates[f"{key}_s_per_elem"], column_rates[f"{key}_s_per_selected"] = \
            _per_matrix_and_selected(median_time(narrow, repeats, device),
                                     median_time(wide[-1][key], repeats, device),
                                     sel_elems, wide_sel, mat_elems)
    del wide
    master_s = _master_copy_s(flat_params, flat_grads, repeats, device)

    def select():
        for p in mats:
            kernels.top_columns(kernels.column_scores(p.grad, importance),
                                topk_count(p.shape[1], topk_ratio))
    select_s = median_time(select, repeats, device)

    # the engine's own per-step device work: the non-finite check and zeroing gradients
    def check():  # as Engine._nonfinite_params
        kernels.all_finite(flat_grads)

    def zero():  # as Engine._zero_grads
        kernels.zero_(flat_grads)

    def zero_deferred():  # as Engine._zero_grads(defer=True): the ranges `kept`
        for lo, hi in kept:
            kernels.zero_(flat_grads[lo:hi])
    # the `device` strategy's gradient clipping norm (16-bit: through its fp32 copy)
    norm_scratch = None if dtype == torch.float32 else torch.empty(total, device=device)

    def clip_norm():
        kernels.grad_norm(flat_grads, norm_scratch)
    check_s = median_time(check, repeats, device)
    norm_s = median_time(clip_norm, repeats, device)
    norm_scratch = None  # let the fp32 copy go (the closure is not called again)
    zero_s = median_time(zero, repeats, device)
    zero_deferred_s = median_time(zero_deferred, repeats, device) if skip else zero_s
    device_step_s = _device_step_s(flat_params, flat_grads, spec.engine_config("device"),
                                   repeats, device)
    # applying an uploaded update: one device buffer copied into another (as the engine's
    # `flat_params.copy_(upload)`); a same-dtype copy, not the d2h conversion
    apply_src = new_flat()

    def apply_copy():
        kernels.copy_(flat_grads, apply_src)
    apply_copy()
    apply_s = median_time(apply_copy, repeats, device)

    # links (d2h on the device thread, h2d on the host worker) and the host lane's rates,
    # on buffers in the engine's precisions (zfbench.real.rate_probe)
    # on a GPU the host step of every strategy but ZenFlow runs on all the cores (unless
    # --host-threads fixes one count for all): its host-lane rates measured there too
    if strategy_threads is None:
        strategy_threads = host_threads_by_strategy(0.5) if not spec.host_threads else {}
    lanes = strategy_threads if cuda else {}
    probe = RateProbe(total, dtype, host_threads, device, strategy_threads=lanes)
    try:
        rates = probe.measure(repeats)
        rates.update(probe.fresh_page_rates())  # 16-bit only: DeepSpeed's window-end temporary

        def train_step():  # the device lane's forward+backward (gradients pile up: harmless)
            batch = next(data)
            with inplace:
                step_loss = model(batch["input_ids"], batch["labels"])
            step_loss.backward()
        rates.update(lane_contention(probe, train_step, dev_threads, repeats))
    finally:
        probe.close()
    del probe
    return build_profile(spec, shape, blocks, dev_threads, host_threads, {
        "device_optim_elems_per_s": sel_elems / optim_s,
        **column_rates,
        "master_copy_s_per_elem": master_s / total, "precision": precision,
        "select_s_per_elem": select_s / mat_elems,
        "grad_check_s_per_elem": check_s / total, "grad_zero_s_per_elem": zero_s / total,
        "grad_zero_deferred_s_per_elem": zero_deferred_s / total,
        "grad_zero_deferred_share": sum(hi - lo for lo, hi in kept) / total,
        "grad_norm_s_per_elem": norm_s / total,
        **({} if device_step_s is None else {"device_step_s_per_elem": device_step_s / total}),
        "device_copy_s_per_elem": apply_s / total, "zero3_hooks": hooks,
        **rates}, describe_device(device))
