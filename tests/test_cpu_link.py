"""The CPU lanes' emulated link (real/cpu_link.py): copies run on their own thread, in
issue order, and an h2d event waited on blocks until its copies are done."""

import threading

import pytest
import torch

from zfbench.real.backend import CpuLanes
from zfbench.real.cpu_link import LinkError, LinkWorker
from zfbench.real.hazards import HazardChecker
from zfbench.real.recorder import SpanRecorder


def test_a_ticket_is_done_only_after_the_copies_before_it():
    link = LinkWorker("h2d")
    gate = threading.Event()
    order = []
    link.submit(lambda: (gate.wait(), order.append(1)))
    link.submit(lambda: order.append(2))
    first, both = 1, link.ticket()
    assert both == 2 and not link.done(first) and not link.done(both)
    gate.set()
    link.wait(both)
    assert link.done(both) and order == [1, 2]
    link.close()


def test_a_failed_copy_is_raised_by_the_next_wait_and_later_copies_still_run():
    link = LinkWorker("h2d")
    ran = []

    def boom():
        raise ValueError("planted")
    link.submit(boom)
    link.submit(lambda: ran.append(True))
    with pytest.raises(LinkError) as info:
        link.wait(link.ticket())
    assert isinstance(info.value.__cause__, ValueError)
    link.drain()  # the error was reported once
    assert ran == [True]
    link.close()
    with pytest.raises(LinkError):
        link.submit(lambda: None)


def test_cpu_lanes_run_h2d_copies_off_the_issuing_thread_and_waits_order_them():
    recorder = SpanRecorder()
    lanes = CpuLanes(recorder, HazardChecker(), async_lanes=("h2d",))
    link = lanes.links["h2d"]
    gate = threading.Event()
    link.submit(gate.wait)  # holds the link: the copy below queues behind it
    src = torch.arange(1 << 16, dtype=torch.float32)
    dst = torch.zeros_like(src)
    lanes.copy("h2d", "h2d_param", 0, dst, src)
    event = lanes.record("h2d")
    assert not link.done(event.cuda[1]) and float(dst.sum()) == 0.0  # not run yet
    gate.set()
    lanes.wait("compute", event, "compute waits for the uploads")
    assert torch.equal(dst, src)
    spans = [s for s in recorder.timeline.spans if s.lane == "h2d"]
    assert [(s.op, s.bytes) for s in spans] == [("h2d_param", src.numel() * 4)]
    lanes.close()


def test_the_link_thread_runs_only_where_enabled_and_a_core_is_free():
    from zfbench.real.backend import cpu_link_lanes
    assert cpu_link_lanes(1, cores=2, enabled=True) == ("h2d",)
    assert cpu_link_lanes(2, cores=2, enabled=True) == ()
    assert cpu_link_lanes(1, cores=2, enabled=False) == ()
    lanes = CpuLanes(SpanRecorder(), async_lanes=cpu_link_lanes(2, cores=2, enabled=True))
    src = torch.arange(8, dtype=torch.float32)
    dst = torch.zeros_like(src)
    lanes.copy("h2d", "h2d_param", 0, dst, src)  # on the issuing thread, at once
    assert torch.equal(dst, src) and lanes.record("h2d").cuda is None
    lanes.close()
