"""What the ports of DeepSpeed's ZenFlow unit tests share (tests/conformance).

- `DIFFERENCES`: every place where a ported case is expected to come out differently in
  zfbench, with the line of docs/zenflow.md or docs/config_keys.md that says so. The line
  is looked up when this module is imported (so the xfail reason quotes its current
  number and text); `test_differences_documented.py` fails when a cited line is gone.
- `expected_different(key)`: the strict xfail mark of one difference.
- `SimpleNet`, `GradProbe`: small models (a classifier like DeepSpeed's unit-test
  SimpleModel; a probe whose parameters' gradients are exactly the tensors fed to it).
  Engines are built with tests/engine_helpers.py's `make_engine` (CPU, one thread a lane).
- `ds_zenflow_config`: the config DeepSpeed's ZenFlow engine tests build, as a dict.

The ported files are named test_ds_<DeepSpeed file>.py; every test's docstring names the
DeepSpeed file and test it ports. Where a case comes from a DeepSpeed release after
0.19.5 (the version the ports follow), the docstring says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from zfbench.core.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Difference:
    doc: str                      # docs/<doc>
    fragments: tuple[str, ...]    # all on one line of it
    reason: str                   # what differs, in one sentence
    raises: type | tuple | None = None  # what the zfbench side raises, when it raises

    def line(self) -> tuple[int | None, str]:
        """(1-based line number, text) of the documenting line, or (None, "")."""
        path = ROOT / "docs" / self.doc
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return None, ""
        for number, text in enumerate(lines, start=1):
            if all(fragment in text for fragment in self.fragments):
                return number, text.strip()
        return None, ""

    def citation(self) -> str:
        number, text = self.line()
        if number is None:
            return f"docs/{self.doc}: NOT FOUND: {' ... '.join(self.fragments)}"
        short = text if len(text) <= 160 else text[:157] + "..."
        return f"docs/{self.doc}:{number}: {short}"


DIFFERENCES: dict[str, Difference] = {
    "stage3": Difference(
        "config_keys.md", ("| `zero_optimization.stage` |",
                           "3 with zero-offload or zero-offload-dpu is refused"),
        "zfbench's engine runs ZeRO-3 for ZenFlow (and the device strategy, unpartitioned): "
        "stage 3 with zero-offload or zero-offload-dpu is refused with a ConfigError",
        raises=ConfigError),
    "stage3_offload": Difference(
        "config_keys.md", ("`zero_optimization.stage: 3` runs for the `zenflow` strategy only",),
        "zenflow.offload on ZeRO-3 is refused with a ConfigError (the engine runs it on "
        "stages 1-2)", raises=ConfigError),
    "nvme": Difference(
        "config_keys.md", ("`zero_optimization.offload_optimizer.device`", "'nvme' is refused"),
        "zfbench offloads to CPU memory only: NVMe offload is refused with a ConfigError",
        raises=ConfigError),
    "offload_at_stage0": Difference(
        "config_keys.md", ("`offload_optimizer.device \"cpu\"` at ZeRO stage 0 is refused",),
        "an offload_optimizer section with device 'cpu' and no ZeRO stage (0) is refused; "
        "DeepSpeed's config classes accept it", raises=ConfigError),
    "select_below_update": Difference(
        "zenflow.md", ("A fixed U with `0 < select_interval < U` is refused",),
        "select_interval 4 with update_interval 8 is refused when the config is read "
        "(zfbench reads an integer select_interval under select_strategy 'auto' as "
        "steps); DeepSpeed's ZenFlowConfig accepts it", raises=ConfigError),
    "topk_one": Difference(
        "zenflow.md", ("| `topk_ratio` | (0, 1] |",),
        "zfbench accepts topk_ratio 1.0 (every column on the device), as 0.19.5 does; "
        "DeepSpeed after 0.19.5 refuses both ends of [0, 1]"),
    "zero_columns": Difference(
        "zenflow.md", ("with no columns stops the first selection",),
        "a 2-D weight with 0 columns has no top-k: zfbench's topk_count refuses it "
        "(ValueError) where DeepSpeed after 0.19.5 selects 0 columns", raises=ValueError),
}

# Cited by docstrings (no xfail: the port checks the part that carries over)
NOTES: dict[str, Difference] = {
    "host_moments": Difference(
        "zenflow.md", ("**One set of host moments and a one-window lag.**",),
        "zfbench keeps one set of host moments, not two alternating by buffer parity"),
    "core_split": Difference(
        "config_keys.md", ("`zero_optimization.zenflow.pt_reserved_cores_perc`",
                           "ceil(share x cores)"),
        "zfbench splits a rank's thread counts, not lists of core ids"),
}


def expected_different(key: str, also: str | None = None):
    """Strict xfail for DIFFERENCES[key] (and `also`, when a case hits two)."""
    diff = DIFFERENCES[key]
    reason = f"expected-different: {diff.reason} ({diff.citation()})"
    raises = diff.raises
    if also is not None:
        other = DIFFERENCES[also]
        reason += f"; and {other.reason} ({other.citation()})"
        if raises is not None and other.raises is not None and other.raises != raises:
            raises = None
    kwargs = {"raises": raises} if raises is not None else {}
    return pytest.mark.xfail(strict=True, reason=reason, **kwargs)


# ---------------------------------------------------------------- models
class SimpleNet(nn.Module):
    """A stand-in for DeepSpeed's unit-test SimpleModel: two biased linears of width
    `hidden` and a cross-entropy loss over `hidden` classes."""

    def __init__(self, hidden: int = 10, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.first = nn.Linear(hidden, hidden)
        self.second = nn.Linear(hidden, hidden)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.second(torch.relu(self.first(x.to(self.first.weight.dtype))))
        return nn.functional.cross_entropy(logits.float(), y)


def samples(total: int, hidden: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """`total` random (input, class) pairs: the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(total, hidden, generator=gen),
            torch.randint(0, hidden, (total,), generator=gen))


class GradProbe(nn.Module):
    """Parameters p_i of the given shapes; `loss = sum_i (p_i * g_i).sum()`, so after
    backward each p_i.grad is exactly the g_i passed to forward. What DeepSpeed's
    optimizer tests set as `selected_grad` by hand is fed through the engine this way."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.names = list(shapes)
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.randn(shape, generator=gen)))

    def forward(self, *grads: torch.Tensor) -> torch.Tensor:
        return sum((getattr(self, n) * g).sum() for n, g in zip(self.names, grads))


def probe_config(*, stage: int = 2, offload: bool = False, topk_ratio: float = 0.5,
                 update_interval=4, select_interval=0, full_warm_up_rounds: int = 0,
                 lr: float = 1e-3, weight_decay: float = 0.01, **zero_extra) -> dict:
    """A ZenFlow config for a GradProbe: one sample per step, AdamW at torch's defaults
    (lr 1e-3, weight decay 0.01, as DeepSpeed's optimizer tests use them)."""
    zenflow = {"topk_ratio": topk_ratio, "select_strategy": "step",
               "select_interval": select_interval, "update_interval": update_interval,
               "full_warm_up_rounds": full_warm_up_rounds}
    zero = {"stage": stage, "offload_optimizer": {"device": "cpu"}, "zenflow": zenflow}
    if offload:  # DeepSpeed asserts overlap_comm with it, and so does zfbench
        zenflow["offload"] = True
        zero["overlap_comm"] = True
    zero.update(zero_extra)
    return {"train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": weight_decay}},
            "zero_optimization": zero}


def ds_zenflow_config(stage: int, offload: bool, select_strategy: str, select_interval,
                      update_interval, full_warm_up_rounds: int, topk_ratio: float = 0.2,
                      train_batch_size: int = 4) -> dict:
    """The DeepSpeed config of test_zf.py's BaseZenFlowTest.get_config_dict (bf16 on:
    the accelerators DeepSpeed's CI runs it on support it, and so does zfbench's CPU)."""
    return {
        "train_batch_size": train_batch_size,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
        "zero_optimization": {
            "stage": stage,
            "offload_optimizer": {"device": "cpu"},
            "overlap_comm": True,
            "zenflow": {
                "topk_ratio": topk_ratio,
                "select_strategy": select_strategy,
                "select_interval": select_interval,
                "update_interval": update_interval,
                "overlap_step": False,
                "offload": offload,
                "auto_ratio": 0.99,
                "full_warm_up_rounds": full_warm_up_rounds,
            },
        },
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": True},
    }
