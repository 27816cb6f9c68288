"""zero-infinity's activation checkpoints offloaded to the host (`offload_activations`,
DeepSpeed's cpu_checkpointing): the bytes, the blocking staged copies, the memory, the
refusals, and agreement with the closed-form oracle on a full-duplex link."""

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings as hsettings

from zfbench.core import hardware
from zfbench.sims import zero3
from zfbench.sims.costs import CostModel, SimSettings, SimSettingsError
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import simulate
from oracle import steady_state
from test_oracle import assert_agrees, sim_settings

ZI = "zero-infinity"
V100 = dict(node_knobs("dgx2-v100", 1), precision="fp16", steps=4, micro_batch=4,
            offload_params="none")


def per_step(result, op: str) -> list[float]:
    """Seconds of `op` spans in each steady step (the first left out)."""
    spans = result.timeline.spans_frame()
    spans = spans[(spans["op"] == op) & (spans["step"] >= 1)]
    return list(spans.groupby("step")["duration_s"].sum())


def test_checkpoint_bytes_and_what_moves():
    s = SimSettings.from_knobs(**V100, model="gpt2:layers=3,hidden=1024,heads=16",
                               offload_activations=True)
    c = CostModel(s)
    ckpt = 4 * 1024 * 1024 * 2  # micro-batch x seq x hidden x fp16
    assert [zero3.checkpoint_bytes(c, i) for i in range(len(c.buckets))] == \
        [0, ckpt, ckpt, ckpt, 0]  # embedding, three decoder layers, head
    plain = zero3.bytes_per_step(CostModel(s.with_(offload_activations=False)))
    moved = zero3.bytes_per_step(c)
    assert moved["d2h"] - plain["d2h"] == moved["h2d"] - plain["h2d"] == 3 * ckpt
    accum = zero3.bytes_per_step(CostModel(s.with_(grad_accum=3)))
    plain3 = zero3.bytes_per_step(CostModel(s.with_(grad_accum=3, offload_activations=False)))
    assert accum["d2h"] - plain3["d2h"] == 3 * 3 * ckpt  # every micro-step's


def test_the_device_waits_for_each_staged_copy():
    # one V100, partitions on the GPU (nothing else on the link in forward): every copy
    # runs at the lesser of the link and the staging copy, and the step grows by exactly
    # the copies' time
    s = SimSettings.from_knobs(**V100, model="gpt2:layers=3,hidden=1024,heads=16")
    c = CostModel(s)
    base, off = simulate(s, ZI), simulate(s.with_(offload_activations=True), ZI)
    ckpt = 4 * 1024 * 1024 * 2
    link = c.node.link
    cap = c.pageable_copy_bytes_per_s
    down = 3 * (link.setup_latency_s + ckpt / min(link.d2h_bytes_per_s, cap))
    up_each = link.setup_latency_s + ckpt / min(link.h2d_bytes_per_s, cap)
    assert per_step(off, "d2h_act") == pytest.approx([down] * 3, rel=1e-9)
    # an upload beside a gradient download runs slower (the link's duplex factor):
    # never faster than alone
    assert all(x >= 3 * up_each * (1 - 1e-9) for x in per_step(off, "h2d_act"))
    steps = off.timeline.steps_frame()
    base_steps = base.timeline.steps_frame()
    grown = (steps["t_end_s"] - steps["t_start_s"]).iloc[1:].to_numpy() - \
        (base_steps["t_end_s"] - base_steps["t_start_s"]).iloc[1:].to_numpy()
    copies = [d + u for d, u in zip(per_step(off, "d2h_act"), per_step(off, "h2d_act"))]
    assert list(grown) == pytest.approx(copies, rel=1e-6)


def test_the_overhead_falls_with_hidden_size():
    """Bytes grow with the hidden size, a layer's compute with its square: the copies
    cost a narrow model more (the ZeRO-Infinity paper's observation for its activation
    offload, Figure 6e)."""
    slowdown = []
    for hidden, layers in ((1024, 4), (4096, 2)):
        s = SimSettings.from_knobs(**V100, model=f"gpt2:layers={layers},hidden={hidden},heads=16")
        plain, off = simulate(s, ZI), simulate(s.with_(offload_activations=True), ZI)
        slowdown.append(off.timeline.steps_frame()["t_end_s"].iloc[-1] /
                        plain.timeline.steps_frame()["t_end_s"].iloc[-1])
    assert slowdown[0] > slowdown[1] > 1.0


def test_memory_moves_the_checkpoints_to_the_host():
    s = SimSettings.from_knobs(**node_knobs("dgx2-v100", 16), precision="fp16", micro_batch=4,
                               model="gpt2:layers=12,hidden=4096,heads=32")
    plain, off = (CostModel(s.with_(offload_activations=x)).memory_per_rank(ZI)
                  for x in (False, True))
    ckpt = 4 * 1024 * 4096 * 2
    assert plain["device_bytes_per_rank"] - off["device_bytes_per_rank"] == \
        pytest.approx(11 * ckpt)  # all but the layer being recomputed
    assert off["host_bytes"] - plain["host_bytes"] == pytest.approx(12 * ckpt * 16)


@pytest.mark.parametrize("knobs,words", [
    (dict(activation_checkpointing=False), "needs activation_checkpointing true"),
])
def test_refusals(knobs, words):
    with pytest.raises(SimSettingsError, match=words):
        SimSettings.from_knobs(offload_activations=True, **knobs)


@pytest.fixture(scope="module")
def duplex_link(tmp_path_factory) -> str:
    """A hardware file with gen4's link made full duplex (an upload beside a download
    at full rate), where the oracle's zero-infinity form can be exact with the
    checkpoints' uploads beside the gradients' downloads."""
    entry = hardware.entry_of("host_links", hardware.get_link("gen4"))
    for key in ("h2d_factor_when_d2h_busy", "d2h_factor_when_h2d_busy"):
        entry[key] = {"value": 1.0, "source": "test: full duplex"}
    path = tmp_path_factory.mktemp("hw") / "duplex.json"
    path.write_text(json.dumps({"host_links": {"gen4-duplex": entry}}))
    return str(path)


@hsettings(max_examples=40, deadline=None,
           suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow,
                                  HealthCheck.function_scoped_fixture])
@given(s=sim_settings())
def test_simulation_matches_oracle_where_exact(s, duplex_link):
    s = s.with_(offload_activations=True, offload_params="cpu", hardware=duplex_link,
                pcie="gen4-duplex")
    assume(steady_state(s, ZI).exact)
    assert_agrees(s, ZI)
