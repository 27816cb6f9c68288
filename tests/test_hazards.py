"""The engine's schedule, checked for cross-lane hazards (real/hazards.py, real/backend.py).

The checker itself is tested on hand-built schedules; then every strategy runs under it
(fp32 and bf16, overlap on and off, reselections, a checkpoint saved mid-window and
resumed, two ranks) with no hazard found; and every wait a strategy declares is shown to
be needed: leaving it out (a planted bug) makes the checker report a hazard.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_helpers import (BiasMLP, batches, config, make_engine, spawn_ranks,  # noqa: E402
                            train_steps)
from zfbench.real.backend import CpuLanes  # noqa: E402
from zfbench.real.hazards import HazardChecker  # noqa: E402
from zfbench.real.recorder import SpanRecorder  # noqa: E402

ZF = dict(topk_ratio=0.25, update_interval=2, select_strategy="step", select_interval=4)


def scenario(name: str) -> dict:
    strategy, _, variant = name.partition(":")
    zf = {}
    if strategy == "zenflow":
        zf = dict(ZF, overlap_step="sync" not in variant,
                  full_warm_up_rounds=1 if "warm" in variant else 0,
                  offload="offload" in variant)
    cfg = config(strategy, clip=0.5 if strategy != "device" else 0.0, **zf)
    if "bf16" in variant:
        cfg["bf16"] = {"enabled": True}
    if "buckets" in variant or "offload" in variant:  # overlap_comm: bucket by bucket
        cfg["zero_optimization"].update(overlap_comm=True, reduce_bucket_size=150)
    if "zero3" in variant:  # ZeRO-3: modules gather and release the parameters
        cfg["zero_optimization"]["stage"] = 3
    return cfg


SCENARIOS = ["device", "zero-offload", "zero-offload-dpu", "zero-offload-dpu:bf16",
             "zenflow", "zenflow:sync", "zenflow:bf16", "zenflow:sync-bf16-warm",
             "zenflow:offload-bf16",  # zenflow.offload: moments up and back in buckets
             "zenflow:zero3", "zenflow:sync-bf16-warm-zero3",  # ZeRO-3 (real/zero3.py)
             "zenflow:offload-bf16-zero3"]
# two ranks with overlap_comm (one rank: tests/test_grad_buckets.py)
BUCKETED = ["zero-offload:buckets", "zero-offload-dpu:buckets-bf16", "zenflow:buckets-bf16"]
STEPS = 9  # selections at 0, 4, 8; boundaries every 2 steps


def checked_run(name: str, dropped=frozenset(), steps: int = STEPS):
    engine = make_engine(BiasMLP(), scenario(name), hazard_check=True,
                         waits_dropped=frozenset(dropped), host_chunk_elems=97)
    train_steps(engine, batches(), steps)
    engine.finish()
    engine.close()
    return engine.backend


# -- the checker on hand-built schedules ---------------------------------------------------
def lanes():
    return CpuLanes(SpanRecorder(), HazardChecker())


def test_a_read_on_another_lane_needs_a_wait_for_the_write():
    b = lanes()
    buf = torch.zeros(8)
    b.access("compute", "write", writes=(buf,))
    b.access("d2h", "read", reads=(buf,))
    assert [h.kind for h in b.hazards.hazards] == ["read-after-write"]
    b = lanes()
    b.access("compute", "write", writes=(buf,))
    b.wait("d2h", b.record("compute"), "ordered")
    b.access("d2h", "read", reads=(buf,))
    assert b.hazards.hazards == [] and b.hazards.checked == 1


def test_a_write_after_another_lanes_read_is_a_hazard_and_disjoint_bytes_are_not():
    b = lanes()
    buf = torch.zeros(8)
    b.access("h2d", "read", reads=(buf[:4],))
    b.access("main", "other half", writes=(buf[4:],))
    assert b.hazards.hazards == []
    b.access("main", "overwrite", writes=(buf[2:6],))
    assert [h.kind for h in b.hazards.hazards] == ["write-after-read"]


def test_order_is_transitive_through_a_chain_of_waits():
    """compute writes; d2h waits for compute; the host waits for d2h: the host may read
    what compute wrote. A stream's work is ordered after what its issuer did before."""
    b = lanes()
    buf = torch.zeros(4)
    b.access("compute", "write", writes=(buf,))
    b.wait("d2h", b.record("compute"), "a")
    b.access("d2h", "copy")
    b.hazards.join("host", b.record("d2h").clock)
    b.hazards.access("host", "read", reads=(buf,))
    assert b.hazards.hazards == []
    host_write = torch.zeros(4)
    b.hazards.access("main", "fill", writes=(host_write,))
    b.access("h2d", "up", reads=(host_write,))  # enqueued by main after its write
    assert b.hazards.hazards == []


def test_a_dropped_wait_is_named_and_skipped():
    b = CpuLanes(SpanRecorder(), HazardChecker(), waits_dropped={"planted"})
    buf = torch.zeros(4)
    b.access("compute", "write", writes=(buf,))
    b.wait("d2h", b.record("compute"), "planted")
    b.access("d2h", "read", reads=(buf,))
    assert "planted" in b.waits_used and len(b.hazards.hazards) == 1
    assert "read-after-write on buffer@" in str(b.hazards.hazards[0])


# -- the engine's schedules --------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
def test_every_strategy_runs_without_hazards(name):
    backend = checked_run(name)
    report = backend.hazards.report()
    assert report["hazards"] == 0, report["distinct"]
    if name != "device":  # the offloading schedules cross lanes all the time
        assert report["cross_lane_checked"] > 10 * STEPS
        assert "host waits for the d2h of the gradients" in backend.waits_used


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "device"])
def test_every_wait_is_needed(name):
    """Plant a missing wait: each wait the schedule declares, left out alone, makes the
    checker report a hazard (so none is decoration, and the checker sees each one)."""
    # two joins model a thread handing work over (a queue, a future): leaving out the
    # join alone does not remove the synchronization, so they are not planted
    threads = {"host job after its submission", "main waits for a host job"}
    waits = sorted(checked_run(name).waits_used - threads)
    if "offload" in name.partition(":")[2]:
        # zenflow.offload's own waits; the extra order its copies put on the link lanes
        # makes some of the others redundant in this run (they are needed in the rest)
        waits = [why for why in waits if "moments" in why]
    assert waits
    missed = []
    for why in waits:
        if checked_run(name, dropped={why}).hazards.report()["hazards"] == 0:
            missed.append(why)
    assert not missed, f"{name}: leaving out {missed} went unnoticed"


@pytest.mark.slow
def test_the_zenflow_overlap_race_is_caught_without_its_wait():
    """The race a code read found: with overlap_step, the next window's uploads write
    `upload` right after the compute lane applied it."""
    report = checked_run("zenflow", dropped={"uploads wait for the apply"}).hazards.report()
    assert report["hazards"] > 0
    assert any("on upload" in h and "h2d/h2d_param" in h for h in report["distinct"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zero-offload-dpu", "zenflow", "zenflow:bf16",
                                  "zenflow:offload-bf16", "zenflow:zero3",
                                  "zenflow:offload-bf16-zero3"])
def test_a_checkpoint_mid_window_and_its_resume_run_without_hazards(name, tmp_path):
    data = list(itertools.islice(batches(), 10))
    engine = make_engine(BiasMLP(), scenario(name), hazard_check=True)
    train_steps(engine, iter(data[:7]), 7)  # mid-window (boundary at 5), update pending
    engine.save_checkpoint(tmp_path)
    train_steps(engine, iter(data[7:]), 3)
    engine.finish()
    engine.close()
    assert engine.backend.hazards.report()["hazards"] == 0
    resumed = make_engine(BiasMLP(), scenario(name), hazard_check=True)
    resumed.load_checkpoint(tmp_path)
    train_steps(resumed, iter(data[7:]), 3)
    resumed.finish()
    resumed.close()
    assert resumed.backend.hazards.report()["hazards"] == 0
    planted = ("checkpoint reads the offloaded moments after their last d2h"
               if name.startswith("zenflow:offload") else "checkpoint waits for the uploads")
    dropped = make_engine(BiasMLP(), scenario(name), hazard_check=True,
                          waits_dropped={planted})
    train_steps(dropped, iter(data[:7]), 7)
    dropped.save_checkpoint(tmp_path / "planted")
    dropped.close()
    assert dropped.backend.hazards.report()["hazards"] > 0


# -- two ranks -------------------------------------------------------------------------
def _rank(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from zfbench.real.distributed import from_process_group
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    reports = {}
    try:
        for name in SCENARIOS + BUCKETED:
            engine = make_engine(BiasMLP(), scenario(name), dist=from_process_group(),
                                 hazard_check=True, host_chunk_elems=50, host_timeout_s=60)
            data = batches(batch=4)
            for _ in range(STEPS):
                ids, labels = next(data)
                sl = slice(rank * 2, rank * 2 + 2)
                engine.backward(engine(ids[sl], labels[sl]))
                engine.step()
            engine.finish()
            engine.close()
            # overlap_comm (buckets) is on for "buckets" and "offload" (scenario()); ZeRO-3
            # reduce-scatters once after backward, without buckets
            variant = name.partition(":")[2]
            assert (("buckets" in variant or "offload" in variant)
                    and "zero3" not in variant) == (engine.buckets is not None), name
            reports[name] = engine.backend.hazards.report()
        torch.save(reports, Path(out, f"hazards{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_run_every_strategy_without_hazards(tmp_path):
    assert spawn_ranks(_rank, 2, tmp_path) == [0, 0]
    for rank in range(2):
        reports = torch.load(tmp_path / f"hazards{rank}.pt", weights_only=False)
        for name, report in reports.items():
            assert report["hazards"] == 0, (rank, name, report["distinct"])
            if name != "device":
                assert report["cross_lane_checked"] > 0
