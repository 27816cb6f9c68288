"""`python -m zfbench.run` decides everything before its first step (zfbench/run/plan.py):
the plan round-trips through its file, the ranks get only that file, a flag counts as
given as argparse parsed it, and the memory check reads top-k from the plan's configs."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from zfbench.core.models import get_model
from zfbench.real.memory import MemoryCheck, check_configs_fit
from zfbench.run.command import build_parser, main
from zfbench.run.plan import PLAN_FILE, RunPlan, plan
from zfbench.run.report import memory_columns

# fixed precision and a named model: planning measures nothing
QUICK = ["--model", "tiny", "--precision", "fp32", "--device", "cpu", "--steps", "2",
         "--quiet"]


def planned(argv: list[str]) -> RunPlan:
    return plan(build_parser().parse_args(argv), argv)


def test_a_plan_round_trips_through_its_json(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
        "fp16": {"enabled": False}, "scheduler": {"type": "WarmupLR", "params": {
            "warmup_num_steps": 5}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                              "zenflow": {"topk_ratio": 0.3, "update_interval": 2}}}))
    run = planned(QUICK + ["--config", str(cfg), "--zenflow.overlap-step", "true",
                           "--out", str(tmp_path / "o")])
    assert run.configs["zenflow"].zenflow.topk_ratio == 0.3
    assert run.configs["zenflow"].scheduler.warmup_num_steps == 5
    assert RunPlan.from_json(run.to_json()) == run
    # the probes' and the proxy's records, the output options, the reasons travel too
    richer = dataclasses.replace(run, precision_probe={"precision": "bf16", "ratio": 1.2},
                                 proxy={"model": "llama2-7b", "threads": 2},
                                 profile=True, bind_cores=True, world=2,
                                 reasons={"precision": "measured"})
    back = RunPlan.from_json(richer.to_json())
    assert back == richer and back.configs["zenflow"].notes == run.configs["zenflow"].notes
    assert back.configs["zenflow"].raw == run.configs["zenflow"].raw
    assert back.scenario == run.scenario


def test_the_run_writes_its_plan_before_the_first_step_and_it_reads_back(tmp_path,
                                                                          monkeypatch):
    import zfbench.run.command as command

    seen = {}

    def stop(run):
        seen["plan"] = RunPlan.read(run.out / PLAN_FILE)
        raise KeyboardInterrupt
    monkeypatch.setattr(command, "execute", stop)
    with pytest.raises(KeyboardInterrupt):
        main(QUICK + ["--strategy", "zenflow", "--out", str(tmp_path)])
    run = seen["plan"]
    assert run.strategies == ("zenflow",) and run.spec.precision == "fp32"
    assert run.command_line == tuple(QUICK + ["--strategy", "zenflow", "--out",
                                              str(tmp_path)])


@pytest.mark.parametrize("out", [True, False])
def test_launched_ranks_get_only_the_plan_file(tmp_path, monkeypatch, out):
    """The launcher hands each rank `-m zfbench.run --plan PATH` and nothing else; the
    file holds what was decided (OUT/plan.json, else a temporary one)."""
    import zfbench.real.launch as launcher

    launched = []

    def fake_launch(nprocs, args, **_):
        launched.append((nprocs, list(args), RunPlan.read(args[-1])))
    monkeypatch.setattr(launcher, "launch", fake_launch)
    argv = QUICK + ["--gpus", "2", "--zenflow.topk-ratio", "0.25"] + (
        ["--out", str(tmp_path)] if out else [])
    assert main(argv) == 0
    [(nprocs, args, run)] = launched
    assert nprocs == 2 and args[:3] == ["-m", "zfbench.run", "--plan"] and len(args) == 4
    assert (Path(args[3]) == tmp_path / PLAN_FILE) is out
    assert run.world == 2 and run.configs["zenflow"].zenflow.topk_ratio == 0.25
    assert run.configs["zenflow"].world_size == 2 and run.spec.precision == "fp32"


def test_a_plan_file_takes_no_other_flag(tmp_path, capsys):
    path = planned(QUICK).write(tmp_path / PLAN_FILE)
    assert main(["--plan", str(path), "--steps", "3"]) == 2
    assert "--plan takes no other flag (got steps)" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main(["--plan", str(tmp_path / "bad.json")]) == 2
    assert "not a plan written by python -m zfbench.run" in capsys.readouterr().err


def test_a_flag_is_given_as_argparse_parsed_it(capsys, monkeypatch):
    """`--lay 2` is refused (no prefixes); `--layers 1`, the default model's default
    depth, still counts as given: the shape is not sized on this machine."""
    import zfbench.run.plan as run_plan

    assert main(["--lay", "2"]) == 2
    assert "unrecognized arguments: --lay" in capsys.readouterr().err
    monkeypatch.setattr(run_plan, "size_default", lambda *a, **k: pytest.fail("sized"))
    argv = ["--layers", "1", "--precision", "fp32", "--device", "cpu"]
    run = planned(argv)
    assert run.scenario_probe is None and run.reasons["sizing"] == "the shape the flags give"
    assert (run.spec.model, run.spec.layers) == ("tinyllama-1.1b", 1)
    assert run.reasons["precision"] == "--precision fp32"


def test_no_shape_flag_sizes_the_default_scenario(monkeypatch):
    import zfbench.run.plan as run_plan

    sized = {"seq": 1, "precision": "fp32", "ratio": 1.4, "shape": "s", "batch": 1,
             "host_adam_s": 0.14, "forward_backward_s": 0.1, "target_ratio": 1.3}
    monkeypatch.setattr(run_plan, "size_default", lambda spec, quiet: sized)
    run = planned(["--device", "cpu", "--steps", "5", "--quiet"])
    assert run.scenario_probe == sized and run.spec.seq == 1
    assert run.precision_probe == {"precision": "fp32", "ratio": 1.4}
    assert run.reasons["sizing"].startswith("scenario sized on this machine")


def test_the_memory_check_reads_top_k_from_the_plans_config():
    """Change top-k in the plan: the memory estimate, the `fits` column and the refusal
    before the run all change with it."""
    run = planned(QUICK + ["--strategy", "zenflow"])
    shape, cfg = run.spec.shape(), run.configs["zenflow"]
    more = dataclasses.replace(cfg, zenflow=dataclasses.replace(cfg.zenflow, topk_ratio=0.9))
    room = {"device": None, "host": 1e12}
    low = memory_columns(shape, cfg, run.spec.seq, 1, room)
    high = memory_columns(shape, more, run.spec.seq, 1, room)
    assert high["device_bytes_per_rank"] > low["device_bytes_per_rank"]
    assert high["host_bytes"] == low["host_bytes"]
    # a machine with room for 0.1 of the columns on the device and not for 0.9
    need = {t: MemoryCheck.of_configs({"zenflow": c}, run.spec.seq, False, host_bytes=1e12)
            .machine_total(MemoryCheck.of_configs({"zenflow": c}, run.spec.seq, False,
                                                  host_bytes=1e12).need(shape, "zenflow"))
            for t, c in ((0.1, cfg), (0.9, more))}
    between = (need[0.1] + need[0.9]) / 2
    check_configs_fit(shape, {"zenflow": cfg}, run.spec.seq, False, host_bytes=between)
    with pytest.raises(MemoryError, match="does not fit"):
        check_configs_fit(shape, {"zenflow": more}, run.spec.seq, False,
                          host_bytes=between)
    assert low["fits"] is True and MemoryCheck.of_configs(
        {"zenflow": more}, run.spec.seq, False, host_bytes=between).fits(shape) is False


def test_a_tiny_model_needs_no_proxy_and_a_huge_one_gets_one(monkeypatch):
    """The proxy decision and its reason are in the plan; the ranks' steps come with it."""
    import zfbench.run.proxy as run_proxy

    monkeypatch.setattr(run_proxy, "PROXY_HOST_ADAM_S", 1e-4)
    monkeypatch.setattr(run_proxy, "measure_host_rates", lambda *a: {
        "host_adam_params_per_s": 1e9, "host_accum_elems_per_s": 1e9, "threads": 1,
        "elements": 1})
    assert planned(QUICK).proxy is None
    run = planned(["--model", "llama2-7b", "--precision", "fp32", "--device", "cpu",
                   "--quiet"])
    assert run.proxy["model"] == "llama2-7b" and run.spec.model == run.proxy["measured"]
    assert get_model(run.spec.model).total_params < get_model("llama2-7b").total_params
    assert run.spec.steps == run.proxy["steps"] == 16
    assert run.reasons["proxy"].startswith("llama2-7b does not fit")


def test_the_gpu_sized_run_keeps_the_zenflow_flags_and_checks_their_top_k(monkeypatch):
    """On CUDA with no shape flag the run is GPU-sized (zfbench/run/defaults.py): the
    --zenflow.* knobs survive it, and the pick is checked with their top-k."""
    import zfbench.real.memory as memory
    from zfbench.run.defaults import GPU_MODELS, gpu_sized
    from zfbench.run.plan import spec_from_args

    args = build_parser().parse_args(["--device", "cpu", "--zenflow.topk-ratio", "0.9"])
    spec = spec_from_args(args, 1, ["zenflow"])
    seen = []
    real_need = memory.MemoryCheck.need

    def need(self, shape, strategy):
        seen.append(self.knobs[strategy][2])
        return real_need(self, shape, strategy)
    monkeypatch.setattr(memory.MemoryCheck, "need", need)
    monkeypatch.setattr(memory, "available_device_bytes", lambda cuda, ranks=1: 80 * 2**30)
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 2 * 2**40)
    sized = gpu_sized(spec, ["zenflow"], 1, quiet=True)
    assert sized.zenflow == {"topk_ratio": 0.9} and sized.layers is None
    assert sized.model in GPU_MODELS and sized.precision == "bf16"
    assert seen and set(seen) == {0.9}


@pytest.mark.slow
def test_a_written_plan_runs_again_as_it_was_decided(tmp_path):
    argv = QUICK + ["--strategy", "device", "--batch", "2", "--seq", "8",
                    "--device-threads", "1", "--host-threads", "1"]
    assert main(argv + ["--out", str(tmp_path)]) == 0
    first = json.loads((tmp_path / "summary.json").read_text())
    assert main(["--plan", str(tmp_path / PLAN_FILE)]) == 0
    again = json.loads((tmp_path / "summary.json").read_text())
    assert again["settings"] == first["settings"] and again["configs"] == first["configs"]
    assert again["command_line"] == first["command_line"]
    assert [r["loss_first"] for r in again["rows"]] == [r["loss_first"] for r in first["rows"]]


def test_the_run_neither_writes_to_its_args_nor_reads_the_command_lines_text():
    """The namespace argparse returns is read, never written (decisions live in the plan),
    and no module of zfbench/run/ looks for a flag in the argv text."""
    import ast

    root = Path(__file__).resolve().parents[1] / "zfbench" / "run"
    found = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id == "args":
                found.append(f"{path.name}:{node.lineno} writes args.{node.attr}")
            if isinstance(node, ast.Compare) and any(
                    isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
                    isinstance(c, ast.Name) and c.id in ("argv", "given")
                    for c in node.comparators):
                found.append(f"{path.name}:{node.lineno} scans the argv text")
    assert not found, found
