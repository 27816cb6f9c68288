"""The simulator's work per run, guarded by a count, not a clock: the SimPy events a fixed
run processes (`SimResult.sim_events`, the `sim_events` column of
bench/results/sim_speed.csv) must not grow past a stated budget.

Why a count: a clock on a shared 2-core machine can neither catch a slower simulator nor
stay quiet. The same code simulated 1,000 steps of every strategy in 20.6 s on one day
and in more than twice that on another (issue 45, item 5: the machine's load, not the
code). The number of events is what a change to the schedule adds (an op on a lane costs
about three to five events, a pool job one or more timers), it is exact and the same on
every machine, and the run's time follows it (bench/results/sim_speed.csv: some 200 to
700 thousand events per second on its 2-core Xeon, by how loaded the machine is).

Where the numbers come from: `MEASURED_EVENTS` is what this very run (`settings()`, each
strategy) processed on branch simfast (issue 45, item 5), recounted on main 717dc45
(2026-11-28: zero-offload +178, zero-offload-dpu -73, zenflow -211 since the first count,
from schedule changes of sessions 23-24, not attributed one by one), where the strategies whose ranks
run alike simulate one rank for the node's four (zfbench.sims.replicas; branch simspeed
measured 14,024 / 103,768 / 39,162 events for device / zero-infinity / zenflow simulating
every rank). The budget is `BUDGET_FACTOR` times that.

If this fails: a change made the simulator process more events for the same run. Where
the new ops are wanted, aggregate what can be aggregated first (work that no other op can
interleave with needs no event of its own), then run `python bench/sim_speed.py` and check
that `simulate --pcie gen4 --steps 1000 --out DIR` still meets its goal there; only then
raise `MEASURED_EVENTS` to the new counts (printed in the failure) and say why in the
commit. A count far below the measured one is no failure, but update it too, so that the
budget keeps guarding.
"""

import pytest

from zfbench.sims.costs import STRATEGIES, SimSettings
from zfbench.sims.simulator import simulate

STEPS = 20
# SimPy events of `settings()` per strategy, as measured (module docstring).
MEASURED_EVENTS = {
    "device": 3_506,
    "zero-offload": 35_559,
    "zero-offload-dpu": 34_029,
    "zero-infinity": 26_872,
    "zenflow": 10_124,
}
BUDGET_FACTOR = 1.2


def settings() -> SimSettings:
    """bench/sim_speed.py's run (llama2-7b on 4 x a100-80g behind PCIe gen4), 20 steps."""
    return SimSettings.from_knobs(model="llama2-7b", gpus=4, pcie="gen4", steps=STEPS)


def test_every_strategy_has_a_budget():
    assert sorted(MEASURED_EVENTS) == sorted(STRATEGIES)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_simulated_events_stay_within_budget(strategy):
    events = simulate(settings(), strategy).sim_events
    budget = int(MEASURED_EVENTS[strategy] * BUDGET_FACTOR)
    assert events <= budget, (
        f"{strategy}: {events} SimPy events for {STEPS} steps of llama2-7b (4 GPUs, PCIe "
        f"gen4), over its budget of {budget} ({BUDGET_FACTOR} x the {MEASURED_EVENTS[strategy]} "
        f"measured): the simulator does more work per step; see this module's docstring")


def test_the_count_is_deterministic():
    """The same run processes the same events, so the budget is a count, never a guess."""
    assert simulate(settings(), "zenflow").sim_events == \
        simulate(settings(), "zenflow").sim_events
