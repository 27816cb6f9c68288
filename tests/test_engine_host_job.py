"""The engine's host optimizer job from presets (`host_job`, issue 44): its bytes against the
tensors the engine's kernels touch, its simulated seconds against a hand computation, and
`predict --from-run` choosing it from the run's config."""

import pytest
import torch

from zfbench.core import engine_host_bytes as eb
from zfbench.sims import host_traffic
from zfbench.sims.costs import ADAM_BYTES_PER_PARAM, CostModel, SimSettings
from zfbench.sims.settings import SimSettingsError
from zfbench.sims.simulator import simulate


def _bytes(*tensors) -> int:
    return sum(t.element_size() for t in tensors)


def reference_bytes(wire_dtype, from_wire: bool, zero: bool, clip: bool) -> int:
    """Bytes per parameter of the engine's host job, counted from one element of each
    tensor it reads and writes (real/strategies.py, real/host_fused.py `host_adamw_`)."""
    f32 = torch.zeros(1, dtype=torch.float32)
    wire = torch.zeros(1, dtype=wire_dtype)
    n = 0
    if from_wire and wire_dtype != torch.float32:  # to_host_dtype: wire read, fp32 written
        n += _bytes(wire, f32)
    if clip:  # grad_norm reads the gradient; mul_ reads and writes it
        n += _bytes(f32) + _bytes(f32, f32)
    n += _bytes(f32, f32, f32, f32)  # AdamW reads grad, master, m, v
    n += _bytes(f32, f32, f32)  # and writes master, m, v
    if wire_dtype != torch.float32:
        n += _bytes(wire)  # the new parameters into the h2d wire
    if zero:
        n += _bytes(f32)  # the window zeroed
    return n


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("from_wire,zero,clip", [(1, 0, False), (0, 1, False), (1, 0, True),
                                                 (0, 1, True), (0, 0, False)])
def test_job_bytes_match_the_tensors_the_engine_touches(dtype, from_wire, zero, clip):
    elem = torch.zeros(1, dtype=dtype).element_size()
    assert eb.host_job_bytes(elem, from_wire, zero, clip) == \
        reference_bytes(dtype, bool(from_wire), bool(zero), clip)


def test_the_fused_kernels_docstring_numbers():
    """real/host_fused.py: 30 B a parameter, 34 with the zeroing (bf16 wire)."""
    assert eb.host_job_bytes(2) == 30 and eb.host_job_bytes(2, zero=1.0) == 34
    assert eb.host_job_bytes(2, from_wire=1.0) == 36
    with pytest.raises(ValueError, match="share"):
        eb.host_job_bytes(2, from_wire=1.5)


def test_engine_job_rate_streams_its_bytes_at_the_adamw_stream():
    assert host_traffic.engine_job_units_per_s(1e9, 56.0) == pytest.approx(0.5e9)
    with pytest.raises(ValueError, match="job_bytes"):
        host_traffic.engine_job_units_per_s(1e9, 0.0)


BASE = dict(model="qwen2.5-0.5b", gpus=1, gpus_per_switch=1, gpu="h100-sxm",
            transfers="full", host_cores=2, steps=8)


def host_optim_s(settings: SimSettings, strategy: str) -> tuple[float, float]:
    """(host_optim seconds of the last step holding it, the model's parameters)."""
    spans = simulate(settings, strategy).timeline.spans_frame()
    mine = spans[spans["op"] == "host_optim"]
    mine = mine[mine["step"] == mine["step"].max()]
    return float((mine["t_end_s"] - mine["t_start_s"]).sum()), \
        CostModel(settings, strategy).params


@pytest.mark.parametrize("job,extra", [("engine", 0), ("engine-clip", eb.CLIP_BYTES)])
def test_zero_offload_host_job_seconds_by_hand(job, extra):
    """Two host cores (far below the node's DRAM cap): the ZeRO-Offload job is P params of
    36 B (48 clipped) at the cores' AdamW stream (x the preset's NUMA factor)."""
    s = SimSettings.from_knobs(**BASE, host_job=job)
    seconds, params = host_optim_s(s, "zero-offload")
    c = CostModel(s, "zero-offload")
    stream = 2 * c.adam_units_per_core_s * ADAM_BYTES_PER_PARAM
    assert c.node.host.dram_bytes_per_s > 10 * stream  # the cores, not DRAM, set it
    assert seconds == pytest.approx(params * (36 + extra) / stream, rel=1e-6)


def test_window_job_over_zero_offload_job_is_their_bytes():
    """ZenFlow's window job (30 B: no widening, and no zeroing since the window's first
    accumulation writes it, issue 45) against ZeRO-Offload's (36 B) on the same cores:
    parameters per second in the ratio 36 / 30."""
    s = SimSettings.from_knobs(**BASE, host_job="engine")
    zo, params = host_optim_s(s, "zero-offload")
    zf, _ = host_optim_s(s.with_(update_interval=4), "zenflow")
    # one window job per window of update_interval steps
    assert zo / zf == pytest.approx(36 / 30, rel=1e-6)
    deepspeed = SimSettings.from_knobs(**BASE)
    ds_zo, _ = host_optim_s(deepspeed, "zero-offload")  # CPU-Adam alone: 28 B
    assert zo / ds_zo == pytest.approx(36 / 28, rel=1e-6)


def test_engine_job_sends_16_bit_gradients_and_refuses_the_fused_upload():
    s = SimSettings.from_knobs(**BASE, host_job="engine")
    assert CostModel(s, "zero-offload").grad_wire_bytes == 2
    assert CostModel(SimSettings.from_knobs(**BASE), "zero-offload").grad_wire_bytes == 4
    with pytest.raises(SimSettingsError, match="host_job"):
        SimSettings.from_knobs(**BASE, host_job="engine", precision="fp16",
                               fused_param_upload=True)
    with pytest.raises(SimSettingsError, match="host_job"):
        SimSettings.from_knobs(**BASE, host_job="zfbench")


def test_predict_takes_the_host_job_from_the_runs_clipping():
    from zfbench.predict.command import run_knobs
    shape = {"model": "tiny", "micro_batch": 1, "seq": 16}
    assert run_knobs({**shape, "gradient_clipping": 0.0})["host_job"] == "engine"
    assert run_knobs({**shape, "gradient_clipping": None})["host_job"] == "engine"
    assert run_knobs({**shape, "gradient_clipping": 1.0})["host_job"] == "engine-clip"
