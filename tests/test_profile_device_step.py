"""The profile prices the `device` strategy's update with the work the engine runs for it.

Every kernel of `zfbench.real.kernels` is wrapped to record its calls: the kernel, each
tensor argument's dtype, shape and contiguity (so its bytes), and the arguments that pick
a kernel's path (`zero_grads`, `grad_divisor`, `fused`). The engine's calls are those
inside `DeviceStrategy.step` (one optimizer step); the profile's are those of the timed
function whose seconds become the calibration value the simulator prices that step with
(`CostModel.device_step_s` reads `device_step_s_per_elem`): `median_time` is replaced by
one that runs the function once and returns a number naming it. The two lists must be
equal. Before, the step was priced from ZenFlow's AdamW on the selected columns
(`device_optim_elems_per_s`: 2-D tensors, the division by U inside, torch's fused kernel)
while the engine ran one flat buffer through the C++ pass that zeroes the gradients too
(tests below: that probe's list differs, so this check would have caught it).
"""

from __future__ import annotations

import pytest
import torch

from zfbench.real import kernels
from zfbench.real import profile as profile_mod
from zfbench.real.runner import RunSpec, train
from zfbench.real.strategies import DeviceStrategy
from zfbench.sims.costs import CostModel

PATH_ARGS = ("zero_grads", "grad_divisor", "fused")


def signature(value):
    """A call argument as the work it names: a tensor's dtype, shape and contiguity; a
    list's, element by element; other values as they are."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), value.is_contiguous())
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return tuple(signature(v) for v in value)
    return None


@pytest.fixture
def recorder(monkeypatch):
    """`calls[who[0]]`: the kernel calls made while `who[0]` names a recording (None:
    nothing records)."""
    calls: dict = {}
    who = [None]
    for name in kernels.__all__:
        real_fn = getattr(kernels, name)

        def wrapper(*args, _name=name, _fn=real_fn, **kw):
            if who[0] is not None:
                calls.setdefault(who[0], []).append(
                    (_name, tuple(signature(a) for a in args),
                     signature(kw.get("scratch")),
                     tuple((k, kw[k]) for k in PATH_ARGS if k in kw)))
            return _fn(*args, **kw)
        monkeypatch.setattr(kernels, name, wrapper)
    return calls, who


def spec(precision: str) -> RunSpec:
    return RunSpec(model="tiny", layers=None, micro_batch=2, seq=8, steps=3,
                   device_threads=1, host_threads=1, precision=precision, device="cpu")


def engine_step_calls(calls, who, monkeypatch, precision: str) -> list:
    """The kernel calls of the engine's device strategy in its last optimizer step."""
    real_step = DeviceStrategy.step

    def step(self, t):
        who[0] = ("engine", t)
        try:
            return real_step(self, t)
        finally:
            who[0] = None
    monkeypatch.setattr(DeviceStrategy, "step", step)
    train(spec(precision), "device", progress=False)
    monkeypatch.setattr(DeviceStrategy, "step", real_step)
    return calls[("engine", spec(precision).steps - 1)]


def profiled(calls, who, monkeypatch, precision: str) -> tuple[dict, dict]:
    """The calibration, with every `median_time` of real/profile.py answering k (its k-th
    call: 1, 2, ...) after running the function once under the recording ("profile", k);
    and {k: the function's name}."""
    names: dict[int, str] = {}

    def median_time(fn, repeats, device=None, sync=None):
        k = len(names) + 1
        names[k] = fn.__name__
        who[0] = ("profile", k)
        try:
            fn()
        finally:
            who[0] = None
        return float(k)
    monkeypatch.setattr(profile_mod, "median_time", median_time)
    cal = profile_mod.measure_profile(spec(precision), repeats=1)["calibration"]
    return cal, names


def timed_by(value_s: float, names: dict) -> int:
    """The k of the timed function whose seconds (k) gave `value_s`."""
    k = round(value_s)
    assert k in names and value_s == pytest.approx(k), value_s
    return k


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_profile_times_the_device_strategys_own_update(recorder, monkeypatch,
                                                           precision):
    calls, who = recorder
    engine = engine_step_calls(calls, who, monkeypatch, precision)
    cal, names = profiled(calls, who, monkeypatch, precision)
    total = spec(precision).shape().total_params
    # what the simulator prices the device strategy's update with, over the whole model
    priced = CostModel.device_step_s(type("C", (), {"calibration": cal})(), total)
    k = timed_by(priced, names)
    assert calls[("profile", k)] == engine
    kernels_run = [c[0] for c in engine]
    if precision == "fp32":  # zeroed in the AdamW pass on the CPU lanes
        assert kernels_run == ["adamw_foreach_"]
        assert engine[0][3] == (("zero_grads", True),)
    else:  # through the fp32 copy of the gradients and back into the 16-bit weights
        assert kernels_run == ["copy_", "adamw_foreach_", "copy_"]
        assert engine[1][3] == (("zero_grads", False),)
    # the whole flat buffer, one tensor: the bytes the engine's step moves
    assert engine[kernels_run.index("adamw_foreach_")][1][0] == (
        ("torch.float32", (total,), True),)


def test_the_selected_columns_probe_is_not_the_device_strategys_update(recorder,
                                                                       monkeypatch):
    """Negative control: the rate the step was priced with before this check
    (`device_optim_elems_per_s`, ZenFlow's AdamW on the selected columns, what
    `device_step_s` still reads for a profile without `device_step_s_per_elem`) comes
    from a timed function whose calls differ from the engine's device step."""
    calls, who = recorder
    engine = engine_step_calls(calls, who, monkeypatch, "fp32")
    cal, names = profiled(calls, who, monkeypatch, "fp32")
    older = {k: v for k, v in cal.items() if k != "device_step_s_per_elem"}
    fake = type("C", (), {"calibration": older, "device_optim_s": CostModel.device_optim_s,
                          "master_copy_s": CostModel.master_copy_s})()
    (k,) = [k for k, name in names.items() if name == "device_adam"]
    (name, args, _, path), = calls[("profile", k)]
    selected = sum(shape[0] * shape[1] for _, shape, _ in args[0])
    total = spec("fp32").shape().total_params
    # that probe's seconds (k) priced the step: k x total / selected elements
    assert CostModel.device_step_s(fake, total) == pytest.approx(k * total / selected)
    assert calls[("profile", k)] != engine
    assert name == "adamw_foreach_" and len(args[0]) > 1  # one 2-D tensor per weight
    assert dict(path).get("grad_divisor", 1.0) != 1.0  # ZenFlow's division by U inside


def test_older_profiles_keep_the_selected_columns_rate():
    """A profile without `device_step_s_per_elem` prices the step as before: the selected
    columns' AdamW rate and the master copies."""
    cal = {"device_optim_elems_per_s": 1e9, "master_copy_s_per_elem": 2e-9}
    fake = type("C", (), {"calibration": cal, "device_optim_s": CostModel.device_optim_s,
                          "master_copy_s": CostModel.master_copy_s})()
    assert CostModel.device_step_s(fake, 1e9) == pytest.approx(3.0)
    cal["device_step_s_per_elem"] = 5e-10
    assert CostModel.device_step_s(fake, 1e9) == pytest.approx(0.5)
