"""One measured training run: build the model and data, run N steps of one strategy.

`train(spec, strategy)` is what `python -m zfbench.run` calls once per strategy: it builds
the model from its named shape (or takes a module), streams seeded synthetic batches or
byte-level text, drives `engine(batch)` / `backward` / `step` with a progress bar
(steps/s and the stall fraction so far), and returns the engine's timeline and per-step
log. Nothing here knows about the simulator or the analysis (docs/design.md's arrows).

`--steps` counts optimizer steps: with gradient accumulation each is `grad_accum`
micro-batches (forward, backward, `step()`), and the loss logged for it is their mean.
`RunSpec` resolves a DeepSpeed config (dict or file) once: its batch and accumulation are
the file's unless given here, as CLI flags are.

With a `DistContext` of several ranks (`dist=`), every rank draws the same global batch of
`micro_batch * world` rows from the seeded stream and trains on its own `micro_batch`
rows, so N ranks see exactly the data one rank would see with the whole global batch; the
result then also holds every rank's spans (`timeline`), gathered at the end.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch
from zfbench.core.progress import progress as progress_bar
from zfbench.core.strategies import has_windows

from zfbench.real.data import made_ahead, synthetic_batches, text_batches
from zfbench.real.distributed import DistContext, gather_timeline
from zfbench.real.engine import Engine, initialize
from zfbench.real.flat import device_dtype
from zfbench.real.model import build_model
from zfbench.core.config import AutoValues, EngineConfig, load_config, read_config
from zfbench.core.config_build import build_config
# zfbench's ZenFlow scenario, used when a run asks for the zenflow strategy and the
# config has no zero_optimization.zenflow section (announced in the config's notes)
from zfbench.core.config_zenflow import SCENARIO_ZENFLOW
from zfbench.core.models import ModelShape, get_model
# the run's model, batch, precision and ZenFlow knobs; CPU_LANES: the default run's
from zfbench.core.scenario import CPU_LANES, Scenario, zenflow_scenario

# The config of a run given none: the strategy is set per run (a load_config override).
DEFAULT_LR = 1e-4
DEFAULT_WEIGHT_DECAY = 0.01


@dataclass
class RunSpec:
    """What one measured run trains. `micro_batch` and `grad_accum` None: the config's (1 when
    there is no config); a value given here overrides the config's, as a CLI flag does.
    Its model, batch, precision and ZenFlow knobs are a `zfbench.core.scenario.Scenario`
    (`scenario`, `from_scenario`), by default the CPU lanes' (`CPU_LANES`)."""
    model: str = CPU_LANES.model
    layers: int | None = CPU_LANES.layers
    micro_batch: int | None = None  # rows per rank and micro-step
    seq: int = CPU_LANES.seq
    steps: int = 30  # optimizer steps (each of grad_accum micro-steps)
    seed: int = 0
    device: str = "auto"
    device_threads: int | None = None
    host_threads: int | None = None
    text: str | None = None  # a path, or "builtin" for the standard library's text
    config: dict | str | None = None  # DeepSpeed-style config (dict or JSON path)
    # "fp32" | "bf16" | "fp16"; None: the config's (fp32; python -m zfbench.run measures
    # it when there is no config)
    precision: str | None = CPU_LANES.precision
    overrides: dict = field(default_factory=dict)
    # ZenFlow knobs (zero_optimization.zenflow keys) for the zenflow strategy only, over
    # the config's section or, without one, over zfbench's scenario (SCENARIO_ZENFLOW)
    zenflow: dict = field(default_factory=dict)
    grad_accum: int | None = None
    world: int = 1  # ranks: the batch rule train = micro x accum x world needs it

    def __post_init__(self) -> None:
        if self.micro_batch is None or self.grad_accum is None:
            cfg = self._load(None, world=self.world, flags=False)
            self.micro_batch = cfg.micro_batch if self.micro_batch is None else \
                self.micro_batch
            self.grad_accum = cfg.grad_accum if self.grad_accum is None else \
                self.grad_accum

    @classmethod
    def from_scenario(cls, scenario: Scenario, **rest) -> "RunSpec":
        """The RunSpec that trains `scenario` (its ZenFlow knobs over the config's section,
        the select interval in steps); `rest` gives the other fields (steps, device,
        config, ...; `zenflow` keys further knobs)."""
        zenflow = {**scenario.zenflow.config_keys(), "select_strategy": "step",
                   **rest.pop("zenflow", {})}
        return cls(model=scenario.model, layers=scenario.layers,
                   micro_batch=scenario.micro_batch,
                   seq=scenario.seq, grad_accum=scenario.grad_accum,
                   precision=scenario.precision, zenflow=zenflow, **rest)

    @property
    def scenario(self) -> Scenario:
        """The run's Scenario: model, layers, batch, seq and accumulation (the config's
        where not given), the precision as given (None: the config's, or measured by the
        run), and the ZenFlow knobs the zenflow strategy runs (`engine_config`)."""
        zf = zenflow_scenario(self.engine_config("zenflow").zenflow)
        return Scenario(model=self.model, layers=self.layers, micro_batch=self.micro_batch,
                        seq=self.seq, grad_accum=self.grad_accum, precision=self.precision,
                        zenflow=zf)

    def shape(self) -> ModelShape:
        shape = get_model(self.model)
        return shape.with_layers(self.layers) if self.layers is not None else shape

    def _load(self, strategy: str | None, world: int, flags: bool = True) -> EngineConfig:
        base = self.config if self.config is not None else build_config(
            None, lr=DEFAULT_LR, weight_decay=DEFAULT_WEIGHT_DECAY, pin_memory=True)
        raw = read_config(base)
        over = dict(self.overrides)
        if flags:
            over.setdefault("micro_batch", self.micro_batch)
            over.setdefault("grad_accum", self.grad_accum)
        if self.precision is not None:
            over.setdefault("precision", self.precision)
        if strategy is not None:
            over.setdefault("strategy", strategy)
        scenario = has_windows(strategy) and not _has_zenflow(raw) and \
            not any(k in over for k in SCENARIO_ZENFLOW)
        if scenario:
            over.update(SCENARIO_ZENFLOW)
        if has_windows(strategy):
            over.update(self.zenflow)
        auto = AutoValues(micro_batch=self.micro_batch or 1, grad_accum=self.grad_accum or 1,
                          precision=self.precision or "fp32", steps=self.steps)
        cfg = load_config(raw, world_size=world, auto=auto, **over)
        if self.config is None and self._on_cuda():
            # zfbench's own defaults on a GPU: gradients go down during backward, in
            # DeepSpeed's buckets (on the CPU lanes the copies would only share the
            # thread), into page-locked host buffers (pageable ones make every copy
            # synchronous: DeepSpeed's configs for offload set pin_memory true)
            cfg = dataclasses.replace(cfg, overlap_comm=True, pin_memory=True)
        elif self._on_cuda() and cfg.offload_device == "cpu" and not cfg.pin_memory:
            cfg = dataclasses.replace(cfg, notes=cfg.notes + (
                "zero_optimization.offload_optimizer.pin_memory: false, so the host "
                "buffers are pageable and every copy to or from them is synchronous (no "
                "overlap with compute); set it true",))
        if scenario and self.config is not None:  # without a config it is the default
            said = ", ".join(f"{k} {v}" for k, v in SCENARIO_ZENFLOW.items())
            cfg = dataclasses.replace(cfg, notes=cfg.notes + (
                f"zero_optimization.zenflow: absent from the config; the zenflow "
                f"strategy runs zfbench's scenario ({said})",))
        return cfg

    def _on_cuda(self) -> bool:
        return self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available())

    def engine_config(self, strategy: str, world: int | None = None) -> EngineConfig:
        """The effective config of one strategy: the file, then the values given here."""
        return self._load(strategy, self.world if world is None else world)


def _has_zenflow(config: dict) -> bool:
    zero = config.get("zero_optimization", {})
    return isinstance(zero, dict) and "zenflow" in zero


@dataclass
class RunResult:
    strategy: str
    engine: Engine
    losses: list[float]
    wall_s: float
    all_ranks: object = None  # Timeline of every rank (multi-rank runs)

    @property
    def timeline(self):
        return self.all_ranks if self.all_ranks is not None else self.engine.timeline


def batches(spec: RunSpec, vocab: int, rank: int = 0, world: int = 1):
    rows = spec.micro_batch * world
    if spec.text is None:
        stream = synthetic_batches(vocab, rows, spec.seq, seed=spec.seed)
    else:
        from zfbench.real.data import default_text

        source = default_text() if spec.text == "builtin" else spec.text
        stream = text_batches(source, rows, spec.seq, seed=spec.seed, vocab=vocab)
    if world == 1:
        return stream
    mine = slice(rank * spec.micro_batch, (rank + 1) * spec.micro_batch)
    return ({k: v[mine] for k, v in batch.items()} for batch in stream)


def train(spec: RunSpec, strategy: str, model: torch.nn.Module | None = None,
          progress: bool = True, dist: DistContext | None = None,
          hazard_check: bool = False, config: EngineConfig | None = None) -> RunResult:
    """Train `strategy` on `spec`; `config`: its engine config where the caller has
    resolved it already (`spec.engine_config(strategy, world)`)."""
    shape = spec.shape()
    if config is None:
        config = spec.engine_config(strategy, world=dist.world if dist is not None else 1)
    torch.manual_seed(spec.seed)
    if model is None:
        model = build_model(shape, dtype=device_dtype(config.precision), seed=spec.seed)
    engine = initialize(model, config, device=spec.device, dist=dist,
                        device_threads=spec.device_threads, host_threads=spec.host_threads,
                        hazard_check=hazard_check)
    world = engine.dist.world
    # made before the clock starts: the toy data's Python never sits between two steps
    data = made_ahead(batches(spec, shape.vocab, engine.dist.rank, world),
                      spec.steps * config.grad_accum)
    losses: list[float] = []
    bar = progress_bar(total=spec.steps, desc=f"{strategy:>16}", unit="step",
                       quiet=not progress, leave=True)
    started = time.perf_counter()
    stall = "-"
    try:
        for _ in range(spec.steps):
            micro_losses = []
            for _ in range(config.grad_accum):  # the last micro-step updates
                batch = next(data)
                ids = batch["input_ids"].to(engine.device)
                labels = batch["labels"].to(engine.device)
                loss = engine(ids, labels)
                engine.backward(loss)
                engine.step()
                micro_losses.append(float(loss.detach()))
            losses.append(sum(micro_losses) / len(micro_losses))
            if bar.n % 5 == 4:  # the compute sum walks every span: every 5th step only,
                # and the stall shown is from that moment (a stale sum against a later wall
                # time would show stall that is not there)
                compute_s = sum(s.duration_s for s in engine.timeline.spans
                                if s.lane == "compute")
                stall = f"{max(0.0, 1 - compute_s / (time.perf_counter() - started)):.0%}"
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.3f}", stall=stall)
        engine.finish()
    finally:
        bar.close()
        engine.close()
    wall = time.perf_counter() - started
    merged = gather_timeline(engine.dist, engine.timeline) if world > 1 else None
    engine.release()  # strategies run one after another: only one holds memory at a time
    return RunResult(strategy, engine, losses, wall, merged)
