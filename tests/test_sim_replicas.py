"""One rank standing for its node's alike ranks (zfbench.sims.replicas) gives exactly the
simulation of every rank: the same spans and step intervals, float for float, in the same
order (so the same files), over strategies and settings; and it is used only where the
ranks are alike."""

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from zfbench.sims.costs import STRATEGIES, CostModel, SimSettings
from zfbench.sims.replicas import ranks_alike
from zfbench.sims.simulator import simulate

SMALL = {"model": "qwen2.5-0.5b", "layers": 3, "steps": 10}


def assert_same_run(s: SimSettings, strategy: str) -> None:
    fast, every = simulate(s, strategy), simulate(s, strategy, every_rank=True)
    assert fast.timeline._spans == every.timeline._spans
    assert fast.timeline._steps == every.timeline._steps
    assert fast.timeline.meta == every.timeline.meta
    if ranks_alike(CostModel(s, strategy), strategy):  # one rank simulated: fewer events
        assert fast.sim_events < 0.6 * every.sim_events
    else:
        assert fast.sim_events == every.sim_events


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bench_run_is_every_ranks(strategy):
    """bench/sim_speed.py's run (llama2-7b, 4 x a100-80g, PCIe gen4), shortened."""
    assert_same_run(SimSettings.from_knobs(model="llama2-7b", gpus=4, pcie="gen4",
                                           steps=14), strategy)


@hsettings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy=st.sampled_from(["device", "zero-infinity", "zenflow"]),
       gpus=st.sampled_from([2, 4, 8]), pcie=st.sampled_from(["gen3", "gen4"]),
       pin_memory=st.booleans(), overlap_comm=st.booleans(),
       grad_accum=st.sampled_from([1, 2]), zero_stage=st.sampled_from([2, 3]),
       overlap_step=st.booleans(), offload_activations=st.booleans(),
       zero2_reduce=st.sampled_from(["allreduce", "reduce", "reduce-scatter"]),
       zenflow_offload=st.booleans())
def test_alike_ranks_simulate_as_every_rank(strategy, gpus, pcie, pin_memory, overlap_comm,
                                            grad_accum, zero_stage, overlap_step,
                                            offload_activations, zero2_reduce,
                                            zenflow_offload):
    if strategy == "zenflow":
        grad_accum = 1  # not modelled with accumulation (simulate refuses it)
    s = SimSettings.from_knobs(**SMALL, gpus=gpus, pcie=pcie, pin_memory=pin_memory,
                               overlap_comm=overlap_comm, grad_accum=grad_accum,
                               zero_stage=zero_stage, overlap_step=overlap_step,
                               offload_activations=offload_activations,
                               zero2_reduce=zero2_reduce, offload=zenflow_offload)
    assert_same_run(s, strategy)


@pytest.mark.parametrize("knobs", [{"nodes": 2, "gpus_per_node": 4},
                                   {"gpus": 4, "gpus_per_switch": 4},
                                   {"gpus": 8, "full_warm_up_rounds": 1}])
@pytest.mark.parametrize("strategy", ["zero-infinity", "zenflow"])
def test_alike_ranks_over_nodes_and_switches(strategy, knobs):
    assert_same_run(SimSettings.from_knobs(**{**SMALL, **knobs}), strategy)


@pytest.mark.parametrize("strategy, knobs, alike", [
    ("zero-infinity", {"gpus": 4}, True),
    ("device", {"gpus": 4}, True),
    ("zenflow", {"gpus": 4}, True),
    ("zero-offload", {"gpus": 4}, False),  # ZeRO-2 partition owners differ
    ("zero-offload-dpu", {"gpus": 4}, False),
    ("device", {"gpus": 1}, False),  # nothing to stand for
    ("device", {"gpus": 3}, False),  # rank 2 alone behind its PCIe switch
    ("zero-infinity", {"gpus": 4, "offload_params": "nvme"}, False),  # the node's drives
])
def test_where_ranks_are_alike(strategy, knobs, alike):
    s = SimSettings.from_knobs(**{**SMALL, **knobs})
    assert ranks_alike(CostModel(s, strategy), strategy) is alike
    if knobs.get("gpus", 1) > 1:
        assert_same_run(s, strategy)
