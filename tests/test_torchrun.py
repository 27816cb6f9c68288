"""torchrun as a launcher (issue 24): a user's script (tests/torchrun_script.py) that calls
`zfbench.real.initialize(model, ds_config)` under torchrun trains one model on all ranks.

At 3071cfc such a script trained each rank alone (the engine ignored the process group:
replicas drifted apart), on replicas that started from their own weights, with the
micro-batch resolved for one rank (train_batch_size 4 on 2 ranks ran 4 rows per rank).
Here every rank ends with the same weights as the one-rank run on the whole global batch.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "torchrun_script.py"
STRATEGIES = ("device", "zero-offload", "zero-offload-dpu", "zenflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nnodes: int, nproc: int, port: int, out: Path, *extra: str) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", str(SCRIPT), str(out), *extra]


def finished(procs: list[subprocess.Popen], timeout_s: float = 400) -> None:
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("torchrun did not finish (a hang)") from None
        assert p.returncode == 0, out[-3000:]


def one_rank(tmp_path: Path) -> dict:
    ref = tmp_path / "ref"
    ref.mkdir()
    done = subprocess.run([sys.executable, str(SCRIPT), str(ref)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(ref / "rank0.pt", weights_only=False)


def check_ranks(out: Path, world: int, reference: dict) -> None:
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
    for strategy in STRATEGIES:
        assert reference[strategy]["batch"] == (4, 4, 1) and reference[strategy]["world"] == 1
        want = reference[strategy]["params"]
        for r, got in enumerate(ranks):
            assert got[strategy]["world"] == world
            # train_batch_size 4 = micro x accumulation x ranks
            assert got[strategy]["batch"] == (4, 4 // world, 1), got[strategy]["batch"]
            for name, p in got[strategy]["params"].items():
                assert torch.equal(p, ranks[0][strategy]["params"][name]), (strategy, r, name)
                assert torch.allclose(p, want[name], rtol=0, atol=1e-6), \
                    (strategy, r, name, (p - want[name]).abs().max())


def test_a_torchrun_script_that_creates_its_group_trains_one_model(tmp_path):
    """2 ranks on one node; the script calls init_process_group itself, as most do."""
    out = tmp_path / "run"
    out.mkdir()
    finished([subprocess.Popen(torchrun(1, 2, free_port(), out, "--init-group"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)])
    check_ranks(out, 2, one_rank(tmp_path))


@pytest.mark.slow
def test_two_torchrun_nodes_of_two_ranks_train_one_model(tmp_path):
    """Two "nodes" on this machine (two torchrun launchers meeting at one rendezvous), two
    ranks each; the script leaves the group to `initialize`, which creates it from
    torchrun's variables."""
    out = tmp_path / "run"
    out.mkdir()
    port = free_port()
    finished([subprocess.Popen(torchrun(2, 2, port, out), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for _ in range(2)])
    check_ranks(out, 4, one_rank(tmp_path))
