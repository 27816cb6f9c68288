"""DeepSpeed training scripts run as they are (issue 46): tests/deepspeed_scripts/ holds
scripts written against DeepSpeed's documented API (its getting-started tutorial, a
causal-LM fine-tune after its ZenFlow example, its checkpointing tutorial) whose only
zfbench line is `import zfbench.real as deepspeed`. Under `torchrun --nproc-per-node 2`
(CPU, gloo) each trains, and its losses equal those of the same script on one rank with
the whole batch; a checkpoint saved with a tag and client_state resumes exactly.

At c057941 the first of them stopped at its `initialize(args=args, ...)` call (TypeError:
unexpected keyword 'args')."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_torchrun import free_port

SCRIPTS = Path(__file__).parent / "deepspeed_scripts"
ZENFLOW = SCRIPTS / "ds_config_zenflow.json"


def launch(script: str, out: Path, *args: str, ranks: int = 2) -> subprocess.Popen:
    """`torchrun --nproc-per-node 2 SCRIPT ...` (ranks 1: the script as one process)."""
    cmd = [sys.executable, str(SCRIPTS / script), "--out", str(out), *args]
    if ranks > 1:
        cmd[1:2] = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                    str(SCRIPTS / script)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def results(*procs_and_outs) -> list[dict]:
    got = []
    for proc, out in procs_and_outs:
        try:
            log, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"{proc.args} did not finish (a hang)") from None
        assert proc.returncode == 0, log[-3000:]
        got.append(json.loads(out.read_text()))
    return got


def two_ranks_and_one(tmp_path: Path, script: str, *args: str) -> tuple[dict, dict]:
    two, one = tmp_path / "two.json", tmp_path / "one.json"
    return tuple(results((launch(script, two, *args), two),
                         (launch(script, one, *args, ranks=1), one)))


@pytest.mark.slow
def test_the_getting_started_script_on_two_ranks_equals_one_rank(tmp_path):
    two, one = two_ranks_and_one(tmp_path, "getting_started.py", "--deepspeed",
                                 "--deepspeed_config",
                                 str(SCRIPTS / "ds_config_getting_started.json"))
    # train_batch_size 8 = micro x 2 accumulation x ranks
    assert one["batch"] == [8, 4, 2] and two["batch"] == [8, 2, 2]
    assert one["steps"] == two["steps"] == 8 and len(one["losses"]) == 16
    assert two["losses"] == pytest.approx(one["losses"], rel=0, abs=1e-6)
    # WarmupLR over 4 steps, log: DeepSpeed's 0, 0, then log(i + 1) / log(4) of 1e-3
    assert two["lrs"] == one["lrs"] == pytest.approx(
        [0.0, 0.0, 5e-4, 1e-3 * 0.792481250, 1e-3, 1e-3, 1e-3, 1e-3])


@pytest.mark.slow
def test_the_zenflow_fine_tune_on_two_ranks_equals_one_rank(tmp_path):
    two, one = two_ranks_and_one(tmp_path, "finetune_causal_lm.py", "--deepspeed_config",
                                 str(ZENFLOW))
    assert one["steps"] == two["steps"] == 8 and len(one["losses"]) == 16
    assert two["losses"] == pytest.approx(one["losses"], rel=0, abs=1e-6)
    # WarmupDecayLR, linear: up to 1e-2 in 2 steps, down to 0 at step 8
    assert two["lrs"] == pytest.approx([0, 0, 5e-3, 1e-2, 1e-2 * 5 / 6, 1e-2 * 4 / 6,
                                        1e-2 * 3 / 6, 1e-2 * 2 / 6])
    assert sum(one["losses"][-4:]) < sum(one["losses"][:4])  # it learns


@pytest.mark.slow
def test_a_tagged_checkpoint_with_client_state_resumes_exactly_on_two_ranks(tmp_path):
    """Saved at steps 3 and 6 (tags: the loss, as DeepSpeed's tutorial does), `latest`
    names step 6's; resumed from step 3's tag by two new ranks, the losses of steps 3-7
    equal the uninterrupted run's, bit for bit."""
    ckpt = tmp_path / "ckpt"
    full, = results((launch("checkpoint_resume.py", tmp_path / "full.json",
                            "--deepspeed_config", str(ZENFLOW), "--save_dir", str(ckpt)),
                     tmp_path / "full.json"))
    tags = sorted(p.name for p in ckpt.iterdir() if p.is_dir())
    assert len(tags) == 2 and (ckpt / "latest").read_text() in tags
    first = next(t for t in tags if t != (ckpt / "latest").read_text())
    assert float(first) == pytest.approx(full["losses"][5], abs=1e-6)  # step 3's loss
    resumed, = results((launch("checkpoint_resume.py", tmp_path / "resumed.json",
                               "--deepspeed_config", str(ZENFLOW), "--load_dir", str(ckpt),
                               "--ckpt_id", first), tmp_path / "resumed.json"))
    assert full["start"] == 0 and resumed["start"] == 3  # client_state came back
    assert resumed["losses"] == full["losses"][6:] and len(resumed["losses"]) == 10
    assert resumed["lrs"] == full["lrs"][3:]
