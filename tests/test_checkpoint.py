"""Save mid-window with an asynchronous update pending, resume in a new process: the
parameters after N more steps equal those of a run that never stopped."""

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # trains in subprocesses

WORKER = Path(__file__).parent / "checkpoint_worker.py"


def run_worker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WORKER), *args], capture_output=True,
                          text=True, timeout=300)


def run(*args: str) -> None:
    proc = run_worker(*args)
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
    proc = run_worker("--strategy", "zenflow", "--steps", "1", "--load", str(tmp_path / "c"),
                      "--out", str(tmp_path / "b.pt"))
    assert proc.returncode != 0
    assert "written by strategy 'zero-offload'" in proc.stderr


# Seen in 2 of 13 CI runs (2026-11, torch 2.13 CPU build, gloo, 2 cores) and outside
# pytest in 2 of about 190 launches of this worker (session 12: resumed zero-offload-dpu runs):
# both ranks print their done mark (all their Python, engine.close() included, has run),
# then one aborts in the interpreter's teardown, "terminate called without an active
# exception" (a C++ thread still joinable, although real/distributed.py destroys the
# process group at exit; it now also collects the garbage after, 0 of 120 launches
# aborted since), and torchrun stops the other. A launch whose ranks all printed
# their done mark before that abort is run once more, with a warning, so the comparison
# below still runs; any other failure fails the test. docs/design.md names the defect.
TEARDOWN_ABORT = "terminate called without an active exception"


def _aborted_in_teardown(done: subprocess.CompletedProcess) -> bool:
    from checkpoint_worker import DONE_MARK
    return (done.returncode != 0 and TEARDOWN_ABORT in done.stderr
            and all(f"{DONE_MARK} {rank}" in done.stderr for rank in (0, 1)))


def torchrun(*args: str) -> subprocess.CompletedProcess:
    from test_torchrun import free_port
    for attempt in (1, 2):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes",
                               "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                               "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(WORKER),
                               *args], capture_output=True, text=True, timeout=300)
        if attempt == 2 or not _aborted_in_teardown(done):
            return done
        warnings.warn(f"torchrun {' '.join(args)}: both ranks finished, then aborted in the "
                      f"interpreter's teardown ({TEARDOWN_ABORT}); running it once more")
    return done


@pytest.mark.parametrize("strategy", ["zenflow", "zero-offload-dpu"])
def test_two_ranks_resume_equal_to_uninterrupted(tmp_path, strategy):
    """Saved by 2 ranks mid-window (zenflow: after t=5, window 1's host update pending,
    columns selected at t=0; t=8 reselects after the resume), resumed by 2 new ranks:
    every rank's parameters and host shard equal the uninterrupted run's, bit for bit."""
    total, split = 14, 6
    for args in (("--steps", str(total), "--out", str(tmp_path / "full.pt")),
                 ("--steps", str(split), "--save", str(tmp_path / "ckpt"), "--out",
                  str(tmp_path / "first.pt")),
                 ("--skip", str(split), "--steps", str(total - split), "--load",
                  str(tmp_path / "ckpt"), "--out", str(tmp_path / "resumed.pt"))):
        done = torchrun("--strategy", strategy, *args)
        assert done.returncode == 0, done.stderr[-3000:]
    # DeepSpeed's layout: one folder per tag (global_step<N> by default), `latest` names it
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["global_step6", "latest"]
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step6"
    assert sorted(p.name for p in (tmp_path / "ckpt" / "global_step6").iterdir()) == [
        "zfbench_engine.complete", "zfbench_engine.rank0of2.pt", "zfbench_engine.rank1of2.pt"]
    for rank in (0, 1):
        full = torch.load(tmp_path / f"full.pt.rank{rank}")
        resumed = torch.load(tmp_path / f"resumed.pt.rank{rank}")
        first = torch.load(tmp_path / f"first.pt.rank{rank}")
        for name in full:
            assert torch.equal(full[name], resumed[name]), (rank, name)
        assert any(not torch.equal(full[n], first[n]) for n in full)


def test_resuming_on_another_number_of_ranks_is_refused_in_one_line(tmp_path):
    done = torchrun("--strategy", "zenflow", "--steps", "2", "--save", str(tmp_path / "c"),
                    "--out", str(tmp_path / "a.pt"))
    assert done.returncode == 0, done.stderr[-3000:]
    proc = run_worker("--strategy", "zenflow", "--steps", "1", "--load", str(tmp_path / "c"),
                      "--out", str(tmp_path / "b.pt"))
    assert proc.returncode != 0
    assert "was saved by 2 rank(s); this engine runs on 1" in proc.stderr
    # a set one rank never finished (its marker missing) is refused whole
    (tmp_path / "c" / "global_step2" / "zfbench_engine.complete").unlink()
    done = torchrun("--strategy", "zenflow", "--steps", "1", "--load", str(tmp_path / "c"),
                    "--out", str(tmp_path / "b.pt"))
    assert done.returncode != 0 and "is incomplete" in done.stderr


def test_only_a_teardown_abort_after_every_rank_finished_is_run_again():
    from checkpoint_worker import DONE_MARK

    def launch(rc: int, stderr: str) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess([], rc, "", stderr)
    both = f"{DONE_MARK} 0\n{DONE_MARK} 1\n{TEARDOWN_ABORT}\n"
    assert _aborted_in_teardown(launch(1, both))
    assert not _aborted_in_teardown(launch(0, both))  # it did not fail
    assert not _aborted_in_teardown(launch(1, f"{DONE_MARK} 0\n{TEARDOWN_ABORT}"))  # rank 1 not done
    assert not _aborted_in_teardown(launch(1, f"{DONE_MARK} 0\n{DONE_MARK} 1\nTraceback"))
