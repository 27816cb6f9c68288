"""Ports of DeepSpeed's tests/unit/runtime/zenflow/test_zf.py (0.19.5) to zfbench.

DeepSpeed's engine tests train SimpleModel over 20 random samples under each ZenFlow
config and return early on a CPU accelerator; here every config zfbench runs is trained
for real on the CPU (bf16, as DeepSpeed's GPU CI runs it), and the ports also check what
the smoke tests leave out: finite losses, moved weights, DeepSpeed's select-interval
resolution, the number of selected columns and (two ranks) replicas that stay equal.
ZeRO-3 runs (real/zero3.py) but not with `zenflow.offload`: those cases are
expected-different (refused, documented); `zenflow.offload` runs on stages 1-2.
"""
import math

import pytest
import torch

from conformance_ranks import SAMPLES, run_smoke, runs_in_zfbench, smoke_grid, smoke_key
from conformance_support import ds_zenflow_config, expected_different
from zfbench.core.config import load_config
from zfbench.core.schedule import topk_count
from zfbench.real.distributed import default_thread_split


def smoke_params():
    for stage, offload, sel, si, ui, warm in smoke_grid():
        marks = ()
        if stage == 3 and offload:
            marks = expected_different("stage3_offload")
        yield pytest.param(stage, offload, sel, si, ui, warm, marks=marks,
                           id=f"{sel}-{si}-{ui}-offload{offload}-W{warm}-stage{stage}")


SMOKE = list(smoke_params())
SMOKE_ARGS = "stage,offload,select_strategy,select_interval,update_interval,full_warm_up_rounds"


def check_smoke_run(run: dict, world: int, select_strategy: str, select_interval,
                    full_warm_up_rounds: int, topk_ratio: float = 0.2) -> None:
    assert run["world"] == world
    assert run["micro_batch"] == 4 // world  # train_batch_size 4 = micro x 1 x world
    assert len(run["losses"]) == SAMPLES // run["micro_batch"]
    assert all(math.isfinite(loss) for loss in run["losses"])
    assert any(not torch.equal(run["start"][n], run["final"][n]) for n in run["start"])
    # select_interval as DeepSpeed resolves it without a dataloader it owns: "step"
    # counts steps; "epoch" (and "auto", which means once per epoch) select once
    assert run["S"] == (select_interval if select_strategy == "step" else 0)
    if len(run["losses"]) > full_warm_up_rounds:  # a selection happened
        weights = [n for n, p in run["final"].items() if p.dim() == 2]
        assert sorted(run["selected"]) == sorted(weights)
        for name, idx in run["selected"].items():
            cols = run["final"][name].shape[1]
            assert idx.numel() == max(1, math.floor(topk_ratio * cols)), name


@pytest.mark.parametrize(SMOKE_ARGS, SMOKE)
def test_zenflow_single_gpu(stage, offload, select_strategy, select_interval,
                            update_interval, full_warm_up_rounds):
    """Ports tests/unit/runtime/zenflow/test_zf.py::TestZenFlowSingleGPU::test_zenflow_single_gpu:
    one rank trains DeepSpeed's config (train_batch_size 4, Adam lr 1e-4, overlap_comm, topk
    0.2, bf16) over 20 samples, for every stage x warm-up x offload x interval triple."""
    cfg = ds_zenflow_config(stage, offload, select_strategy, select_interval,
                            update_interval, full_warm_up_rounds)
    run = run_smoke(cfg, hidden=10)
    check_smoke_run(run, 1, select_strategy, select_interval, full_warm_up_rounds)


@pytest.mark.slow
@pytest.mark.parametrize(SMOKE_ARGS, SMOKE)
def test_zenflow_distributed(stage, offload, select_strategy, select_interval,
                             update_interval, full_warm_up_rounds, request):
    """Ports tests/unit/runtime/zenflow/test_zf.py::TestZenFlowDistributed::test_zenflow_distributed:
    two gloo ranks, each calling zfbench.real.initialize(model, ds_config) inside its
    process group, train DeepSpeed's config; both ranks end with identical weights and
    columns."""
    cfg = ds_zenflow_config(stage, offload, select_strategy, select_interval,
                            update_interval, full_warm_up_rounds)
    load_config(cfg, world_size=2)  # the refused cases stop here
    ranks = request.getfixturevalue("two_ranks")
    key = smoke_key(stage, offload, select_strategy, select_interval, update_interval,
                    full_warm_up_rounds)
    assert runs_in_zfbench(stage, offload)
    runs = [rank["smoke"][key] for rank in ranks]
    for run in runs:
        check_smoke_run(run, 2, select_strategy, select_interval, full_warm_up_rounds)
    for name in runs[0]["final"]:
        assert torch.equal(runs[0]["final"][name], runs[1]["final"][name]), name
    for name in runs[0]["selected"]:
        assert torch.equal(runs[0]["selected"][name], runs[1]["selected"][name]), name


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_small_positive_topk_ratio(stage, two_ranks):
    """Ports tests/unit/runtime/zenflow/test_zf.py::TestZenFlowSmallTopKRatio::test_small_positive_topk_ratio
    (DeepSpeed after 0.19.5): topk_ratio 0.01 on 50 columns still updates one column per
    weight on the device, on two ranks (select and update every step)."""
    key = smoke_key(stage, False, "step", 1, 1, 0, 0.01, 50)
    runs = [rank["smoke"][key] for rank in two_ranks]
    for run in runs:
        check_smoke_run(run, 2, "step", 1, 0, topk_ratio=0.01)
        assert all(idx.numel() == 1 for idx in run["selected"].values())
    for name in runs[0]["final"]:
        assert torch.equal(runs[0]["final"][name], runs[1]["final"][name]), name


@pytest.mark.parametrize("cores,perc,expected_zf,expected_pt", [
    (list(range(8)), 0.25, [2, 3, 4, 5, 6, 7], [0, 1]),
    (list(range(8)), 0.1, [1, 2, 3, 4, 5, 6, 7], [0]),
    ([10, 11], 0.5, [11], [10]),
    ([0, 1, 2, 3], 0.0, [0, 1, 2, 3], [0, 1, 2, 3]),
    ([0, 1, 2, 3], 1.0, [0, 1, 2, 3], [0, 1, 2, 3]),
])
def test_split_affinity(cores, perc, expected_zf, expected_pt):
    """Ports tests/unit/runtime/zenflow/test_zf.py::test_split_affinity
    (deepspeed/runtime/zenflow/zenflow_utils.py's _split_affinity rule for
    pt_reserved_cores_perc). zfbench splits a rank's thread counts, not core-id lists
    (docs/config_keys.md, the pt_reserved_cores_perc row), so the port compares sizes: the
    device (training, DeepSpeed's "pt") lane gets ceil(perc x cores), the host AdamW ("zf")
    lane the rest, and both get every core when either side would get none; isolated sides
    partition the cores exactly."""
    device, host = default_thread_split(len(cores), perc)
    assert (device, host) == (len(expected_pt), len(expected_zf))
    if expected_zf != expected_pt:
        assert device + host == len(cores)


@pytest.mark.parametrize("num_columns,topk_ratio,expected", [
    pytest.param(0, 0.01, 0, marks=expected_different("zero_columns")),
    (50, 0.01, 1),
    (200, 0.01, 2),
])
def test_num_selected_columns_has_nonzero_floor(num_columns, topk_ratio, expected):
    """Ports tests/unit/runtime/zenflow/test_zf.py::test_num_selected_columns_has_nonzero_floor
    (DeepSpeed after 0.19.5; 0.19.5 itself selects int(ratio x cols) columns, 0 for 50 x
    0.01): zfbench's topk_count keeps max(1, floor(ratio x cols)) (docs/zenflow.md, "One
    step after warm-up")."""
    assert topk_count(num_columns, topk_ratio) == expected
