"""The engine's baselines, loss, failure handling and non-finite gradients (on CPU)."""

import math
import time
import traceback

import pytest
import torch

from engine_helpers import BiasMLP, batches, config, make_engine, params_of, train_steps
from zfbench.real import NonFiniteGradientError
from zfbench.real.host_lane import HostWorkerError
from zfbench.real.model import build_model
from zfbench.core.config import ConfigError
from zfbench.core.models import get_model


def torch_adamw_run(steps: int, late: bool = False) -> dict:
    """Plain torch AdamW; with `late`, each update is applied one step after its gradient
    was computed (the gradient of step t is taken at the parameters after update t-2)."""
    model = BiasMLP()
    master = BiasMLP()
    opt = torch.optim.AdamW(master.parameters(), lr=1e-2, weight_decay=0.01)
    data = batches()
    for _ in range(steps):
        ids, labels = next(data)
        model(ids, labels).backward()
        if late:  # device params take the master of the previous update, then update it
            with torch.no_grad():
                snapshot = [p.clone() for p in master.parameters()]
        for mp, p in zip(master.parameters(), model.parameters()):
            mp.grad = p.grad.clone()
            p.grad = None
        opt.step()
        with torch.no_grad():
            source = snapshot if late else list(master.parameters())
            for p, s in zip(model.parameters(), source):
                p.copy_(s)
    return params_of(model)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["device", "zero-offload"])
def test_device_and_zero_offload_match_torch_adamw(strategy):
    model = BiasMLP()
    engine = make_engine(model, config(strategy))
    train_steps(engine, batches(), 12)
    engine.finish()
    engine.close()
    want = torch_adamw_run(12)
    for name, p in params_of(model).items():
        assert torch.allclose(p, want[name], rtol=1e-5, atol=1e-6), name


@pytest.mark.slow
def test_zero_offload_dpu_is_adamw_one_step_late():
    model = BiasMLP()
    engine = make_engine(model, config("zero-offload-dpu"))
    train_steps(engine, batches(), 12)
    got = params_of(model)  # before finish(): the last update is still pending
    engine.close()
    want = torch_adamw_run(12, late=True)
    for name, p in got.items():
        assert torch.allclose(p, want[name], rtol=1e-5, atol=1e-6), name
    assert not torch.allclose(got["up.weight"], torch_adamw_run(12)["up.weight"])


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["device", "zero-offload", "zero-offload-dpu", "zenflow"])
def test_loss_falls_on_tiny(strategy):
    shape = get_model("tiny")
    model = build_model(shape, seed=0)
    zf = dict(topk_ratio=0.1, update_interval=2, overlap_step=True) \
        if strategy == "zenflow" else {}
    engine = make_engine(model, config(strategy, lr=3e-3, **zf))
    from zfbench.real.data import synthetic_batches

    stream = synthetic_batches(shape.vocab, 8, 32, seed=0)

    def data():
        while True:
            b = next(stream)
            yield b["input_ids"], b["labels"]
    losses = train_steps(engine, data(), 40)
    engine.close()
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (strategy, first, last)


@pytest.mark.slow
def test_host_worker_error_surfaces_at_next_step_without_hanging():
    model = BiasMLP()
    engine = make_engine(model, config("zenflow", topk_ratio=0.25, update_interval=2,
                                       overlap_step=True), host_timeout_s=20)

    def broken(*args, **kwargs):
        raise ArithmeticError("injected host failure")
    engine.strategy.host.adam_chunk = broken
    data = batches()
    started = time.perf_counter()
    with pytest.raises(HostWorkerError) as info:
        train_steps(engine, data, 6)
    assert time.perf_counter() - started < 20
    assert isinstance(info.value.__cause__, ArithmeticError)
    assert "injected host failure" in str(info.value)
    text = "".join(traceback.format_exception(info.value.__cause__))
    assert "in broken" in text  # the worker's own traceback travels with the error
    engine.close()


@pytest.mark.slow
def test_zero_offload_host_error_raises_in_the_same_step():
    engine = make_engine(BiasMLP(), config("zero-offload"), host_timeout_s=20)
    engine.strategy.host.adam_chunk = lambda *a, **k: 1 / 0
    with pytest.raises(HostWorkerError, match="ZeroDivisionError"):
        train_steps(engine, batches(), 1)
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["device", "zero-offload", "zenflow"])
def test_nonfinite_gradient_is_skipped_not_written(strategy):
    zf = dict(topk_ratio=0.25, update_interval=2) if strategy == "zenflow" else {}
    model = BiasMLP()
    engine = make_engine(model, config(strategy, **zf))
    data = batches()
    train_steps(engine, data, 3)
    before = params_of(model)
    state_before = torch.cat([t.flatten() for t in _state_tensors(engine)])
    ids, labels = next(data)
    loss = engine(ids, labels)
    engine.backward(loss)
    model.up.weight.grad[0, 0] = float("nan")
    engine.step()
    assert engine.step_log[-1]["skipped"] and engine.t == 3
    for name, p in params_of(model).items():
        assert torch.equal(p, before[name]), name
    state_after = torch.cat([t.flatten() for t in _state_tensors(engine)])
    assert torch.equal(state_before, state_after)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    train_steps(engine, data, 2)  # training goes on
    engine.close()


def _state_tensors(engine):
    s = engine.strategy
    if hasattr(s, "host"):
        engine.host_lane.wait(getattr(s, "pending", None), 30)
        engine.host_lane.wait(getattr(s, "accum_job", None), 30)
        return [s.host.master, s.host.m, s.host.v]
    return s.m + s.v


@pytest.mark.slow
def test_nonfinite_gradient_raises_when_configured():
    cfg = config("zero-offload")
    cfg["zfbench"]["nonfinite"] = "raise"
    model = BiasMLP()
    engine = make_engine(model, cfg)
    ids, labels = next(batches())
    engine.backward(engine(ids, labels))
    model.down.bias.grad[0] = math.inf
    with pytest.raises(NonFiniteGradientError, match="down.bias"):
        engine.step()
    engine.close()


def test_config_errors_name_the_key():
    cfg = config("zenflow", topk_ration=0.1)
    with pytest.raises(ConfigError, match="did you mean 'topk_ratio'"):
        make_engine(BiasMLP(), cfg)


def test_a_collective_failed_on_the_host_worker_is_a_distributed_error():
    """A peer's death met first by the host worker's collective reaches the main thread as
    the DistributedError itself (rank and op named), not wrapped: the same error whichever
    thread met it (tests/test_distributed.py's dead-rank test depends on it)."""
    from zfbench.real.distributed import DistributedError
    from zfbench.real.host_lane import HostLane
    from zfbench.real.recorder import SpanRecorder

    lane = HostLane(SpanRecorder(), threads=1)
    dead = DistributedError("rank 0/2: collective allreduce failed: rank 1 died")

    def collective():
        raise dead
    future = lane.submit("host_optim", 0, [collective])
    with pytest.raises(DistributedError) as info:
        lane.wait(future, timeout_s=20)
    assert info.value is dead
    lane.close()


def test_a_span_the_recorder_refuses_fails_the_job_and_the_worker_goes_on():
    """The worker records each chunk's span inside its guard: an op the timeline does not
    know fails that job (the waiter gets the error instead of blocking for ever) and the
    next job still runs."""
    from zfbench.real.host_lane import HostLane, HostWorkerError
    from zfbench.real.recorder import SpanRecorder

    lane = HostLane(SpanRecorder(), threads=1)
    ran = []
    with pytest.raises(HostWorkerError, match="unknown op 'no-such-op'"):
        lane.wait(lane.submit("no-such-op", 0, [lambda: ran.append(1)]), timeout_s=20)
    with pytest.raises(HostWorkerError):  # also kept for the engine's next step
        lane.check()
    lane.check()  # and raised once
    lane.wait(lane.submit("host_optim", 1, [lambda: ran.append(2)]), timeout_s=20)
    assert ran == [1, 2]
    lane.close()
