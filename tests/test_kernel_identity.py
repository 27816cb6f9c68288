"""The calibration times the kernels the engine runs (zfbench.real.kernels).

Every attribute of `zfbench.real.kernels` is replaced with a wrapper that records which
path called it (the engine's training steps, or the calibration: `measure_profile`, which
runs the rate probe too), with which dtypes, and from which function. For each precision
the engine runs every strategy for a few steps (clipping on, so the norms run too); every
(kernel, dtypes) the engine reaches must be reached by the calibration as well, and each
function the calibration times (`TIMED`: the closures handed to `median_time`) must call
its kernels itself. Negative controls show the check fails when the probe times
something else.
"""

from __future__ import annotations

import sys

import pytest
import torch

from engine_helpers import BiasMLP, batches, config, make_engine, train_steps
from zfbench.real import kernels
from zfbench.real.profile import measure_profile
from zfbench.real.runner import RunSpec

STRATEGIES = ("device", "zero-offload", "zero-offload-dpu", "zenflow")
KERNELS = tuple(kernels.__all__)
# each timed function of the calibration -> the engine kernels it must call
TIMED = {
    "host_adam": {"host_adamw_"},  # RateProbe: host AdamW
    "accum": {"accumulate_"},  # RateProbe: host accumulation
    "norm": {"sum_of_squares"},  # RateProbe: the host clipping norm (squared)
    "convert": {"copy_"},  # RateProbe: the wires' conversions (16-bit weights)
    "device_adam": {"adamw_foreach_"},  # profile: device AdamW on the selected columns
    "column_io": {"gather_grads_", "scatter_"},  # profile: ZenFlow's column gather/scatter
    "gather_scatter": {"gather_grads_", "scatter_"},  # profile: ZeRO-3's, every column
    "select": {"column_scores", "top_columns"},  # profile: ZenFlow's selection
    "check": {"all_finite"},  # profile: the non-finite check
    "clip_norm": {"grad_norm"},  # profile: the device strategy's clipping norm
    "copies": {"copy_"},  # profile: the device strategy's master copies (16-bit)
    "apply_copy": {"copy_"},  # profile: an upload applied
    "zero": {"zero_"},  # profile: the gradients zeroed
    "d2h": {"copy_checked_"},  # RateProbe: the CPU lanes' d2h, checked (fp32)
    "h2d": {"copy_"},  # RateProbe: the CPU lanes' h2d
}


def dtypes(value):
    """A call argument's dtype signature: a tensor's dtype, a list's first tensor's."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype).removeprefix("torch.")
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return "list:" + dtypes(value[0])
    return None if value is None else "-"


@pytest.fixture
def recorded(monkeypatch):
    """{path: {(kernel, dtypes of its positional arguments)}}, and under "callers"
    {(calling function, kernel)} of the calibration; `who[0]` names the path."""
    calls: dict[str, set] = {"engine": set(), "probe": set(), "callers": set()}
    who = ["engine"]
    for name in KERNELS:
        real_fn = getattr(kernels, name)

        def wrapper(*args, _name=name, _fn=real_fn, **kw):
            calls[who[0]].add((_name, tuple(dtypes(a) for a in args)))
            if who[0] == "probe":  # the engine has functions of the same names
                calls["callers"].add((sys._getframe(1).f_code.co_name, _name))
            return _fn(*args, **kw)
        monkeypatch.setattr(kernels, name, wrapper)
    return calls, who


def engine_calls(precision: str) -> None:
    for strategy in STRATEGIES:
        cfg = config(strategy, clip=1e-3, topk_ratio=0.25, update_interval=2,
                     full_warm_up_rounds=1)
        if precision != "fp32":
            cfg[precision] = {"enabled": True}
        # fp32: every 2-D weight's rows a multiple of the vector width, as in the
        # calibration's model, so both run ZenFlow's device AdamW on the weights' and
        # the gradients' own columns (real/adamw.py `columns_in_place_ok`): no gather
        # (`gather_grads_`) and no fp32 write-back (`scatter_`)
        model = BiasMLP(hidden=16, inner=48) if precision == "fp32" else BiasMLP()
        engine = make_engine(model, cfg)
        train_steps(engine, batches(), 5)
        engine.finish()
        engine.close()


def probe_calls(precision: str) -> None:
    spec = RunSpec(model="tiny", layers=None, micro_batch=2, seq=8, device_threads=1,
                   host_threads=1, precision=precision, device="cpu")
    measure_profile(spec, repeats=1)


def missing(calls) -> set:
    return calls["engine"] - calls["probe"]


def untimed(calls, precision: str) -> set:
    """(timed function, kernel) pairs of `TIMED` the calibration did not run."""
    # fp32: nothing to convert; 16-bit: the d2h is a plain copy, the check a device op
    skip = {"convert", "copies"} if precision == "fp32" else {"d2h"}
    want = {(fn, k) for fn, ks in TIMED.items() if fn not in skip for k in ks}
    if precision == "fp32":  # the weights' own columns: no gather, no write-back
        want.discard(("column_io", "scatter_"))  # (`engine_calls`)
        want.discard(("column_io", "gather_grads_"))
    return want - calls["callers"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_calibration_times_every_kernel_the_engine_runs(recorded, precision):
    calls, who = recorded
    engine_calls(precision)
    who[0] = "probe"
    probe_calls(precision)
    # the engine reaches every kernel of the module, so the check covers all of them
    # (but for the checked d2h, which the CPU lanes run with fp32 gradients only)
    # and for the gather and the write-back of the selected columns, which fp32 weights
    # of whole vector rows do not need: `engine_calls`)
    not_run = {"scatter_", "gather_grads_"} if precision == "fp32" else {"copy_checked_"}
    assert {name for name, _ in calls["engine"]} == set(KERNELS) - not_run
    assert missing(calls) == set()
    assert untimed(calls, precision) == set()
    low = "bfloat16" if precision == "bf16" else "float32"
    # with the dtypes the engine uses: e.g. 16-bit gradients into the fp32 window
    assert ("accumulate_", ("float32", low, "-")) in calls["probe"]
    if precision == "bf16":  # both conversions of the wires
        assert ("copy_", ("float32", "bfloat16")) in calls["probe"]
        assert ("copy_", ("bfloat16", "float32")) in calls["probe"]


def test_the_check_fails_when_the_probe_times_another_function(recorded, monkeypatch):
    """Negative control: a probe whose accumulation is torch's own mixed-dtype add_ (what
    it timed before issue 25) leaves the engine's accumulation unmatched."""
    from zfbench.real import rate_probe

    calls, who = recorded
    engine_calls("bf16")
    who[0] = "probe"

    class OtherKernels:  # the probe's view of the module, with one kernel swapped
        def __getattr__(self, name):
            if name == "accumulate_":
                return lambda window, grads, alpha=1.0, fresh=False: window.add_(
                    grads, alpha=alpha)
            return getattr(kernels, name)
    monkeypatch.setattr(rate_probe, "kernels", OtherKernels())
    probe_calls("bf16")
    assert {name for name, _ in missing(calls)} == {"accumulate_"}


def test_the_check_fails_when_a_timed_function_calls_its_own_copy(recorded, monkeypatch):
    """Negative control: the selection timed with torch's ops written out (as the profile
    did before) still reaches the selection kernels elsewhere (the column buffers), but
    not from the function that is timed."""
    from zfbench.real import profile

    calls, who = recorded
    who[0] = "probe"
    real_median = profile.median_time

    def median_time(fn, *args, **kw):
        if fn.__name__ == "select":
            def select():  # a re-implementation, not the engine's kernels
                torch.topk(torch.ones(8), 2)
            fn = select
        return real_median(fn, *args, **kw)
    monkeypatch.setattr(profile, "median_time", median_time)
    probe_calls("fp32")
    assert untimed(calls, "fp32") == {("select", "column_scores"), ("select", "top_columns")}
