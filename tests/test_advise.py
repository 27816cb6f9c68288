"""`python -m zfbench.advise`: the search against a brute force over the same space, the
table's invariants, the DeepSpeed config it writes (zfbench's parser, zfbench.run
--config on a slice, DeepSpeed's own classes where installed), the quality model's
interpolation and the one-line errors."""

import json
from pathlib import Path

import pytest

from zfbench.advise.command import main
from zfbench.advise.ds_config import ds_config
from zfbench.advise.error_bars import regime_errors
from zfbench.advise.quality import QualityModel, interpolate, paired
from zfbench.advise.ranking import overlaps, rank, scorer
from zfbench.advise.search import Evaluator, brute_force, search
from zfbench.advise.space import Setup, Space, default_zenflow, memory
from zfbench.core.config import load_config
from zfbench.core.strategies import has_windows
from zfbench.sims.costs import SimSettings
from zfbench.sims.settings import on_node

PROFILE = str(Path(__file__).resolve().parents[1] / "bench/results/noflag_run_expect/"
              "profile.json")
# The check: llama2-13b on h100-8x-gen5, 4 sequences per GPU, in a space reduced
# to keep the brute force to a few tens of seconds (every knob kind still in it).
REDUCED = Space(
    strategies=("device", "zero-offload", "zenflow"),
    values={"activation_checkpointing": (True, False), "pin_memory": (True,),
            "overlap_comm": (True, False), "topk_ratio": (0.05, 0.1, 0.2),
            "update_interval": (1, 4, 16), "select_interval": (0,),
            "pt_reserved_cores_perc": (0.5,), "offload_params": ("cpu",),
            "offload_optimizer": ("cpu",)},
    coarse={"activation_checkpointing": (True, False), "topk_ratio": (0.05, 0.2),
            "update_interval": (1, 16)})
PER_GPU = 4


@pytest.fixture(scope="module")
def searched():
    base = SimSettings.from_knobs(**on_node("h100-8x-gen5", {"model": "llama2-13b"}))
    quality = QualityModel.load()
    evaluator = Evaluator(base, jobs=2, quiet=True)
    try:
        every = brute_force(REDUCED, PER_GPU, evaluator)
        out = {}
        for objective in ("throughput", "time-to-quality"):
            seen = Evaluator(base, quiet=True)
            seen.done = dict(evaluator.done)  # the same numbers, no second simulation
            out[objective] = search(REDUCED, PER_GPU, seen, scorer(objective, quality))
    finally:
        evaluator.close()
    return base, quality, every, out


@pytest.mark.parametrize("objective", ["throughput", "time-to-quality"])
def test_the_search_finds_the_brute_force_pick_or_one_within_its_error_bar(searched,
                                                                           objective):
    base, quality, every, found = searched
    errors = regime_errors()
    default = default_zenflow(REDUCED.strategies, PER_GPU)
    best = rank(every, objective, quality, errors, default)[0]
    pick = rank(found[objective], objective, quality, errors, default)[0]
    assert len(found[objective]) < len(every)  # a search, not the whole space
    if pick["setup"] != best["setup"]:  # else: within the error bar the table states
        assert overlaps(best, pick, objective), (pick, best)


def test_every_ranked_row_fits_and_the_table_is_sorted(searched):
    base, quality, every, _ = searched
    default = default_zenflow(REDUCED.strategies, PER_GPU)
    rows = rank(every, "throughput", quality, regime_errors(), default)
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(a["tokens_per_s"] >= b["tokens_per_s"] for a, b in zip(rows, rows[1:]))
    for row in rows:
        assert row["device_GiB"] <= row["device_capacity_GiB"]
        assert row["host_GiB"] <= row["host_capacity_GiB"]
        assert row["tokens_per_s"] == pytest.approx(
            PER_GPU * base.machine.ranks * base.scenario.seq / row["step_s"])
        e = row["error_pct"] / 100  # the bars: the step's, and what it puts on tokens/s
        assert (row["step_s_lo"], row["step_s_hi"]) == pytest.approx(
            (row["step_s"] * (1 - e), row["step_s"] * (1 + e)))
        assert row["tokens_per_s_lo"] * row["step_s_hi"] == pytest.approx(
            row["tokens_per_s"] * row["step_s"])
    # the default ZenFlow setup is a row whenever it fits, and never beats the pick
    fits = memory(base, default)["fits"]
    dflt = [r for r in rows if r["default_zenflow"]]
    assert len(dflt) == (1 if fits else 0)
    if dflt:
        assert rows[0]["step_s"] <= dflt[0]["step_s"]
    # the flag says whether the error intervals of neighbours meet
    for a, b in zip(rows, rows[1:]):
        assert a["within_error_of_next"] == (a["tokens_per_s_lo"] <= b["tokens_per_s_hi"])


def test_memory_model_refusals_are_never_simulated(searched):
    _, _, every, _ = searched
    for result in every.values():
        assert result["simulated"] == result["fits"]


# -------------------------------------------------------------- the config it writes
SETUPS = [Setup("device", 2, 4, False, overlap_comm=True),
          Setup("zero-offload", 1, 8, True, pin_memory=False, overlap_comm=False),
          Setup("zero-offload-dpu", 4, 2, True, pin_memory=True, overlap_comm=True),
          Setup("zenflow", 8, 1, True, pin_memory=True, topk_ratio=0.05,
                update_interval=16, select_interval=64, pt_reserved_cores_perc=0.25),
          Setup("zenflow", 8, 1, True, pin_memory=True, topk_ratio=0.2,
                update_interval="auto", select_interval=0, pt_reserved_cores_perc=0.5)]


@pytest.mark.parametrize("setup", SETUPS, ids=[s.label() for s in SETUPS])
def test_zfbench_parses_the_config_as_the_setup(setup):
    cfg = load_config(ds_config(setup, "bf16"), world_size=8)
    assert (cfg.strategy, cfg.micro_batch, cfg.grad_accum, cfg.precision) == \
        (setup.strategy, setup.micro_batch, setup.grad_accum, "bf16")
    assert cfg.overlap_comm == bool(setup.overlap_comm)
    if setup.pin_memory is not None:
        assert cfg.pin_memory == setup.pin_memory
    if has_windows(setup.strategy):
        zf = cfg.zenflow
        assert (zf.topk_ratio, zf.update_interval, zf.select_interval,
                zf.pt_reserved_cores_perc, zf.overlap_step) == \
            (setup.topk_ratio, setup.update_interval, setup.select_interval,
             setup.pt_reserved_cores_perc, True)
    assert cfg.train_batch_size == setup.micro_batch * setup.grad_accum * 8
    assert not load_config(ds_config(setup, "bf16")).notes  # no key ignored


def test_deepspeed_accepts_the_config(monkeypatch):
    """DeepSpeed 0.19.5's own config class (the `deepspeed` extra) reads each config as
    the setup: the batch, the stage, the offload targets, the ZenFlow section."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    zero3 = [Setup("zero-infinity", 2, 4, True, pin_memory=True, offload_params="nvme",
                   offload_optimizer="nvme"),
             Setup("zero-infinity", 2, 4, True, pin_memory=False, offload_params="none",
                   offload_optimizer="cpu")]
    for setup in SETUPS + zero3:
        ds = DeepSpeedConfig(ds_config(setup, "bf16"))
        assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == \
            (setup.micro_batch, setup.grad_accum)
        zero = ds.zero_config
        assert ds.bfloat16_config.enabled and zero.stage == (3 if setup.offload_params else 2)
        if setup.pin_memory is not None:
            assert zero.offload_optimizer.pin_memory == setup.pin_memory
        if setup.offload_optimizer:
            assert zero.offload_optimizer.device == setup.offload_optimizer
        if has_windows(setup.strategy):
            assert (zero.zenflow.topk_ratio, zero.zenflow.update_interval,
                    zero.zenflow.select_interval, zero.zenflow.pt_reserved_cores_perc) == \
                (setup.topk_ratio, setup.update_interval, setup.select_interval,
                 setup.pt_reserved_cores_perc)


@pytest.mark.slow
def test_the_advised_config_runs_through_zfbench_run_on_a_slice(tmp_path, capsys):
    """The command end to end on a small model, then its ds_config.json through
    `python -m zfbench.run --config` on one layer of the tiny model on the CPU lanes."""
    from zfbench.run.command import main as run_main

    out = tmp_path / "advice"
    assert main(["--model", "tinyllama-1.1b", "--node", "a100-4x-gen4", "--global-batch",
                 "8", "--strategies", "zenflow,zero-offload", "--jobs", "1", "--quiet",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    advice = json.loads((out / "advice.json").read_text())
    assert f"{advice['setups_simulated']} setups simulated" in text
    assert (out / "front.png").stat().st_size > 0
    config = json.loads((out / "ds_config.json").read_text())
    pick = advice["rows"][0]
    assert config["train_micro_batch_size_per_gpu"] == pick["micro_batch"]
    assert load_config(config, world_size=4).strategy == pick["strategy"]
    ran = tmp_path / "run"
    assert run_main(["--model", "tiny", "--layers", "1", "--seq", "8", "--device-threads",
                     "1", "--host-threads", "1", "--quiet", "--config",
                     str(out / "ds_config.json"), "--strategy", pick["strategy"],
                     "--steps", "2", "--out", str(ran)]) == 0
    summary = json.loads((ran / "summary.json").read_text())
    used = summary["configs"][pick["strategy"]]
    assert (used["micro_batch"], used["grad_accum"]) == (pick["micro_batch"],
                                                         pick["grad_accum"])


# -------------------------------------------------------------- quality model
def test_interpolation_is_linear_in_log2_and_says_how():
    points = {1: (0.8, 0.04, False), 4: (1.0, 0.0, False)}
    ratio, delta, how = interpolate(points, 2)
    assert ratio == pytest.approx(0.9) and delta == pytest.approx(0.02)
    assert how.startswith("interpolated")
    ratio, _, how = interpolate(points, 16)  # two more doublings along the last segment
    assert ratio == pytest.approx(1.2) and how.startswith("extrapolated")
    assert interpolate(points, 4)[:2] == (1.0, 0.0)


def test_paired_ratio_uses_only_the_shared_seeds():
    runs = {("a", 0): {"steps": "100", "final_val_loss": "1.0", "plateaued": "True"},
            ("a", 1): {"steps": "200", "final_val_loss": "2.0", "plateaued": "True"},
            ("b", 1): {"steps": "300", "final_val_loss": "2.5", "plateaued": "False"}}
    found = paired(runs, "b", "a")
    assert found.steps_ratio == pytest.approx(1.5) and found.seeds == 1
    assert found.loss_delta_nats == pytest.approx(0.5) and found.censored
    assert paired(runs, "c", "a") is None


def test_the_default_zenflow_setup_is_measured_against_device():
    q = QualityModel.load()
    zf = q.by_strategy["zenflow"]
    factor, penalty, basis = q.of("zenflow", {"topk_ratio": 0.1, "update_interval": 4,
                                              "select_interval": 16})
    assert (factor, penalty) == (zf.steps_ratio, zf.loss_delta_nats)
    assert basis.startswith("zenflow measured") and q.of("device", {})[:2] == (1.0, 0.0)


# -------------------------------------------------------------- bad input: one line
@pytest.mark.parametrize("argv,words", [
    (["--node", "a100-4x-gen4", "--global-batch", "30"], ["--global-batch 30", "of 4"]),
    (["--node", "a100-9x"], ["unknown node", "a100-4x-gen4"]),
    (["--node", "a100-4x-gen4", "--model", "llama2-8b"], ["unknown model", "llama2-7b"]),
    (["--node", "a100-4x-gen4", "--strategies", "zenflow,zero-2"], ["zero-2"]),
    (["--model", "llama2-7b"], ["--node"]),
    (["--profile", PROFILE, "--gpus", "8"], ["--gpus"]),
    (["--node", "a100-4x-gen4", "--model", "llama:layers=128,hidden=25600,heads=160",
      "--strategies", "zero-infinity"], ["fits no setup", "a100-8x-gen4"]),
])
def test_bad_input_is_one_error_line(argv, words, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path / "o"), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("error: ")
    for word in words:
        assert word in captured.err
    assert not (tmp_path / "o").exists()


def test_a_measured_profile_is_advised_on_its_own_machine(tmp_path, capsys):
    assert main(["--profile", PROFILE, "--global-batch", "2", "--strategies",
                 "zenflow,zero-offload", "--jobs", "1", "--quiet", "--out",
                 str(tmp_path)]) == 0
    advice = json.loads((tmp_path / "advice.json").read_text())
    assert advice["settings"]["profile"] == PROFILE and advice["global_batch"] == 2
    assert {r["strategy"] for r in advice["rows"]} <= {"zenflow", "zero-offload"}
    assert "setups simulated" in capsys.readouterr().out


def test_no_fit_anywhere_says_so():
    from zfbench.advise.command import no_fit_message

    base = SimSettings.from_knobs(**on_node("a100-4x-gen4", {
        "model": "llama:layers=80,hidden=12288,heads=96"}))
    msg = no_fit_message(base, Space(strategies=("device",)), 8, "a100-4x-gen4")
    assert "fits no setup" in msg and "no node preset fits it" in msg


@pytest.mark.parametrize("per_gpu", [1, 6, 8])
def test_the_coarse_grid_and_the_neighbours_stay_in_the_space(per_gpu):
    space = Space()
    for name in space.strategies:
        full = set(space.setups(name, per_gpu))
        coarse = space.setups(name, per_gpu, coarse=True)
        assert coarse and set(coarse) <= full
        for setup in coarse[:5]:
            assert setup.micro_batch * setup.grad_accum == per_gpu
            around = space.neighbours(setup)
            assert setup not in around and set(around) <= full
    default = default_zenflow(space.strategies, per_gpu)
    assert default in set(space.setups(default.strategy, per_gpu))
