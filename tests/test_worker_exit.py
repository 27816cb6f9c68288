"""A process that ends while a worker thread is inside a torch kernel exits cleanly.

DeepSpeed scripts never call close(): with ZenFlow's overlap_step the last host update is
still running when the script returns. The host lane's worker and the emulated link's
worker are daemon threads; before the at-exit close (real/host_lane.py, real/cpu_link.py)
such a process aborted with "terminate called without an active exception" (exit code
134, every time for the scripts below; on CI 1 run in 6 of a two-rank checkpoint script).
"""

import subprocess
import sys

import pytest

BUSY_CHUNK = """
import torch
a = torch.randn(2_000_000)
done = []
def chunk():
    for _ in range(100):
        a.mul_(1.0000001).add_(1e-9)
    done.append(1)
    print("chunks done:", len(done), flush=True)
    return a.numel() * 4
"""

HOST_LANE = BUSY_CHUNK + """
from zfbench.real.host_lane import HostLane
from zfbench.real.recorder import SpanRecorder
lane = HostLane(SpanRecorder(), threads=1)
lane.submit("host_optim", 0, [chunk] * 3)
"""

LINK = BUSY_CHUNK + """
from zfbench.real.cpu_link import LinkWorker
link = LinkWorker("h2d")
for _ in range(3):
    link.submit(chunk)
"""


@pytest.mark.parametrize("script", [HOST_LANE, LINK], ids=["host_lane", "cpu_link"])
def test_exiting_with_work_in_flight_finishes_the_work_and_exits_zero(script):
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr
    assert proc.stdout.split("\n")[-2] == "chunks done: 3"  # the queued work ran to its end
