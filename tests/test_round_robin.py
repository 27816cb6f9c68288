"""`zfbench.real.rate_probe.round_robin_times`: the one round-robin timer of the probes and
the bench scripts (every function once a round, in turn, after one untimed call each)."""

from __future__ import annotations

from zfbench.real.rate_probe import alternating_medians, round_robin_times


def test_calls_interleave_after_one_untimed_call_each():
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    times = round_robin_times(fns, 3)
    assert order == list("abc") * 4  # the warm-up round, then three timed rounds
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t >= 0 for v in times.values() for t in v)


def test_no_warm_up_and_rounds_from_an_iterable():
    order = []
    round_robin_times({"x": lambda: order.append("x")}, iter(range(2)), warm=False)
    assert order == ["x", "x"]


def test_alternating_medians_times_both_in_turn():
    order = []
    fresh, reused = alternating_medians(lambda: order.append(1), lambda: order.append(2), 2)
    assert order == [1, 2, 1, 2, 1, 2] and fresh >= 0 and reused >= 0
