"""Port of the ZenFlow case of DeepSpeed's tests/unit/ops/adam/test_cpu_adam.py (0.19.5).

DeepSpeed runs ZenFlow's overlapped host Adam in a separate optimizer process driven
through a shared-memory control block; zfbench runs it on the host lane, one worker
thread (real/host_lane.py) running zfbench.real.host_adam's AdamW. The port checks the
same two things on that lane.
"""
import threading
import time

import pytest
import torch

from zfbench.real.host_adam import host_adamw_
from zfbench.real.host_lane import HostLane, HostWorkerError
from zfbench.real.recorder import SpanRecorder

HP = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)


def test_zenflow_adam_cross_process():
    """Ports tests/unit/ops/adam/test_cpu_adam.py::test_zenflow_adam_cross_process:
    - a bounded wait with nothing that can finish returns (an error after the timeout)
      instead of blocking, so a dead host worker is noticed;
    - five AdamW steps on 100003 elements (not a multiple of any SIMD width) submitted to
      the host worker give bit for bit what the same update gives called directly, and
      the parameters sent up after each step (DeepSpeed's `stale` snapshot) are the
      updated ones.
    DeepSpeed alternates two moment buffers by step parity; zfbench keeps one set, so one
    set is checked here (docs/zenflow.md: "One set of host moments and a one-window
    lag")."""
    lane = HostLane(SpanRecorder(), threads=1)
    try:
        started = time.perf_counter()
        lane.wait(None, 0.05)  # nothing submitted: returns at once
        gate = threading.Event()
        blocked = lane.submit("host_optim", 0, [gate.wait])
        with pytest.raises(HostWorkerError, match="did not finish"):
            lane.wait(blocked, 0.05)
        assert time.perf_counter() - started < 10
        gate.set()
        lane.wait(blocked, 60)

        n = 100003
        gen = torch.Generator().manual_seed(0)
        param = torch.randn(n, generator=gen)
        exp_avg, exp_avg_sq, sent_up = torch.zeros(n), torch.zeros(n), torch.zeros(n)
        mirror = [param.clone(), exp_avg.clone(), exp_avg_sq.clone()]
        for step in range(1, 6):
            grad = torch.randn(n, generator=gen)

            def adam(grad=grad, step=step):
                host_adamw_(param, grad, exp_avg, exp_avg_sq, step=step, **HP)

            def upload():
                sent_up.copy_(param)
            lane.wait(lane.submit("host_optim", step, [adam, upload]), 60)
            host_adamw_(mirror[0], grad.clone(), mirror[1], mirror[2], step=step, **HP)
            assert torch.equal(param, mirror[0]), f"param, step {step}"
            assert torch.equal(exp_avg, mirror[1]), f"exp_avg, step {step}"
            assert torch.equal(exp_avg_sq, mirror[2]), f"exp_avg_sq, step {step}"
            assert torch.equal(sent_up, mirror[0]), f"sent up, step {step}"
        lane.check()
    finally:
        lane.close()
