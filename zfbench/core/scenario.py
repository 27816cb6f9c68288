"""The scenario: what one training run is, as the engine and the simulator both take it.

A `Scenario` is the run's own part of the settings, a dataclass per section as
torchtitan's job config has: the model shape (`model`, `layers`), the batch (`micro_batch`
rows x `seq` tokens, `grad_accum` micro-steps per optimizer step), the device precision,
and a `ZenFlowScenario` section with the ZenFlow knobs the simulator models. The machine
(node, link, host, ranks) and the measurement (steps, profile) are not part of it.

Who embeds it: `zfbench.sims.settings.SimSettings` and `zfbench.real.runner.RunSpec`
(`.scenario`, `.from_scenario(sc, **rest)`; their defaults are `GPU_NODE`'s and
`CPU_LANES`'). An engine config's ZenFlow section becomes a `ZenFlowScenario` through
`zenflow_scenario`, the one rule the run's expectation, its projections and
`zfbench.validate` share (`zfbench.sims.settings.for_engine_run`).

The named default scenarios, each defined once here:
- `GPU_NODE`: what `python -m zfbench.simulate` simulates with no flag: llama2-7b at full
  depth, batch 1 x seq 1024, bf16;
- `CPU_LANES`: what `python -m zfbench.run` trains by default on the CPU-emulated
  accelerator: tinyllama-1.1b's first layer, batch 1, seq `DEFAULT_SEQ` (4; the run may
  size it down on the machine at hand, zfbench.run.probe), the precision left open (a
  config's, else measured there).
Both run zfbench's ZenFlow scenario (`SCENARIO_ZENFLOW`, config_zenflow.py says why). A
Scenario checks nothing itself: the SimSettings or RunSpec built from it checks every value.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from zfbench.core.config_zenflow import SCENARIO_ZENFLOW, ZenFlowConfig


@dataclass(frozen=True)
class ZenFlowScenario:
    """The ZenFlow knobs a simulation models (`zero_optimization.zenflow` keys), by default
    zfbench's scenario (SCENARIO_ZENFLOW) with DeepSpeed's warm-up rounds."""
    topk_ratio: float = SCENARIO_ZENFLOW["topk_ratio"]  # share of columns updated on device
    update_interval: int | str = SCENARIO_ZENFLOW["update_interval"]  # steps, or "auto"
    select_interval: int = SCENARIO_ZENFLOW["select_interval"]  # steps; 0: select once
    overlap_step: bool = SCENARIO_ZENFLOW["overlap_step"]  # host update behind compute
    full_warm_up_rounds: int = ZenFlowConfig.full_warm_up_rounds
    offload: bool = ZenFlowConfig.offload  # the device AdamW's moments in host memory
    # ZenFlow's host work on the cores DeepSpeed's pt_reserved_cores_perc leaves each rank
    # (deepspeed/runtime/zenflow/zenflow_utils.py `_split_affinity`); None: all the rank's
    # cores, the design's (a measured profile measures the engine's)
    pt_reserved_cores_perc: float | None = None
    # The simulator's own two: what update_interval "auto" resolves to (N, N1,N2,... or a
    # windows.csv; None: AUTO_ASSUMED_WINDOW_STEPS, zfbench.sims.update_windows), and the
    # ZeRO stage ZenFlow runs on (2; 3: DeepSpeed's ZenFlowZeroOptimizer_Stage3, PR #7516)
    auto_windows: str | None = None
    zero_stage: int = 2

    def config_keys(self) -> dict:
        """The `zero_optimization.zenflow` keys of this section (the engine's config takes
        these; `auto_windows` and `zero_stage` are not zenflow keys)."""
        keys = {k: getattr(self, k) for k in ENGINE_ZENFLOW_KEYS}
        if self.pt_reserved_cores_perc is not None:
            keys["pt_reserved_cores_perc"] = self.pt_reserved_cores_perc
        return keys


ENGINE_ZENFLOW_KEYS = ("topk_ratio", "update_interval", "select_interval", "overlap_step",
                       "full_warm_up_rounds", "offload")


@dataclass(frozen=True)
class Scenario:
    """One run's model, batch, precision and ZenFlow knobs (see the module docstring)."""
    model: str  # a named shape (zfbench.core.models)
    layers: int | None  # a depth slice at full width; None: every layer
    micro_batch: int  # rows per rank and micro-step
    seq: int  # tokens per row
    grad_accum: int  # micro-steps per optimizer step
    # "fp32" | "bf16" | "fp16" on the device (the host keeps fp32 master and moments);
    # None: not fixed (a config's, else measured on the machine at hand)
    precision: str | None
    zenflow: ZenFlowScenario = field(default_factory=ZenFlowScenario)

    def flat(self) -> dict:
        """Every field under the flat name SimSettings gives it (the ZenFlow knobs at the
        top level)."""
        top = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "zenflow"}
        return {**top, **asdict(self.zenflow)}

    @classmethod
    def from_flat(cls, knobs: dict, base: "Scenario") -> "Scenario":
        """`base` with the scenario's fields found in `knobs` (flat names, as `flat`);
        the other keys of `knobs` are ignored."""
        zf = {k: knobs[k] for k in ZENFLOW_FIELDS if k in knobs}
        top = {k: knobs[k] for k in SCENARIO_FIELDS if k in knobs}
        return replace(base, **top, zenflow=replace(base.zenflow, **zf))


SCENARIO_FIELDS = tuple(f.name for f in fields(Scenario) if f.name != "zenflow")
ZENFLOW_FIELDS = tuple(f.name for f in fields(ZenFlowScenario))

GPU_NODE = Scenario(model="llama2-7b", layers=None, micro_batch=1, seq=1024, grad_accum=1,
                    precision="bf16")
CPU_LANES = Scenario(model="tinyllama-1.1b", layers=1, micro_batch=1, seq=4, grad_accum=1,
                     precision=None)
NAMED = {"gpu-node": GPU_NODE, "cpu-lanes": CPU_LANES}


def zenflow_scenario(zf: ZenFlowConfig, steps_per_epoch: int | None = None
                     ) -> ZenFlowScenario:
    """The ZenFlow knobs an engine config's section fixes, as the engine runs them: the
    select interval resolved as real/zenflow.py resolves it
    (`ZenFlowConfig.select_interval_steps`; an unsized stream, None, selects once on
    "auto")."""
    return ZenFlowScenario(topk_ratio=zf.topk_ratio, update_interval=zf.update_interval,
                           select_interval=zf.select_interval_steps(steps_per_epoch),
                           overlap_step=zf.overlap_step,
                           full_warm_up_rounds=zf.full_warm_up_rounds, offload=zf.offload)
