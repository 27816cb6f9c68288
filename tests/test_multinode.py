"""Several nodes: the --nodes/--gpus-per-node knobs, the two-level ring collective costs
(zfbench.sims.collectives) against hand computations, one host per node, the oracle's closed form
over several nodes, and the refusals."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings as hsettings, strategies as st

from zfbench.sims import collectives, zero3
from zfbench.sims.nvme import nvme_spans
from zfbench.sims.costs import STRATEGIES, CostModel, SimSettings, SimSettingsError
from zfbench.sims.simulator import simulate
from zfbench.core import hardware
from zfbench.simulate.command import main
from test_oracle import assert_agrees, sim_settings

GB = 1e9
NVLINK3 = 300e9 * 0.8, 5e-6          # hardware.json nvlink3: bytes/s x efficiency, latency
IB_HDR = 25e9 * 0.8, 10e-6           # ib-hdr-200
ETH = 12.5e9 * 0.7, 20e-6            # eth-100


def test_one_node_collectives_are_todays_formulas():
    c = CostModel(SimSettings.from_knobs(gpus=4))
    bw, lat = NVLINK3
    assert c.allreduce_s(GB) == 2 * 3 / 4 * GB / bw + 2 * 3 * lat
    assert c.allgather_s(GB) == 3 / 4 * GB / bw + 3 * lat
    assert CostModel(SimSettings.from_knobs(gpus=1)).allreduce_s(GB) == 0.0
    # gpus_per_node on one node is the same run as --gpus
    assert CostModel(SimSettings.from_knobs(nodes=1, gpus_per_node=4)).allreduce_s(GB) == \
        c.allreduce_s(GB)


def test_two_level_allreduce_and_allgather_by_hand():
    c = CostModel(SimSettings.from_knobs(nodes=2, gpus_per_node=8, gpus_per_switch=2))
    bw, lat = NVLINK3
    ib, ilat = IB_HDR
    # reduce-scatter + all-gather in the node (2 x 7/8 B), all-reduce of B/8 across 2 nodes
    ar = 2 * 7 / 8 * GB / bw + 2 * 7 * lat + 2 * 1 / 2 * (GB / 8) / ib + 2 * 1 * ilat
    ag = 7 / 8 * GB / bw + 7 * lat + 1 / 2 * (GB / 8) / ib + 1 * ilat
    assert c.allreduce_s(GB) == pytest.approx(ar, rel=1e-12)
    assert c.allgather_s(GB) == pytest.approx(ag, rel=1e-12)
    assert c.gpus == 16 and c.gpus_per_node == 8 and c.cores_per_rank == c.node.host.cores / 8


def test_one_gpu_per_node_is_a_plain_inter_node_ring():
    eth = hardware.lookup("net_links", "eth-100")
    nv = hardware.lookup("net_links", "nvlink3")
    ebw, elat = ETH
    assert collectives.allreduce_s(nv, eth, 1, 4, GB) == pytest.approx(
        2 * 3 / 4 * GB / ebw + 2 * 3 * elat, rel=1e-12)
    assert collectives.allgather_s(nv, eth, 1, 4, GB) == pytest.approx(
        3 / 4 * GB / ebw + 3 * elat, rel=1e-12)


def test_inter_node_presets_carry_sources():
    for name, rate in (("ib-hdr-200", 25e9), ("ib-ndr-400", 50e9), ("eth-100", 12.5e9)):
        link = hardware.lookup("net_links", name)
        assert link.bytes_per_s == rate
        assert set(link.sources) >= {"bytes_per_s", "latency_s", "efficiency"}
    assert "DGX A100" in hardware.lookup("net_links", "ib-hdr-200").sources["bytes_per_s"]
    assert "DGX H100" in hardware.lookup("net_links", "ib-ndr-400").sources["bytes_per_s"]


def _host_rate(**knobs) -> tuple[float, float]:
    """(host Adam seconds per rank, parameters per second per rank) of zero-offload."""
    r = simulate(SimSettings.from_knobs(model="llama2-7b", layers=4, steps=12, **knobs), "zero-offload")
    spans = [s for s in r.timeline.spans if s.op == "host_optim"]
    ranks = {s.rank for s in spans}
    assert ranks == set(range(r.costs.gpus))
    secs = sum(s.duration_s for s in spans) / len(ranks)
    return secs, r.host_optim_params_per_step() * 12 / secs


def test_each_node_has_its_own_host():
    one_node_secs, one_node = _host_rate(gpus=2)
    two_nodes_secs, two_nodes = _host_rate(nodes=2, gpus_per_node=2)
    _, four_on_one = _host_rate(gpus=4)
    # 2 x 2: each rank gets half of its own node's cores and DRAM, as on 1 x 2 ...
    assert two_nodes == pytest.approx(one_node, rel=1e-9)
    # ... and updates half the parameters (ZeRO partitions over all 4 ranks)
    assert two_nodes_secs == pytest.approx(one_node_secs / 2, rel=1e-9)
    # 4 ranks sharing one host get half the rate each
    assert four_on_one == pytest.approx(one_node / 2, rel=1e-9)


def test_network_bounds_zenflow_on_slow_inter_node_links():
    def step(net):
        r = simulate(SimSettings.from_knobs(model="llama2-7b", layers=4, steps=12, nodes=4,
                                            gpus_per_node=2, inter_net=net), "zenflow")
        return r.timeline.steps_frame()["t_end_s"].max()
    assert step("eth-100") > step("ib-ndr-400")


@pytest.mark.parametrize("knobs, words", [
    ({"nodes": 2}, "--nodes 2 needs --gpus-per-node"),
    ({"nodes": 2, "gpus_per_node": 4, "gpus": 2}, "--gpus 2 contradicts --nodes 2 x "
                                                   "--gpus-per-node 4 = 8 ranks"),
    ({"nodes": 0, "gpus_per_node": 4}, "nodes must be an integer >= 1"),
    ({"nodes": 2, "gpus_per_node": 0}, "gpus_per_node must be an integer >= 1"),
    ({"nodes": 2, "gpus_per_node": 2, "inter_net": "carrier-pigeon"}, "carrier-pigeon"),
])
def test_refusals(knobs, words):
    with pytest.raises(SimSettingsError, match=words):
        SimSettings.from_knobs(**knobs)


def test_consistent_gpus_is_accepted():
    s = SimSettings.from_knobs(nodes=2, gpus_per_node=8, gpus=16)
    assert s.machine.ranks == 16 and s.machine.gpus_on_node == 8


def test_cli_refuses_contradicting_gpus_in_one_line(capsys):
    # --gpus 4 is the default: only the flags tell that it was given
    assert main(["--nodes", "2", "--gpus-per-node", "8", "--gpus", "4", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--gpus 4 contradicts --nodes 2 x --gpus-per-node 8 = 16 ranks" in err
    assert main(["--nodes", "2", "--quiet"]) == 2
    assert "--gpus-per-node" in capsys.readouterr().err


def _alone_reads(spans, rank: int):
    """`rank`'s NVMe reads that overlap none of its own writes: (seconds, bytes) each."""
    writes = [(t0, t1) for r, lane, _, _, t0, t1, _ in spans if r == rank and lane == "nvme_write"]
    return [(t1 - t0, n) for r, lane, _, _, t0, t1, n in spans
            if r == rank and lane == "nvme_read" and n > 0
            and all(t1 <= w0 or t0 >= w1 for w0, w1 in writes)]


def test_zero_infinity_on_nvme_swaps_to_each_nodes_own_drives():
    """Over several nodes each node's ranks share that node's drive array only. One rank a
    node: its reads that overlap none of its own writes run at the whole array's rate,
    although the other node's rank reads at the same moments (on one node the two ranks'
    reads share one array and such reads run at half of it)."""
    knobs = dict(offload_params="nvme", layers=2, steps=4)
    two_nodes = SimSettings.from_knobs(nodes=2, gpus_per_node=1, **knobs)
    one_node = SimSettings.from_knobs(gpus=2, **knobs)
    full = two_nodes.machine.nvme_drive().read_bytes_per_s * two_nodes.machine.nvme_drives
    for s, rate in ((two_nodes, full), (one_node, full / 2)):
        spans = nvme_spans(simulate(s, "zero-infinity", every_node=True).timeline)
        # the two ranks read at the same moments (the case a shared array would slow)
        reads = {r: [(t0, t1) for rr, lane, _, _, t0, t1, _ in spans
                     if rr == r and lane == "nvme_read"] for r in (0, 1)}
        assert any(a0 < b1 and b0 < a1 for a0, a1 in reads[0] for b0, b1 in reads[1])
        alone = _alone_reads(spans, 0)
        assert alone
        for seconds, nbytes in alone:
            assert seconds == pytest.approx(nbytes / rate, rel=1e-9)


def test_nvme_bound_per_node_is_that_nodes_ranks_traffic():
    """Two nodes of two ranks: each rank's share halves against one node of two, and each
    node's array carries its own two ranks' traffic, so the drive time per step halves."""
    knobs = dict(offload_params="nvme", layers=2, steps=4)
    one = zero3.nvme_busy_s_per_step(CostModel(SimSettings.from_knobs(gpus=2, **knobs)))
    two = zero3.nvme_busy_s_per_step(CostModel(SimSettings.from_knobs(nodes=2, gpus_per_node=2, **knobs)))
    assert two == pytest.approx(one / 2, rel=1e-6)
    fits = CostModel(SimSettings.from_knobs(nodes=2, gpus_per_node=2, **knobs)).fits("zero-infinity")
    whole = CostModel(SimSettings.from_knobs(gpus=2, **knobs)).fits("zero-infinity")
    assert fits["nvme_bytes"] == pytest.approx(whole["nvme_bytes"] / 2, rel=1e-9)


def test_cli_runs_two_nodes(capsys):
    assert main(["--nodes", "2", "--gpus-per-node", "2", "--layers", "2", "--steps", "12",
                 "--strategy", "zenflow", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "2 nodes x 2 x a100-80g (ib-hdr-200 between nodes)" in out


@hsettings(max_examples=40, deadline=None,
           suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(s=st.builds(
    lambda base, nodes, g, net: base.with_(gpus=nodes * g, nodes=nodes, gpus_per_node=g,
                                           gpus_per_switch=min(base.machine.gpus_per_switch, g),
                                           inter_net=net),
    sim_settings(), st.sampled_from([2, 3]), st.sampled_from([1, 2]),
    st.sampled_from(["eth-100", "ib-hdr-200", "ib-ndr-400"])),
    strategy=st.sampled_from(STRATEGIES))
def test_simulation_matches_oracle_over_several_nodes(s, strategy):
    """Nodes are identical and share only the collectives (two-level costs, fixed per
    rank), so the one-node closed form with those costs is the run's mean where exact."""
    from oracle import steady_state

    assume(steady_state(s, strategy).exact)
    assert_agrees(s, strategy)


@pytest.mark.parametrize("strategy, knobs", [
    ("device", {}), ("zenflow", {"steps": 12}), ("zero-infinity", {}),
    ("zero-infinity", {"offload_params": "nvme"})])
def test_repeating_nodes_are_simulated_once_and_exactly(strategy, knobs):
    """Where every node's ranks run as node 0's, simulating node 0 alone gives exactly
    the spans and steps that node's ranks have in the simulation of every node."""
    s = SimSettings.from_knobs(nodes=3, gpus_per_node=2, layers=2, **{"steps": 4, **knobs})
    alone, every = simulate(s, strategy), simulate(s, strategy, every_node=True)
    assert alone.timeline.meta["simulated_nodes"] == 1
    assert every.timeline.meta["simulated_nodes"] == 3
    for frame in ("spans_frame", "steps_frame"):
        got = getattr(alone.timeline, frame)()
        full = getattr(every.timeline, frame)()
        assert set(full["rank"]) == set(range(6)) and set(got["rank"]) == {0, 1}
        mine = full[full["rank"] < 2].reset_index(drop=True)
        assert got.reset_index(drop=True).equals(mine)


def test_zero2_partitions_simulate_every_node():
    """ZeRO-2's partition owners differ across the whole run: every node is simulated."""
    s = SimSettings.from_knobs(nodes=2, gpus_per_node=2, layers=2, steps=4)
    result = simulate(s, "zero-offload")
    assert result.timeline.meta["simulated_nodes"] == 2
    assert set(result.timeline.spans_frame()["rank"]) == set(range(4))


@pytest.mark.parametrize("strategy", ["device", "zero-infinity"])
def test_repeating_nodes_summary_is_the_whole_runs(strategy):
    """The summary of node 0 simulated alone is the summary of every node simulated:
    per-rank means and the whole run's figures (its ranks, all ranks' PCIe bytes over
    the model's) alike."""
    import math

    from zfbench.simulation import summary_row

    s = SimSettings.from_knobs(nodes=2, gpus_per_node=2, layers=2, steps=4,
                               **({"offload_params": "nvme"} if strategy == "zero-infinity" else {}))
    alone = summary_row(simulate(s, strategy))
    every = summary_row(simulate(s, strategy, every_node=True))
    assert alone.keys() == every.keys() and alone["ranks"] == every["ranks"] == 4
    for key, value in every.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(alone[key]), key
        elif isinstance(value, float):
            assert alone[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert alone[key] == value, key
