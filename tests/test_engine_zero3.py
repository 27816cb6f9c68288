"""ZenFlow on ZeRO-3 in the engine (real/zero3.py, real/zenflow_zero3.py).

On one rank and on 2 and 4 gloo ranks (real processes) the engine's weights follow the
plain reference of zenflow.md (tests/zenflow_reference.py) driven by the whole batch's
gradients at its own weights, to 1e-5; ZeRO-3 and ZeRO-2 end on the same weights and
columns; parameters are released (NaN) outside their module's use, and a read of a
released one shows; each rank owns 1/N of the parameters and the gradients are
reduce-scattered, the gathers and the reduce-scatter carrying their bytes; a checkpoint
resumes exactly on the same number of ranks; a non-finite gradient in any rank's shard
makes every rank skip the step.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_helpers import (BiasMLP, batches, config, make_engine, params_of,  # noqa: E402
                            spawn_ranks, train_steps)
from zenflow_reference import ReferenceZenFlow  # noqa: E402
from zfbench.core.config import ConfigError, load_config  # noqa: E402
from zfbench.real.zenflow_zero3 import shard_positions  # noqa: E402
from zfbench.real.flat import FlatLayout  # noqa: E402

CASES = {
    "overlap_warmup_reselect": dict(topk_ratio=0.25, update_interval=3, select_strategy="step",
                                    select_interval=6, full_warm_up_rounds=2,
                                    overlap_step=True),
    "sync": dict(topk_ratio=0.3, update_interval=2, select_strategy="step",
                    select_interval=4, overlap_step=False),
    "auto": dict(topk_ratio=0.25, update_interval="auto", select_strategy="step",
                 select_interval=0, auto_ratio=0.5, overlap_step=False),
}
STEPS = 12
CLIP = 0.5


def z3_config(case: str, stage: int = 3, precision: str = "fp32") -> dict:
    cfg = config("zenflow", clip=CLIP, **CASES[case])
    cfg["zero_optimization"]["stage"] = stage
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def reference_run(case: str, steps: int = STEPS, batch: int = 4):
    """The reference on the whole batch's gradients at its own weights (float64 state;
    the gradients from an fp32 copy of the model at those weights)."""
    cfg = z3_config(case)
    parsed = load_config(cfg)
    model = BiasMLP()
    ref = ReferenceZenFlow(list(params_of(model).items()), parsed.zenflow, parsed.optimizer,
                           gradient_clipping=CLIP)
    data = batches(batch=batch)
    for _ in range(steps):
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(ref.params()[name])
        model.zero_grad()
        ids, labels = next(data)
        model(ids, labels).backward()
        ref.step({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    ref.finish()
    return ref


def worst(got: dict, want: dict) -> float:
    return max(float((got[n].double() - want[n].double()).abs().max()) for n in want)


# -- config ---------------------------------------------------------------------------
def test_stage3_is_accepted_for_zenflow_only_and_reads_the_prefetch_bucket():
    cfg = z3_config("sync")
    cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = 5e4
    parsed = load_config(cfg)
    assert (parsed.zero_stage, parsed.prefetch_elems) == (3, 50_000)
    assert load_config(z3_config("sync")).prefetch_elems == 50_000_000
    other = config("zero-offload")
    other["zero_optimization"]["stage"] = 3
    with pytest.raises(ConfigError, match="stages 1-2 only"):
        load_config(other)
    offload = z3_config("sync")
    offload["zero_optimization"]["zenflow"]["offload"] = True
    offload["zero_optimization"]["overlap_comm"] = True
    with pytest.raises(ConfigError, match="offload"):
        load_config(offload)


# -- one rank -------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_rank_matches_the_reference_and_zero2(case):
    ref = reference_run(case)
    finals = {}
    for stage in (2, 3):
        model = BiasMLP()
        engine = make_engine(model, z3_config(case, stage))
        train_steps(engine, batches(), STEPS)
        engine.finish()
        engine.close()
        finals[stage] = (params_of(model), dict(engine.strategy.selected))
        assert worst(finals[stage][0], ref.params()) < 1e-5, stage
        for name, idx in ref.selected.items():
            assert torch.equal(engine.strategy.selected[name].cpu(), idx), (stage, name)
        if case == "auto":
            assert engine.strategy.chosen_windows == ref.chosen_windows
    # AdamW is elementwise: ZeRO-3's shard update is ZeRO-2's, up to rounding order
    assert worst(finals[3][0], finals[2][0]) < 1e-6


def test_released_parameters_are_nan_and_a_read_after_release_shows():
    model = BiasMLP()
    engine = make_engine(model, z3_config("sync"))
    train_steps(engine, batches(), 3)
    for name, p in model.named_parameters():  # between steps: nothing is gathered
        assert torch.isnan(p).all(), name
        assert p.untyped_storage().nbytes() == p.element_size(), name  # one element
    assert engine.flat_params.numel() == 0  # no full-size copy of the parameters
    owned = engine.zero3.owned
    assert torch.isfinite(owned).all() and owned.numel() == engine.layout.total
    with engine.zero3.gathered():  # the whole model, assembled on demand
        assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isnan(p).all() for p in model.parameters())
    # a parameter read outside its module's forward is a read of released storage
    ids, labels = next(batches())
    bypass = model.out.weight.sum()
    assert torch.isnan(bypass)
    loss = engine(ids, labels)
    assert torch.isfinite(loss)
    engine.close()


def test_the_first_forward_traces_units_and_later_ones_prefetch():
    model = BiasMLP()
    cfg = z3_config("sync")
    cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = 0
    engine = make_engine(model, cfg)
    train_steps(engine, batches(), 2)
    z3 = engine.zero3
    names = [dict(model.named_modules()) for _ in (0,)][0]
    order = [next(n for n, m in names.items() if m is z3.modules[i]) for i in z3.trace]
    assert order == ["emb", "up", "down", "norm", "out"]
    assert z3.inflight == {}
    engine.close()


def test_shard_positions_cover_each_selected_element_once():
    model = BiasMLP()
    named = list(model.named_parameters())
    layout = FlatLayout(named, column_major=True)
    idx = {n: torch.tensor([0, 2]) for n, p in named if p.dim() == 2}
    mats = [(layout.by_name[n], i) for n, i in idx.items()]
    vecs = [layout.by_name[n] for n, p in named if p.dim() != 2]
    whole = shard_positions(mats, vecs, 0, layout.total)
    cuts = [0, 37, 200, 411, layout.total]
    pieces = [shard_positions(mats, vecs, a, b) + a for a, b in zip(cuts, cuts[1:])]
    assert torch.equal(torch.cat(pieces).sort().values, whole.sort().values)
    want = sum(p.shape[0] * 2 for n, p in named if p.dim() == 2) + \
        sum(p.numel() for n, p in named if p.dim() != 2)
    assert whole.numel() == want == len(set(whole.tolist()))


def test_checkpoint_resumes_exactly_on_one_rank(tmp_path):
    data = list(itertools.islice(batches(), 10))
    cfg = z3_config("overlap_warmup_reselect")
    model = BiasMLP()
    engine = make_engine(model, cfg)
    train_steps(engine, iter(data[:7]), 7)  # mid-window, an update pending
    engine.save_checkpoint(tmp_path)
    train_steps(engine, iter(data[7:]), 3)
    engine.finish()
    engine.close()
    resumed_model = BiasMLP(seed=5)
    resumed = make_engine(resumed_model, cfg)
    resumed.load_checkpoint(tmp_path)
    train_steps(resumed, iter(data[7:]), 3)
    resumed.finish()
    resumed.close()
    for name, p in params_of(model).items():
        assert torch.equal(params_of(resumed_model)[name], p), name
    # the file holds the rank's shard once (no full-size working space), and a resume on
    # another stage is refused with the stage to use
    tag = (tmp_path / "latest").read_text().strip()
    saved = torch.load(tmp_path / tag / resumed.checkpoint_name, weights_only=False)
    assert saved["flat_params"].numel() == 0
    assert saved["strategy"]["owned"].numel() == engine.layout.total
    other = make_engine(BiasMLP(), z3_config("overlap_warmup_reselect", stage=2))
    with pytest.raises(ValueError, match="saved on ZeRO stage 3; resume it with "
                                         "zero_optimization.stage 3"):
        other.load_checkpoint(tmp_path)
    other.close()


def test_bf16_weights_follow_zero2():
    finals = {}
    for stage in (2, 3):
        model = BiasMLP()
        engine = make_engine(model, z3_config("overlap_warmup_reselect", stage, "bf16"))
        train_steps(engine, batches(), STEPS)
        engine.finish()
        engine.close()
        finals[stage] = params_of(model)
    for name, p in finals[2].items():  # the same fp32 values, rounded the same way
        diff = (finals[3][name].float() - p.float()).abs().max()
        assert diff <= 2 ** -7 * p.float().abs().max(), (name, diff)


# -- several ranks --------------------------------------------------------------------
def _rank(rank: int, world: int, store: str, out: str) -> None:
    import datetime

    import torch.distributed as dist

    from zfbench.real.distributed import from_process_group
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    ctx = from_process_group()
    per = 4 // world
    results = {}
    try:
        runs = [(c, 3, "fp32") for c in sorted(CASES)] + [
            ("overlap_warmup_reselect", 2, "fp32"), ("overlap_warmup_reselect", 2, "bf16"),
            ("overlap_warmup_reselect", 3, "bf16"), ("sync", 3, "allgather"),
            ("sync", 3, "bf16wire")]
        for case, stage, precision in runs:
            model = BiasMLP()
            cfg = z3_config(case, stage, "bf16" if precision == "bf16" else "fp32")
            if precision == "allgather":  # the selection from all-gathered gradients
                cfg["zfbench"]["select_comm"] = "allgather"
            elif precision == "bf16wire":  # communication_data_type: reduce-scattered in bf16
                cfg["communication_data_type"] = "bf16"
            engine = make_engine(model, cfg, dist=ctx,
                                 host_chunk_elems=50, host_timeout_s=60,
                                 hazard_check=True)
            data = list(itertools.islice(batches(batch=4), STEPS))
            for step, (ids, labels) in enumerate(data):
                sl = slice(rank * per, (rank + 1) * per)
                engine.backward(engine(ids[sl], labels[sl]))
                engine.step()
                if (step, stage, case, precision) == (6, 3, "overlap_warmup_reselect", "fp32"):
                    engine.save_checkpoint(Path(out, "ckpt"))
            engine.finish()
            engine.close()
            results[f"{case}/{stage}" + ("" if precision == "fp32" else f"/{precision}")] = {
                "params": params_of(model), "selected": dict(engine.strategy.selected),
                "net": [(s.op, s.bytes) for s in engine.timeline.spans if s.lane == "net"],
                "owned": None if engine.zero3 is None else engine.zero3.owned.numel(),
                "ahead": None if engine.zero3 is None else engine.zero3.ahead,
                "hazards": engine.backend.hazards.report()["hazards"]}
        # a NaN in rank 1's local gradient lands in rank 0's shard: both ranks skip
        model = BiasMLP()
        engine = make_engine(model, z3_config("sync"), dist=ctx, host_chunk_elems=50,
                             host_timeout_s=60)
        for step, (ids, labels) in enumerate(data[:5]):
            sl = slice(rank * per, (rank + 1) * per)
            engine.backward(engine(ids[sl], labels[sl]))
            if step == 3 and rank == world - 1:
                engine.flat_grads[0] = float("nan")
            engine.step()
        engine.finish()
        engine.close()
        results["nonfinite"] = {"skipped": [r["skipped"] for r in engine.step_log],
                                "params": params_of(model)}
        # resume the checkpoint of step 6 on the same ranks: the same end, bit for bit
        model = BiasMLP(seed=7)
        engine = make_engine(model, z3_config("overlap_warmup_reselect"), dist=ctx,
                             host_chunk_elems=50, host_timeout_s=60)
        engine.load_checkpoint(Path(out, "ckpt"))
        for ids, labels in data[7:]:
            sl = slice(rank * per, (rank + 1) * per)
            engine.backward(engine(ids[sl], labels[sl]))
            engine.step()
        engine.finish()
        engine.close()
        results["resumed"] = {"params": params_of(model)}
        torch.save(results, Path(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def spawn(world: int, tmp_path: Path) -> list[dict]:
    assert spawn_ranks(_rank, world, tmp_path, join_timeout_s=400) == [0] * world
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_match_the_reference_and_zero2(world, tmp_path):
    ranks = spawn(world, tmp_path)
    total = sum(p.numel() for p in BiasMLP().parameters())
    for case in sorted(CASES):
        ref = reference_run(case)
        for r, res in enumerate(ranks):
            got = res[f"{case}/3"]
            assert worst(got["params"], ref.params()) < 1e-5, (case, r)
            for name, idx in ref.selected.items():
                assert torch.equal(got["selected"][name], idx), (case, r, name)
            assert got["hazards"] == 0, (case, r)
            # after the first forward's trace every unit but a pass's first is prefetched
            units = 5  # BiasMLP: emb, up, down, norm, out
            assert got["ahead"] == (2 * STEPS - 1) * (units - 1), (case, r)
            assert got["owned"] == min(-(-total // world), total - r * -(-total // world))
            ops = {op for op, _ in got["net"]}
            assert {"allgather", "reduce_scatter"} <= ops and "allreduce" in ops
            # every step gathers the whole model twice (forward, backward), one unit at a
            # time, and reduce-scatters the whole gradient once
            gathered = sum(b for op, b in got["net"] if op == "allgather")
            assert gathered == STEPS * 2 * total * 4 + total * 4  # + finish's gather
            scattered = [b for op, b in got["net"] if op == "reduce_scatter"]
            assert len(scattered) == STEPS
            assert all(b == -(-total // world) * world * 4 for b in scattered)
    for r, res in enumerate(ranks):
        zero2, zero3 = res["overlap_warmup_reselect/2"], res["overlap_warmup_reselect/3"]
        assert worst(zero3["params"], zero2["params"]) < 1e-6, r
        for name, p in res["resumed"]["params"].items():
            assert torch.equal(p, zero3["params"][name]), (r, name)
        for name, p in res["overlap_warmup_reselect/3"]["params"].items():  # replicas
            assert torch.equal(p, ranks[0]["overlap_warmup_reselect/3"]["params"][name])
        bf2, bf3 = (res[f"overlap_warmup_reselect/{k}/bf16"]["params"] for k in (2, 3))
        for name, p in bf2.items():  # the same fp32 values, rounded the same way
            diff = (bf3[name].float() - p.float()).abs().max()
            assert diff <= 2 ** -7 * p.float().abs().max(), (r, name, diff)
        scores, gathered = res["sync/3"], res["sync/3/allgather"]
        for name, idx in scores["selected"].items():  # the same columns either way
            assert torch.equal(gathered["selected"][name], idx), (r, name)
        assert worst(gathered["params"], scores["params"]) < 1e-6, r
        wire = res["sync/3/bf16wire"]
        halves = [b for op, b in wire["net"] if op == "reduce_scatter"]
        assert halves == [b // 2 for op, b in scores["net"] if op == "reduce_scatter"]
        assert worst(wire["params"], scores["params"]) < 0.02, r
        assert res["nonfinite"]["skipped"] == [False, False, False, True, False], r
        for name, p in res["nonfinite"]["params"].items():
            assert torch.isfinite(p).all(), (r, name)
            assert torch.equal(p, ranks[0]["nonfinite"]["params"][name]), (r, name)


def test_a_tied_head_registered_as_external_reads_the_gathered_embedding():
    """real/model.py's tied head reads the embedding's weight in its own forward
    (`register_external_parameter`): ZeRO-3 computes ZeRO-2's losses and gradients.
    Only rounding differs (the backward hooks' nodes change the order autograd sums
    gradients in: 1e-7), which Adam's g / sqrt(v) amplifies for gradients near eps, so the
    weights after 6 steps agree to 1e-3 (a weight one step stale would be lr = 1e-2 off)."""
    import dataclasses

    from zfbench.core.models import get_model
    from zfbench.real.model import build_model
    shape = dataclasses.replace(get_model("tiny"), tied_embeddings=True)
    gen = torch.Generator().manual_seed(3)
    ids = [torch.randint(0, shape.vocab, (2, 9), generator=gen) for _ in range(6)]
    finals, losses, first = {}, {}, {}
    for stage in (2, 3):
        model = build_model(shape, seed=0)
        engine = make_engine(model, z3_config("overlap_warmup_reselect", stage))
        losses[stage] = []
        for x in ids:
            loss = engine(x[:, :-1], x[:, 1:])
            engine.backward(loss)
            first.setdefault(stage, {n: p.grad.clone() for n, p in engine.named_params})
            engine.step()
            losses[stage].append(float(loss.detach()))
        engine.finish()
        engine.close()
        finals[stage] = params_of(model)
    assert worst(first[3], first[2]) < 1e-6
    assert max(abs(a - b) for a, b in zip(losses[2], losses[3])) < 1e-5
    assert worst(finals[3], finals[2]) < 1e-3


def test_gradient_accumulation_reduces_once_per_boundary_as_zero2_trains():
    """Micro-steps accumulate the whole local gradient; the boundary's step
    reduce-scatters it (one rank: no collective) and trains as ZeRO-2 does."""
    finals = {}
    for stage in (2, 3):
        cfg = z3_config("sync", stage)
        cfg["gradient_accumulation_steps"] = 2
        cfg["train_micro_batch_size_per_gpu"] = 2
        cfg.pop("train_batch_size", None)
        model = BiasMLP()
        engine = make_engine(model, cfg)
        data = batches(batch=2)
        for _ in range(8):
            ids, labels = next(data)
            engine.backward(engine(ids, labels))
            engine.step()
        engine.finish()
        engine.close()
        assert engine.t == 4 and engine.config.grad_accum == 2
        finals[stage] = params_of(model)
    assert worst(finals[3], finals[2]) < 1e-6
