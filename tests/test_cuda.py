"""CUDA paths of the engine; these run only where torch sees a GPU (skipped elsewhere)."""

import itertools

import pytest
import torch

from engine_helpers import BiasMLP, batches, make_engine, params_of, train_steps
from engine_helpers import config as base_config
from zfbench.real.backend import is_page_locked

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.slow]  # trains the engine for real

ZF = dict(topk_ratio=0.25, update_interval=3, overlap_step=True, select_strategy="step",
          select_interval=6)


def config(strategy: str, **zenflow) -> dict:
    """The tests' config with pinned host buffers, as zfbench.run uses on a GPU (DeepSpeed's
    pin_memory default is false: pageable buffers make every copy synchronous)."""
    cfg = base_config(strategy, **zenflow)
    zero = cfg.setdefault("zero_optimization", {})
    zero.setdefault("offload_optimizer", {})["pin_memory"] = True
    return cfg


@pytest.mark.parametrize("strategy", ["device", "zero-offload", "zero-offload-dpu", "zenflow"])
def test_cuda_engine_matches_cpu_engine(strategy):
    zf = ZF if strategy == "zenflow" else {}
    results = {}
    for device in ("cpu", "cuda"):
        model = BiasMLP()
        engine = make_engine(model, config(strategy, **zf), device=device)
        train_steps(engine, ((i.to(device), l.to(device)) for i, l in batches()), 10)
        engine.finish()
        engine.close()
        results[device] = {n: p.cpu() for n, p in params_of(model).items()}
        if device == "cuda":
            spans = engine.timeline.spans_frame()
            assert {"forward", "backward"} <= set(spans["op"])
            assert (spans["t_end_s"] >= spans["t_start_s"]).all()
    for name, p in results["cpu"].items():
        assert torch.allclose(p, results["cuda"][name], rtol=1e-4, atol=1e-5), name


@pytest.mark.parametrize("strategy", ["zero-offload-dpu", "zenflow"])
def test_bf16_cuda_engine_matches_bf16_cpu_engine(strategy):
    """bf16 weights (the GPU default), with gradient buckets: ZenFlow's selections fill
    the selected columns' fp32 values from the host master on the h2d lane (after the
    compute lane chose them), dpu alternates two landing buffers. CPU and CUDA round
    differently in bf16 kernels: equal within bf16 tolerance."""
    zf = ZF if strategy == "zenflow" else {}
    results = {}
    for device in ("cpu", "cuda"):
        model = BiasMLP()
        cfg = config(strategy, **zf)
        cfg["bf16"] = {"enabled": True}
        cfg["zero_optimization"].update(overlap_comm=True, reduce_bucket_size=150)
        engine = make_engine(model, cfg, device=device)
        assert engine.buckets is not None
        train_steps(engine, ((i.to(device), l.to(device)) for i, l in batches()), 13)
        engine.finish()
        engine.close()
        results[device] = {n: p.float().cpu() for n, p in params_of(model).items()}
    for name, p in results["cpu"].items():
        assert torch.allclose(p, results["cuda"][name], rtol=2 ** -6, atol=2 ** -8), name


def test_the_page_lock_check_tells_locked_from_pageable_memory():
    from zfbench.real.backend import register_pinned, unregister_pinned
    assert not is_page_locked(torch.zeros(1 << 16))
    assert is_page_locked(torch.zeros(1 << 16, pin_memory=True))
    registered = register_pinned(1 << 16, torch.bfloat16)
    assert is_page_locked(registered) and is_page_locked(registered[100:])
    unregister_pinned(registered)
    assert not is_page_locked(registered)


def test_host_buffers_are_pinned_on_cuda():
    engine = make_engine(BiasMLP(), config("zenflow", **ZF), device="cuda")
    assert is_page_locked(engine.strategy.host.master)
    assert engine.flat_params.is_cuda and engine.strategy.upload.is_cuda
    engine.close()


def test_zenflow_resumes_on_cuda(tmp_path):
    """A mid-window checkpoint (saved with map_location cpu) resumes on the GPU and
    continues as the uninterrupted run does."""
    data = [(i.cuda(), l.cuda()) for i, l in itertools.islice(batches(), 10)]
    whole = BiasMLP()
    engine = make_engine(whole, config("zenflow", **ZF), device="cuda")
    train_steps(engine, iter(data), 10)
    engine.finish()
    engine.close()
    first = BiasMLP()
    engine = make_engine(first, config("zenflow", **ZF), device="cuda")
    train_steps(engine, iter(data[:7]), 7)
    engine.save_checkpoint(tmp_path)
    engine.close()
    resumed = BiasMLP()
    engine = make_engine(resumed, config("zenflow", **ZF), device="cuda")
    engine.load_checkpoint(tmp_path)
    assert all(idx.is_cuda for idx in engine.strategy.selected.values())
    train_steps(engine, iter(data[7:10]), 3)
    engine.finish()
    engine.close()
    for name, p in params_of(whole).items():
        assert torch.allclose(p, params_of(resumed)[name], rtol=1e-5, atol=1e-6), name


def test_step_time_contains_the_device_work():
    """The step's end is read after its device work finished: every compute span of a
    step lies inside the step's interval."""
    engine = make_engine(BiasMLP(), config("device"), device="cuda")
    train_steps(engine, ((i.cuda(), l.cuda()) for i, l in batches()), 6)
    spans, steps = engine.timeline.spans_frame(), engine.timeline.steps_frame()
    engine.close()
    # GPU times come onto the CPU clock through one anchor event, read after a
    # synchronize: uncertain by that wake-up (microseconds), far below a step's work
    for _, s in steps.iterrows():
        mine = spans[(spans["step"] == s["step"]) & (spans["lane"] == "compute")]
        assert (mine["t_end_s"] <= s["t_end_s"] + 50e-6).all(), s["step"]


def test_bf16_crosses_the_link_as_bf16():
    """Gradients go down and parameters up in the device's dtype (pinned bf16 staging,
    converted on the host), and the run still matches the CPU engine."""
    cfg = config("zero-offload")
    cfg["bf16"] = {"enabled": True}
    engine = make_engine(BiasMLP(), cfg, device="cuda")
    train_steps(engine, ((i.cuda(), l.cuda()) for i, l in batches()), 4)
    wires = engine.strategy._wires  # pinned while the engine is open (close unpins)
    assert wires["d2h"].dtype == torch.bfloat16 and is_page_locked(wires["d2h"])
    assert wires["h2d"].dtype == torch.bfloat16 and is_page_locked(wires["h2d"])
    # registered exactly: no caching-allocator rounding up to a power of two
    n = engine.shard_hi - engine.shard_lo
    assert wires["d2h"].numel() == n
    engine.close()


def test_gradient_buckets_go_down_while_backward_runs():
    """overlap_comm on a GPU: the buckets' d2h copies run on the d2h stream while the
    compute stream is still in backward (span intervals intersect), and the run matches
    the one with a single d2h after backward."""
    from test_grad_buckets import TiedMLP, bucketed
    results = {}
    for on in (True, False):
        model = TiedMLP(vocab=4096, hidden=256, inner=1024)
        cfg = bucketed(config("zenflow", **ZF), on, elems=1 << 16)
        engine = make_engine(model, cfg, device="cuda")
        data = ((i.cuda(), l.cuda()) for i, l in batches(vocab=4096, batch=8, seq=128))
        train_steps(engine, data, 6)
        engine.finish()
        engine.close()
        results[on] = {n: p.cpu() for n, p in params_of(model).items()}
        if on:
            spans = engine.timeline.spans_frame()
            overlapped = 0
            for step in range(1, 6):
                mine = spans[spans["step"] == step]
                back = mine[mine["op"] == "backward"].iloc[0]
                d2h = mine[mine["op"] == "d2h_grad"]
                assert len(d2h) == len(engine.buckets.buckets)
                overlapped += int(((d2h["t_start_s"] < back["t_end_s"]) &
                                   (d2h["t_end_s"] > back["t_start_s"])).any())
            assert overlapped >= 3, "no bucket's d2h ran during backward"
    for name, p in results[True].items():
        assert torch.equal(p, results[False][name]), name


def test_gpu_sized_default_run_is_not_the_cpu_lane_shape():
    """On CUDA, `zfbench.run` with no flags trains a full-depth model at a real batch and
    sequence (zfbench/run/defaults.py), not the one-layer CPU-lane slice."""
    from zfbench.run.command import build_parser, spec_from_args
    from zfbench.run.defaults import gpu_sized
    args = build_parser().parse_args(["--device", "cuda", "--quiet"])
    spec = gpu_sized(spec_from_args(args, 1, ["zenflow"]), ["zenflow"], 1, quiet=True)
    assert spec.layers is None and spec.seq >= 512 and spec.precision == "bf16"


def test_profile_measures_the_gpu_it_runs_on():
    """`zfbench.run --device cuda --profile`: the model, buffers and timings are the GPU's
    (zfbench.real.profile), and the profile says so."""
    from zfbench.real.profile import measure_profile
    from zfbench.real.runner import RunSpec
    spec = RunSpec(model="tiny", layers=None, micro_batch=2, seq=16, device="cuda",
                   device_threads=1, host_threads=1, precision="bf16")
    profile = measure_profile(spec, repeats=2)
    cal = profile["calibration"]
    index = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    assert cal["transfers"] == "cuda"
    assert cal["device"] == torch.cuda.get_device_name(index)
    assert cal["device_memory_bytes"] == total
    gpu = profile["gpus"]["measured-device"]
    assert gpu["memory_bytes"]["value"] == total
    assert gpu["hbm_bytes_per_s"]["value"] > 0
    for kind in ("embedding", "decoder", "head"):
        assert cal["blocks"][kind]["forward_s"] > 0, kind
        assert cal["blocks"][kind]["backward_s"] > 0, kind
    for key in ("d2h_bytes_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s_both",
                "h2d_bytes_per_s_both", "host_adam_params_per_s", "device_optim_elems_per_s",
                "device_copy_s_per_elem"):
        assert cal[key] > 0, key
    for key in ("compute_factor_when_host_busy", "host_factor_when_compute_busy",
                "h2d_factor_when_host_busy", "host_factor_when_h2d_busy"):
        assert 0 < cal[key] <= 1, key  # the last two: the upload link beside host AdamW
    # every host-lane rate the probe measures (since session 25 a window's first
    # accumulation, `host_accum_first_elems_per_s`, in place of the zeroing it replaced)
    for key in ("host_accum_elems_per_s", "host_norm_elems_per_s",
                "host_accum_first_elems_per_s"):
        assert cal[key] > 0, key
    assert "host_zero_elems_per_s" not in cal


def test_rate_probe_copies_between_the_gpu_and_pinned_wires_of_its_dtype():
    """As the engine's CUDA link: bf16 on the GPU to and from pinned bf16 host buffers
    (registered exactly), on streams of their own; close() unpins them."""
    from zfbench.real.rate_probe import RateProbe
    n = 1 << 16
    probe = RateProbe(n, torch.bfloat16, 1, torch.device("cuda"))
    assert probe.dev.is_cuda and probe.up.is_cuda and probe.dev.dtype == torch.bfloat16
    for wire in (probe.down_wire, probe.up_wire):
        assert wire.dtype == torch.bfloat16 and is_page_locked(wire) and wire.numel() == n
    assert set(probe.streams) == {"d2h", "h2d"}
    rates = probe.measure(2)
    assert all(v > 0 for v in rates.values()), rates
    probe.close()
    assert probe._pinned == []


def test_on_a_gpu_zero_offload_runs_its_host_step_on_every_core():
    """As DeepSpeed: ZeRO-Offload's CPU-Adam (and its delayed update's) on all the cores,
    ZenFlow's optimizer on what pt_reserved_cores_perc leaves (real/distributed.py
    `lane_threads`); a GPU profile measures the host lane on both counts (`host_lanes`)."""
    import os

    from zfbench.real.distributed import default_thread_split
    from zfbench.real.profile import measure_profile
    from zfbench.real.runner import RunSpec
    cores = os.cpu_count()
    for strategy in ("zero-offload", "zero-offload-dpu", "zenflow"):
        engine = make_engine(BiasMLP(), config(strategy, **(ZF if strategy == "zenflow"
                                                             else {})), device="cuda",
                             device_threads=None, host_threads=None)
        want = default_thread_split(cores)[1] if strategy == "zenflow" else cores
        assert engine.host_threads == want, strategy
        engine.close()
    spec = RunSpec(model="tiny", layers=None, micro_batch=2, seq=16, device="cuda",
                   precision="bf16")
    cal = measure_profile(spec, repeats=2)["calibration"]
    if cal["host_threads"] != cores:  # more than one core: the counts differ
        lanes = cal["host_lanes"]
        assert set(lanes) == {"zero-offload", "zero-offload-dpu"}
        for lane in lanes.values():
            assert lane["host_threads"] == cores and lane["host_adam_params_per_s"] > 0


def test_device_adamw_runs_torchs_fused_kernel_on_cuda():
    """On CUDA the device optimizer is torch's fused AdamW (one kernel, as plain PyTorch's
    fused AdamW; the foreach ops took 29 ms where it took 12.4 on one H200, bench/results/
    gpu/NVIDIA-H200/2026-11-28): the same values as torch.optim.AdamW over steps with
    their own numbers, ZenFlow's grad / U divided into the gradients as on the CPU."""
    from zfbench.real.adamw import adamw_foreach_
    gen = torch.Generator().manual_seed(1)
    shapes = [(64, 33), (257,)]
    ref = [torch.randn(s, generator=gen).cuda() for s in shapes]
    params = [torch.nn.Parameter(r.clone()) for r in ref]
    opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1,
                            foreach=False, fused=False)
    ours = [r.clone() for r in ref]
    m = [torch.zeros_like(p) for p in ours]
    v = [torch.zeros_like(p) for p in ours]
    for step in range(1, 5):
        grads = [torch.randn(s, generator=gen).cuda() for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g / 2
        opt.step()
        mine = [g.clone() for g in grads]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            adamw_foreach_(ours, mine, m, v, [step] * 2, lr=1e-2, beta1=0.9, beta2=0.99,
                           eps=1e-8, weight_decay=0.1, grad_divisor=2.0)
        names = {e.name for e in prof.key_averages()}
        assert "aten::_fused_adamw_" in names and "aten::_foreach_addcdiv_" not in names
        for g, q in zip(grads, mine):  # the quotient stays in the gradients
            torch.testing.assert_close(q, g / 2)
    for p, o in zip(params, ours):
        torch.testing.assert_close(o, p.detach(), rtol=1e-5, atol=1e-6)
