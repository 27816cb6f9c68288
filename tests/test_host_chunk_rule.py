"""The engine's host chunk size follows its host lane's threads (zfbench.core.strategies
`engine_host_chunk_elems`), and the simulator cuts the engine's host updates the same way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_helpers import BiasMLP, config, make_engine  # noqa: E402
from zfbench.core.strategies import (ENGINE_HOST_CHUNK_ELEMS,  # noqa: E402
                                     ENGINE_HOST_CHUNK_ELEMS_PER_THREAD,
                                     engine_host_chunk_elems)
from zfbench.sims.costs import CostModel, SimSettings  # noqa: E402

M = 1 << 20


@pytest.mark.parametrize("threads, elems", [(0, 4 * M), (1, 4 * M), (2, 4 * M), (3, 6 * M),
                                            (8, 16 * M), (16, 32 * M)])
def test_the_rule_keeps_4m_to_two_threads_then_2m_a_thread(threads, elems):
    assert engine_host_chunk_elems(threads) == elems


@given(st.integers(min_value=1, max_value=512))
def test_each_threads_share_of_a_chunk_is_at_least_the_per_thread_floor(threads):
    chunk = engine_host_chunk_elems(threads)
    assert chunk >= ENGINE_HOST_CHUNK_ELEMS
    assert chunk >= ENGINE_HOST_CHUNK_ELEMS_PER_THREAD * threads
    assert engine_host_chunk_elems(threads + 1) >= chunk  # never smaller with more threads


@pytest.mark.parametrize("host_threads, want", [(1, 4 * M), (3, 6 * M)])
def test_the_engine_takes_the_rule_for_its_host_threads(host_threads, want):
    engine = make_engine(BiasMLP(), config("zero-offload"), host_threads=host_threads)
    try:
        assert engine.host_chunk_elems == want
    finally:
        engine.close()


def test_an_explicit_chunk_wins_over_the_rule():
    engine = make_engine(BiasMLP(), config("zero-offload"), host_threads=3,
                         host_chunk_elems=97)
    try:
        assert engine.host_chunk_elems == 97
    finally:
        engine.close()


def test_the_simulator_cuts_the_engines_host_job_by_the_ranks_cores():
    """From presets with the engine's host job, a rank's host cores set the chunk; with
    DeepSpeed's host job there is no chunking (None)."""
    s = SimSettings.from_knobs(model="llama2-7b", gpus=4, host_job="engine")
    costs = CostModel(s)
    assert costs.host_chunk_elems == engine_host_chunk_elems(int(costs.cores_per_rank))
    assert costs.host_chunk_elems > ENGINE_HOST_CHUNK_ELEMS  # many cores a rank
    assert CostModel(s.with_(host_job="deepspeed")).host_chunk_elems is None


@pytest.mark.parametrize("threads, want", [(1, [4 * M, M]), (3, [5 * M])])
def test_the_profile_times_the_host_update_in_the_engines_chunks(monkeypatch, threads, want):
    """The profile's host AdamW rate is the engine's update as it runs: chunk by chunk for
    the lane's threads (5M elements: 4M + 1M on one thread, one 6M chunk on three)."""
    import torch

    from zfbench.real import rate_probe
    probe = rate_probe.RateProbe(5 * M, torch.bfloat16, 1)
    calls = []
    monkeypatch.setattr(rate_probe.kernels, "host_adamw_",
                        lambda p, g, m, v, wire, **hp: calls.append(
                            (p.numel(), g.numel(), m.numel(), v.numel(), wire.numel())))
    probe.host_update(threads)()
    assert [c[0] for c in calls] == want
    assert all(len(set(c)) == 1 for c in calls)  # every operand of a chunk sliced alike
    calls.clear()
    probe.host_adam()  # the whole master in one call (the contention probes' load)
    assert [c[0] for c in calls] == [5 * M]


def test_chunk_bounds_cover_every_element_once():
    from zfbench.core.strategies import chunk_bounds
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(8, 4) == [(0, 4), (4, 8)]
    assert chunk_bounds(0, 4) == [] and chunk_bounds(3, 0) == [(0, 1), (1, 2), (2, 3)]
