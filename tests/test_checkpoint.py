"""Save mid-window with an asynchronous update pending, resume in a new process: the
parameters after N more steps equal those of a run that never stopped."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # trains in subprocesses

WORKER = Path(__file__).parent / "checkpoint_worker.py"


def run(*args: str) -> None:
    proc = subprocess.run([sys.executable, str(WORKER), *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("strategy,split,bf16", [("zenflow", 6, False), ("zenflow", 9, False),
                                                 ("zero-offload-dpu", 5, False),
                                                 ("zenflow", 6, True), ("zenflow", 9, True)])
def test_resume_equals_uninterrupted(tmp_path, strategy, split, bf16):
    """Parameters, host master and (zenflow in bf16) the device's fp32 values."""
    total = 14
    extra = ("--bf16",) if bf16 else ()
    run("--strategy", strategy, "--steps", str(total), "--out", str(tmp_path / "full.pt"),
        *extra)
    # zenflow, U=4: boundaries at t=3, 7; saving after t=5 or t=8 leaves window 1 or 2's
    # host update pending (not yet applied to the device); t=8 is also a reselection step
    run("--strategy", strategy, "--steps", str(split), "--save", str(tmp_path / "ckpt"),
        "--out", str(tmp_path / "first.pt"), *extra)
    run("--strategy", strategy, "--skip", str(split), "--steps", str(total - split),
        "--load", str(tmp_path / "ckpt"), "--out", str(tmp_path / "resumed.pt"), *extra)
    full = torch.load(tmp_path / "full.pt")
    resumed = torch.load(tmp_path / "resumed.pt")
    first = torch.load(tmp_path / "first.pt")
    for name in full:
        assert torch.equal(full[name], resumed[name]), name
    assert any(not torch.equal(full[n], first[n]) for n in full)
    assert not list((tmp_path / "ckpt").glob("*.tmp"))


def test_load_refuses_a_checkpoint_of_another_strategy(tmp_path):
    run("--strategy", "zero-offload", "--steps", "2", "--save", str(tmp_path / "c"),
        "--out", str(tmp_path / "a.pt"))
    proc = subprocess.run([sys.executable, str(WORKER), "--strategy", "zenflow", "--steps",
                           "1", "--load", str(tmp_path / "c"), "--out",
                           str(tmp_path / "b.pt")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert "written by strategy 'zero-offload'" in proc.stderr
