"""ZenFlow with bf16 weights keeps fp32 where it matters (docs/zenflow.md, "Low-precision
weights"): the device updates fp32 copies of the selected columns and 1-D parameters and
rounds only the weights, and a reselection puts exactly those fp32 values into the host
master, which is never rounded."""

from __future__ import annotations

import pytest
import torch

from engine_helpers import BiasMLP, batches, config, make_engine, train_steps
from zfbench.real.flat import FlatLayout, Slot, put_columns, take_columns


def bf16_config(**zf) -> dict:
    cfg = config("zenflow", lr=1e-4, **zf)
    cfg["bf16"] = {"enabled": True}
    return cfg


@pytest.mark.slow
def test_bf16_norm_weight_at_one_moves_at_a_small_lr():
    """A norm weight at 1.0 moves by ~1e-4 a step: below bf16's spacing there (2^-8 below
    1.0), so an update that is rounded every step never moves it. The device keeps its
    fp32 value, and the bf16 weight is that value rounded."""
    model = BiasMLP()
    with torch.no_grad():
        model.norm.weight.fill_(1.0)
    engine = make_engine(model, bf16_config(topk_ratio=0.25, update_interval=4,
                                            select_strategy="step", select_interval=0))
    train_steps(engine, batches(), 40)
    engine.finish()
    weight = model.norm.weight.detach()
    assert weight.dtype == torch.bfloat16
    assert bool((weight != 1.0).any()), "the norm weight never left 1.0"
    fp32 = engine.strategy.vector_values["norm.weight"]
    assert bool((fp32 != 1.0).all())
    assert torch.equal(weight, fp32.to(torch.bfloat16))
    engine.close()


@pytest.mark.slow
def test_bf16_selected_column_at_one_moves_at_a_small_lr():
    """The same for a selected column of a 2-D weight: its fp32 value accumulates."""
    model = BiasMLP()
    with torch.no_grad():
        model.up.weight.fill_(1.0)
    engine = make_engine(model, bf16_config(topk_ratio=0.25, update_interval=50,
                                            select_strategy="step", select_interval=0))
    train_steps(engine, batches(), 40)  # no boundary: only the device moves the weights
    idx = engine.strategy.selected["up.weight"]
    moved = model.up.weight.detach()[:, idx]
    assert bool((moved != 1.0).any())
    values = engine.strategy.selected_values["up.weight"].values  # [k, rows]
    assert torch.equal(moved, values.t().to(torch.bfloat16))
    engine.close()


RESELECT = {
    "plain": dict(topk_ratio=0.25, update_interval=2, select_strategy="step",
                  select_interval=4),
    "overlap": dict(topk_ratio=0.25, update_interval=2, select_strategy="step",
                    select_interval=4, overlap_step=True),
    "warmup": dict(topk_ratio=0.25, update_interval=2, select_strategy="step",
                   select_interval=6, full_warm_up_rounds=2, overlap_step=True),
    "auto": dict(topk_ratio=0.25, update_interval="auto", select_strategy="step",
                 select_interval=5, auto_ratio=0.5),
    "row_major": dict(topk_ratio=0.25, update_interval=2, select_strategy="step",
                      select_interval=4),  # zfbench.column_major: false
}


def record_selections(engine) -> list[dict]:
    """Wrap the strategy's select: the fp32 state just before (the pending host update
    finished) and just after each selection."""
    s = engine.strategy
    seen = []
    original = s.select

    def state() -> dict:
        return {"master": s.host.master.clone(),
                "selected": {n: i.clone() for n, i in s.selected.items()},
                "values": {n: w.values.clone() for n, w in s.selected_values.items()},
                "vectors": {n: v.clone() for n, v in s.vector_values.items()}}

    def select(t: int) -> None:
        s.e.host_lane.wait(s.pending, 60)
        before = state()
        original(t)
        seen.append({"t": t, "before": before, "after": state(),
                     "weights": engine.flat_params.detach().clone()})
    s.select = select
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(RESELECT))
def test_bf16_reselection_puts_exactly_the_fp32_values_into_the_master(case):
    """At a reselection the master becomes: the master before, with the old selection's
    fp32 values and the 1-D parameters' fp32 values written at their places, nothing else
    (a reference built here from the logical [rows, cols] views). The new selection's
    fp32 values are the master's, and every bf16 weight is then the master rounded."""
    zf = RESELECT[case]
    W = zf.get("full_warm_up_rounds", 0)
    by_column = case != "row_major"
    cfg = bf16_config(**zf)
    cfg["zfbench"]["column_major"] = by_column
    model = BiasMLP()
    engine = make_engine(model, cfg)
    seen = record_selections(engine)
    train_steps(engine, batches(), 13)
    engine.finish()
    layout = engine.layout
    matrices = [n for n, p in engine.named_params if p.dim() == 2]
    vectors = [n for n, p in engine.named_params if p.dim() != 2]
    assert [r["t"] for r in seen][1:] and seen[0]["t"] == W

    def logical(values: torch.Tensor) -> torch.Tensor:  # as [rows, k]
        return values.t() if by_column else values

    for rec in seen:
        before, after, t = rec["before"], rec["after"], rec["t"]
        want = before["master"].clone()
        if t > W:
            for n in matrices:
                idx, values = before["selected"][n], before["values"][n]
                rows = layout.by_name[n].shape[0]
                # one row per column when stored by column
                assert values.shape == ((len(idx), rows) if by_column else (rows, len(idx)))
                layout.view(want, n)[:, idx] = logical(values)
            for n in vectors:
                layout.view(want, n).copy_(before["vectors"][n])
        assert torch.equal(after["master"], want), t
        for n in matrices:  # the new selection starts from the master's fp32 values
            idx = after["selected"][n]
            assert torch.equal(logical(after["values"][n]), layout.view(want, n)[:, idx]), t
        for n in vectors:
            assert torch.equal(after["vectors"][n], layout.view(want, n)), (t, n)
        # unselected columns were the master rounded already: now every weight is
        assert torch.equal(rec["weights"], want.to(torch.bfloat16)), t
    last = seen[-1]["after"]["master"]
    assert seen[-1]["t"] > W
    exact = torch.equal(last, last.to(torch.bfloat16).float())
    share = float((last != last.to(torch.bfloat16).float()).float().mean())
    assert not exact and share > 0.5, share  # the master is not bf16-rounded
    engine.close()


@pytest.mark.slow
def test_fp32_reselection_still_copies_the_exact_weights_back():
    """fp32 weights: the device's values are exact, the whole shard is copied back (the
    master after a reselection is the device's weights), and no fp32 copies are kept."""
    model = BiasMLP()
    engine = make_engine(model, config("zenflow", **RESELECT["overlap"]))
    seen = record_selections(engine)
    train_steps(engine, batches(), 9)
    assert engine.strategy.vector_values == {}
    for rec in seen[1:]:
        assert torch.equal(rec["after"]["master"], rec["weights"])
    engine.close()


def _slots():
    """A 2-D weight stored by column, one by row, a 1-row and a 1-column matrix stored by
    column (both also row-major tensors), and a 1-D parameter, in one flat buffer."""
    specs = [("a", (5, 7), True), ("b", (4, 6), False), ("c", (1, 5), True),
             ("d", (6, 1), True), ("e", (9,), False)]
    slots, offset = [], 3
    for name, shape, by_column in specs:
        numel = int(torch.tensor(shape).prod())
        slots.append(Slot(name, shape, offset, numel, by_column))
        offset += numel
    return slots, offset + 2


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8, 80])
def test_master_take_and_put_tile_over_shards(world):
    """Every rank reads its shard's elements of the selected columns (zeros elsewhere):
    the pieces sum to the columns of the whole master. Every rank writes its elements:
    together they write exactly the columns, as on one rank."""
    from zfbench.real.zenflow_shard import master_put, master_take

    torch.manual_seed(world)
    slots, total = _slots()
    full = torch.randn(total)
    shard = -(-total // world)
    bounds = [(min(total, r * shard), min(total, (r + 1) * shard)) for r in range(world)]
    for slot in slots:
        logical = FlatLayout._view(full, slot)
        idx = None
        if len(slot.shape) == 2:
            idx = torch.tensor([0, 2, 3]) if slot.shape[1] > 3 else torch.tensor([0])
        want = take_columns(logical, idx) if idx is not None else logical
        got = torch.zeros_like(want)
        for lo, hi in bounds:
            part = torch.full_like(want, float("nan"))
            master_take(full[lo:hi], lo, hi, slot, idx, part)
            got += part
        assert torch.equal(got, want), slot
        new = torch.randn(want.shape)
        expect = full.clone()
        target = FlatLayout._view(expect, slot)
        if idx is None:
            target.copy_(new)
        else:
            put_columns(target, idx, new)
        written = full.clone()
        count = sum(master_put(written[lo:hi], lo, hi, slot, idx, new) for lo, hi in bounds)
        assert torch.equal(written, expect), slot
        assert count == new.numel()


def _rank_worker(rank: int, world: int, store: str, out: str) -> None:
    import datetime

    import torch.distributed as dist

    from zfbench.real.distributed import from_process_group

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        model = BiasMLP()
        engine = make_engine(model, bf16_config(**RESELECT["overlap"]),
                             dist=from_process_group(), host_chunk_elems=50,
                             host_timeout_s=60)
        seen = record_selections(engine)
        data = batches(batch=world)
        for _ in range(10):
            ids, labels = next(data)
            engine.backward(engine(ids[rank:rank + 1], labels[rank:rank + 1]))
            engine.step()
        engine.finish()
        torch.save({"seen": seen, "lo": engine.shard_lo, "hi": engine.shard_hi,
                    "total": engine.layout.total},
                   f"{out}/rank{rank}.pt")
        engine.close()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_bf16_reselection_with_shards_across_three_ranks(tmp_path):
    """Three ranks, shards cutting through 2-D weights: the ranks' master shards after a
    reselection are, joined, the joined shards before with the old selection's and the
    1-D parameters' fp32 values written in; every rank's new fp32 values (one all-reduce
    of the shards' pieces) are the joined master's, and its weights the master rounded."""
    import torch.multiprocessing as mp

    world = 3
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_worker, args=(r, world, str(tmp_path / "store"),
                                                    str(tmp_path))) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0] * world
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]
    assert ranks[0]["hi"] - ranks[0]["lo"] < ranks[0]["total"]
    layout = FlatLayout(list(BiasMLP().named_parameters()), column_major=True)
    matrices = [s.name for s in layout.slots if len(s.shape) == 2]
    vectors = [s.name for s in layout.slots if len(s.shape) != 2]
    for i, rec in enumerate(ranks[0]["seen"]):
        t = rec["t"]
        joined = {k: torch.cat([r["seen"][i][k]["master"] for r in ranks])
                  for k in ("before", "after")}
        want = joined["before"].clone()
        if t > 0:
            before = rec["before"]  # the device state is the same on every rank
            for n in matrices:
                layout.view(want, n)[:, before["selected"][n]] = before["values"][n].t()
            for n in vectors:
                layout.view(want, n).copy_(before["vectors"][n])
        assert torch.equal(joined["after"], want), t
        for r in ranks:
            after = r["seen"][i]["after"]
            for n in matrices:
                idx = after["selected"][n]
                assert torch.equal(after["values"][n], layout.view(want, n)[:, idx].t())
            for n in vectors:
                assert torch.equal(after["vectors"][n], layout.view(want, n))
            assert torch.equal(r["seen"][i]["weights"], want.to(torch.bfloat16))
    assert [rec["t"] for rec in ranks[0]["seen"]] == [0, 4, 8]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zenflow", "zero-offload", "device"])
def test_a_bf16_run_stays_within_a_stated_bound_of_fp32(strategy):
    """The stated bound: after 40 steps at lr 1e-3, every parameter tensor of the bf16 run
    is within 2^-7 (two bf16 roundings, 0.78%) relative L2 of the fp32 run's, and every
    step's loss within 2^-5 relative. The master and the selected/1-D values are fp32, so
    only the weights' rounding separates the runs (measured on BiasMLP: 0.30% zenflow,
    0.45% zero-offload and device; losses 0.9-1.2%). Training moved the parameters ~10x
    further than that (7-9%), so the bound is not met by doing nothing."""
    zf = dict(topk_ratio=0.25, update_interval=2, select_strategy="step",
              select_interval=4, overlap_step=True) if strategy == "zenflow" else {}
    runs = {}
    for precision in ("fp32", "bf16"):
        cfg = config(strategy, lr=1e-3, **zf)
        if precision == "bf16":
            cfg["bf16"] = {"enabled": True}
        model = BiasMLP()
        engine = make_engine(model, cfg)
        losses = train_steps(engine, batches(), 40)
        engine.finish()
        engine.close()
        runs[precision] = losses, {n: p.detach().float() for n, p in model.named_parameters()}
    (loss32, p32), (loss16, p16) = runs["fp32"], runs["bf16"]
    start = {n: p.detach().float() for n, p in BiasMLP().named_parameters()}
    for name, want in p32.items():
        drift = float((p16[name] - want).norm() / want.norm())
        assert drift <= 2 ** -7, (name, drift)
        moved = float((want - start[name]).norm() / start[name].norm())
        assert moved > 4 * drift or moved < 1e-3, (name, moved, drift)
    for a, b in zip(loss32, loss16):
        assert abs(a - b) <= 2 ** -5 * abs(a), (a, b)
