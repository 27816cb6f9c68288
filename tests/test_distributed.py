"""Multi-rank (ZeRO-2 data parallel) engine on CPU gloo: N ranks on slices of one global
batch end where one rank on the whole batch ends, for every strategy; every rank picks the
same columns; a dead rank makes the others fail fast; `--gpus 2` runs through torch's
launcher. Ranks are real processes (torch.multiprocessing spawn, or the elastic launcher).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_helpers import BiasMLP, batches, config, make_engine, params_of  # noqa: E402
from zfbench.real.distributed import selection_bytes  # noqa: E402
from zfbench.real.zenflow_shard import shard_column_scores  # noqa: E402
from zfbench.core.models import get_model  # noqa: E402

STRATEGIES = ("device", "zero-offload", "zero-offload-dpu", "zenflow")
ZF = dict(topk_ratio=0.25, update_interval=2, overlap_step=True, select_strategy="step",
          select_interval=4)
STEPS = 7
CHUNK = 50  # small host chunks: shards and chunks cut through rows
ROOT = Path(__file__).resolve().parents[1]


def run_config(strategy: str, select_comm: str = "scores") -> dict:
    cfg = config(strategy, clip=0.5, **(ZF if strategy == "zenflow" else {}))
    if select_comm == "bf16wire":  # communication_data_type: the all-reduce in bf16
        cfg["communication_data_type"] = "bf16"
    elif select_comm == "buckets":  # overlap_comm: all-reduced and sent bucket by bucket
        cfg["zero_optimization"].update(overlap_comm=True, reduce_bucket_size=150)
    else:
        cfg["zfbench"]["select_comm"] = select_comm
    return cfg


def train(engine, rank: int, world: int, steps: int = STEPS, die_at: int | None = None):
    data = batches(batch=4)
    per = 4 // world
    for step in range(steps):
        ids, labels = next(data)
        if die_at is not None and step == die_at:
            os._exit(3)
        sl = slice(rank * per, (rank + 1) * per)
        engine.backward(engine(ids[sl], labels[sl]))
        engine.step()
    engine.finish()
    engine.close()


def _worker(rank: int, world: int, store: str, out: str, mode: str) -> None:
    import torch.distributed as dist

    from zfbench.real.distributed import DistributedError, from_process_group

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=__import__("datetime").timedelta(
                                # a dead rank is found fast; 4 ranks on 2 busy cores may
                                # take long to meet
                                seconds=30 if mode == "die" else 120))
    ctx = from_process_group()
    results = {}
    try:
        runs = [(s, "scores") for s in STRATEGIES] + [("zenflow", "allgather"),
                                                      ("device", "bf16wire"),
                                                      ("zero-offload", "buckets"),
                                                      ("zero-offload-dpu", "buckets"),
                                                      ("zenflow", "buckets")]
        if mode == "die":
            runs = [("zenflow", "scores")]
        for strategy, comm in runs:
            model = BiasMLP()
            engine = make_engine(model, run_config(strategy, comm), dist=ctx,
                                 host_chunk_elems=CHUNK, host_timeout_s=60)
            started = time.perf_counter()
            try:
                train(engine, rank, world, die_at=2 if mode == "die" and rank == 1 else None)
            except DistributedError as err:
                Path(out, f"error{rank}.txt").write_text(
                    f"{time.perf_counter() - started:.1f} {err}")
                os._exit(1)
            s = engine.strategy
            spans = [(sp.op, sp.bytes) for sp in engine.timeline.spans if sp.lane == "net"]
            d2h = [(sp.step, sp.bytes) for sp in engine.timeline.spans
                   if sp.op == "d2h_grad"]
            host = getattr(s, "host", None)
            results[f"{strategy}/{comm}"] = {
                "params": params_of(model),
                "selected": dict(getattr(s, "selected", {})),
                "net": spans, "d2h": d2h, "shard_grad_bytes": engine.shard_grad_bytes,
                "buckets": 0 if engine.buckets is None else len(engine.buckets.buckets),
                "host_numel": None if host is None else host.numel}
        torch.save(results, Path(out, f"rank{rank}.pt"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(world: int, tmp_path: Path, mode: str = "train", join_timeout_s: float = 240):
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(world):
        p = ctx.Process(target=_worker, args=(rank, world, str(tmp_path / "store"),
                                              str(tmp_path), mode))
        p.start()
        procs.append(p)
    deadline = time.monotonic() + join_timeout_s
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"ranks still running after {join_timeout_s} s (a hang)"
    return [p.exitcode for p in procs]


def single_rank(strategy: str):
    model = BiasMLP()
    engine = make_engine(model, run_config(strategy), host_chunk_elems=CHUNK)
    train(engine, 0, 1)
    return params_of(model), dict(getattr(engine.strategy, "selected", {}))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_match_one_rank_on_the_whole_batch(world, tmp_path):
    codes = spawn(world, tmp_path)
    assert codes == [0] * world, codes
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]
    for strategy in STRATEGIES:
        want, want_sel = single_rank(strategy)
        for r, res in enumerate(ranks):
            got = res[f"{strategy}/scores"]
            for name, p in got["params"].items():
                assert torch.allclose(p, want[name], rtol=1e-4, atol=1e-5), \
                    (strategy, world, r, name, (p - want[name]).abs().max())
            for name, idx in want_sel.items():  # the same columns as one rank picks
                assert torch.equal(got["selected"][name], idx), (strategy, r, name)
            if got["host_numel"] is not None:  # host state holds ~1/N of the model
                total = sum(p.numel() for p in want.values())
                assert got["host_numel"] <= -(-total // world)
    # every rank's parameters are identical (same gather), and so is the selection
    for key in ranks[0]:
        for res in ranks[1:]:
            for name in res[key]["params"]:
                assert torch.equal(res[key]["params"][name], ranks[0][key]["params"][name])
    # communication_data_type bf16: the all-reduce moves half the bytes, same training
    wire, plain = ranks[0]["device/bf16wire"], ranks[0]["device/scores"]
    wire_bytes = [b for op, b in wire["net"] if op == "allreduce"]
    plain_bytes = [b for op, b in plain["net"] if op == "allreduce"]
    assert len(wire_bytes) == len(plain_bytes) == STEPS
    assert all(2 * w == p for w, p in zip(wire_bytes, plain_bytes))
    for name, p in wire["params"].items():
        assert torch.allclose(p, plain["params"][name], rtol=0.05, atol=0.02), name
    # scores vs all-gather selection: same columns, and the net spans carry their bytes
    scores, gather = ranks[0]["zenflow/scores"], ranks[0]["zenflow/allgather"]
    for name, idx in scores["selected"].items():
        assert torch.equal(gather["selected"][name], idx), name
    sel_allreduce = [b for op, b in scores["net"] if op == "allreduce"]
    grad_bytes = max(sel_allreduce)  # the gradient all-reduce is the largest
    cols = sum(p.shape[1] for n, p in scores["params"].items() if p.dim() == 2)
    assert sel_allreduce.count(4 * cols) == 2  # selections at t = 0 and t = 4
    assert any(op == "allgather" and b >= grad_bytes for op, b in gather["net"])
    assert {op for op, _ in scores["net"]} == {"allreduce", "allgather"}
    # overlap_comm: each bucket all-reduced during backward and its part of this rank's
    # shard sent down; the same training as one all-reduce after backward: bit for bit
    # with two ranks (a sum of two is exact in any order), else within rounding (gloo's
    # ring cuts a bucket and the whole buffer into different chunks, so sums of four
    # associate differently)
    for r, res in enumerate(ranks):
        for strategy in ("zero-offload", "zero-offload-dpu", "zenflow"):
            got, want = res[f"{strategy}/buckets"], res[f"{strategy}/scores"]
            assert got["buckets"] > 2
            for name, p in want["params"].items():
                same = (torch.equal(got["params"][name], p) if world == 2 else
                        torch.allclose(got["params"][name], p, rtol=1e-5, atol=1e-6))
                assert same, (strategy, r, name, (got["params"][name] - p).abs().max())
            reduced = [b for op, b in got["net"] if op == "allreduce"]
            whole = [b for op, b in want["net"] if op == "allreduce"]
            assert sum(reduced) == sum(whole) and len(reduced) > len(whole)
            for step in range(STEPS):  # the shard's bytes went down, in pieces
                pieces = [b for t, b in got["d2h"] if t == step]
                assert sum(pieces) == got["shard_grad_bytes"]
                assert len(pieces) >= (2 if world == 2 else 1)  # 4 ranks: shards of 326


@pytest.mark.slow
def test_a_dead_rank_makes_the_others_fail_fast(tmp_path):
    started = time.monotonic()
    codes = spawn(2, tmp_path, mode="die", join_timeout_s=120)
    assert codes[1] == 3 and codes[0] == 1, codes
    text = (tmp_path / "error0.txt").read_text()
    # one line, naming the rank that died (its process is gone on this host)
    assert "rank 0/2" in text and "rank 1 died" in text and "\n" not in text.strip(), text
    assert time.monotonic() - started < 120
    assert not list(tmp_path.glob("rank*.pt"))  # no result file from either rank


def test_shard_column_scores_tile_to_the_full_scores():
    torch.manual_seed(0)
    g = torch.randn(7 * 5 + 3)
    from zfbench.real.flat import Slot

    for slot, full in ((Slot("w", (7, 5), 3, 35), g[3:38].view(7, 5)),  # row-major
                       (Slot("w", (7, 5), 3, 35, column_major=True), g[3:38].view(5, 7).t())):
        for square in (False, True):
            want = (full.square() if square else full.abs()).sum(0)
            for world in (1, 2, 3, 4, 9, 38):
                shard = -(-g.numel() // world)
                got = sum(shard_column_scores(g, slot, r * shard,
                                              min(g.numel(), (r + 1) * shard), square)
                          for r in range(world))
                assert torch.allclose(got, want, rtol=1e-6), (slot, square, world)


def test_selection_bytes_llama2_7b():
    shape = get_model("llama2-7b")
    row = selection_bytes(shape, elem_bytes=2)
    assert row["scores_bytes"] == sum(4 * m.cols for m in shape.matrices())
    q = next(m for m in shape.matrices() if m.name.endswith("q_proj"))
    assert q.rows == q.cols == 4096
    assert row["allgather_over_scores"] > 1000


@pytest.mark.slow
def test_cli_two_ranks_through_the_launcher(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    cmd = [sys.executable, "-m", "zfbench.run", "--gpus", "2", "--model", "tiny",
           "--strategy", "zenflow", "--steps", "4", "--seq", "16", "--quiet",
           "--device", "cpu", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import pandas as pd

    spans = pd.read_csv(tmp_path / "zenflow.spans.csv")
    assert set(spans["rank"]) == {0, 1}
    net = spans[spans["lane"] == "net"]
    assert {"allreduce", "allgather"} <= set(net["op"]) and (net["bytes"] > 0).all()


@pytest.mark.slow
def test_ranks_sharing_this_cpu_are_simulated_beside_the_measured_run(tmp_path):
    """--profile with 2 ranks on the CPU: rank 0 measures the lanes, every rank the
    collectives, and the simulator's expectation for the 2 ranks sharing the cores is
    printed and kept in summary.json."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    cmd = [sys.executable, "-m", "zfbench.run", "--gpus", "2", "--model", "tiny",
           "--steps", "10", "--seq", "16", "--quiet", "--device", "cpu", "--profile",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SIMULATED FOR THIS MACHINE" in proc.stdout, proc.stdout
    assert "2 ranks' " in proc.stdout and "gloo all-reduce" in proc.stdout
    import json
    import math

    cal = json.loads((tmp_path / "profile.json").read_text())["calibration"]
    assert cal["collective_ranks"] == 2 and cal["cpu_cores"] >= 1
    assert cal["allreduce_s_per_byte"] >= 0 and cal["allgather_s_fixed"] >= 0
    here = json.loads((tmp_path / "summary.json").read_text())["simulated_here"]
    assert [r["strategy"] for r in here] == list(STRATEGIES)
    for row in here:
        assert math.isfinite(row["step_error_pct"]) and row["simulated_step_time_s"] > 0
    for strategy in STRATEGIES:
        assert (tmp_path / "profiles" / f"{strategy}.json").exists()


def test_gpus_beyond_the_cuda_devices_is_an_error(monkeypatch, capsys):
    from zfbench.run import command as run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code = run.main(["--gpus", "3", "--device", "cuda", "--model", "tiny", "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--gpus 3" in err and "1 CUDA device" in err, err


@pytest.mark.slow
def test_launcher_stops_the_other_ranks_when_one_fails():
    from zfbench.real.launch import LaunchError, launch

    script = ("import os, sys, time\n"
              "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(120)")
    started = time.monotonic()
    with pytest.raises(LaunchError, match=r"rank 1 \(exit code 3\)"):
        launch(2, ["-c", script])
    assert time.monotonic() - started < 60
