"""The plan of one `python -m zfbench.run`: everything decided before the first step.

`plan(args, argv)` resolves the flags (the --config file first, then only the flags
given: argparse's None for a flag not given), then decides on this machine, in order:
the memory check and, where the named model cannot fit, the proxy slice
(zfbench.run.proxy); the GPU-sized run on CUDA with no shape flag (zfbench.run.defaults);
the default scenario's sizing or the precision probe (zfbench.run.probe). The result is a
`RunPlan`: the run's settings (`spec`, its Scenario included), the machine and what the
probes measured, each strategy's `EngineConfig`, the output options, and every decision
with its reason. It is frozen and serialisable (`to_json`/`from_json`): written to
OUT/plan.json, and the whole hand-off to the ranks a multi-rank run launches (`--plan
PATH`). Executing it (zfbench.run.execute) and reporting it (zfbench.run.report) decide
nothing more; the memory checks and the projections read top-k from its configs.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from zfbench.cli_checks import (check_input_file, check_out_dir, positive_int,
                                zenflow_flags, zenflow_given)
from zfbench.core.config import STRATEGIES, ConfigError, EngineConfig
from zfbench.core.strategies import SIMULATED_ONLY
from zfbench.core.trace import write_json_atomic
from zfbench.real.distributed import env_world
from zfbench.real.memory import InsufficientMemoryError, check_configs_fit
from zfbench.real.runner import RunSpec
from zfbench.run.defaults import DEFAULT_SEQ, PLAN_FILE, RESULTS_DIR, gpu_sized  # noqa: F401
from zfbench.run.probe import (decide_precision, describe_scenario, is_default_scenario,
                               shape_given, size_default)


@dataclass(frozen=True)
class RunPlan:
    """What one run does, decided before its first step (module docstring). `reasons`:
    why the shape, precision and proxy are what they are ("sizing", "precision",
    "proxy"), in words."""

    command_line: tuple[str, ...]  # the flags as given (summary.json's provenance)
    spec: RunSpec  # model, shape, batch, precision, steps, lanes, config: the Scenario
    strategies: tuple[str, ...]
    configs: dict[str, EngineConfig]  # each strategy's, resolved for `world` ranks
    world: int
    use_cuda: bool
    out: Path | None = None
    quiet: bool = False
    profile: bool = False
    project: bool = False
    bind_cores: bool = False
    precision_probe: dict | None = None  # zfbench.run.probe.decide_precision's
    scenario_probe: dict | None = None  # zfbench.run.probe.size_default's
    proxy: dict | None = None  # zfbench.run.proxy.proxy_record, with the host rates
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def scenario(self):
        """The run's `zfbench.core.scenario.Scenario`."""
        return self.spec.scenario

    def to_json(self) -> str:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.update(command_line=list(self.command_line), strategies=list(self.strategies),
                 spec=dataclasses.asdict(self.spec),
                 configs={s: {**c.as_dict(), "raw": c.raw} for s, c in self.configs.items()},
                 out=None if self.out is None else str(self.out))
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "RunPlan":
        d = json.loads(text)
        configs = {}
        for s, c in d["configs"].items():
            raw = c.pop("raw")
            configs[s] = EngineConfig.from_dict(c, raw)
        return cls(**{**d, "command_line": tuple(d["command_line"]),
                      "strategies": tuple(d["strategies"]), "spec": RunSpec(**d["spec"]),
                      "configs": configs,
                      "out": None if d["out"] is None else Path(d["out"])})

    def write(self, path: Path) -> Path:
        write_json_atomic(path, json.loads(self.to_json()))
        return path

    @classmethod
    def read(cls, path: str | Path) -> "RunPlan":
        check_input_file(path, "--plan")
        try:
            return cls.from_json(Path(path).read_text())
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"--plan {path}: not a plan written by python -m zfbench.run "
                             f"({type(err).__name__}: {err})") from None


def resolve_world(args) -> tuple[int, bool]:
    """(ranks, launched): the world size, and whether this process is one launched rank."""
    found = env_world()
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    if found is None:
        return (args.gpus or 1), False
    if args.gpus is not None and args.gpus != found[1]:
        raise ValueError(f"--gpus {args.gpus} contradicts the launcher's WORLD_SIZE "
                         f"{found[1]}; leave --gpus out under torchrun")
    return found[1], True


def check_gpu_count(world: int, use_cuda: bool) -> None:
    import torch

    if use_cuda and world > torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise ValueError(f"--gpus {world} asks for {world} ranks with a GPU each, but "
                         f"torch sees only {n} CUDA device{'s' if n != 1 else ''}; use "
                         f"--gpus {n} or fewer, or --device cpu (gloo, emulated)")


def engine_on_cuda(spec: RunSpec) -> bool:
    from zfbench.real.engine import resolve_device

    return resolve_device(spec.device).type == "cuda"


def spec_from_args(args, world: int = 1, strategies=STRATEGIES) -> RunSpec:
    """The run's settings: the --config file first, then only the flags given."""
    return spec_and_configs(args, world, strategies)[0]


def spec_and_configs(args, world: int = 1, strategies=STRATEGIES
                     ) -> tuple[RunSpec, dict[str, EngineConfig]]:
    """`spec_from_args`, and every strategy's engine config, resolved once (each is valid
    before anything runs; a ConfigError names the flags given)."""
    for name in ("steps", "batch", "seq", "grad_accum", "layers", "device_threads",
                 "host_threads"):
        if getattr(args, name) is not None:
            positive_int("--" + name.replace("_", "-"), getattr(args, name))
    model = RunSpec.model if args.model is None else args.model
    layers = args.layers
    if layers is None and model == RunSpec.model:
        layers = RunSpec.layers
    config = args.config
    if config is not None:
        check_input_file(config, "--config")
    if args.text not in (None, "builtin"):
        check_input_file(args.text, "--text")
    check_out_dir(args.out)
    if args.out is None:
        check_out_dir(RESULTS_DIR, f"the results directory (no --out: {RESULTS_DIR})")
    if (args.profile or args.project) and args.out is None:
        check_out_dir(Path("runs/profile"), "--profile (no --out: runs/profile)")
    spec = RunSpec(model=model, layers=layers, micro_batch=args.batch,
                   seq=DEFAULT_SEQ if args.seq is None else args.seq,
                   steps=RunSpec.steps if args.steps is None else args.steps,
                   seed=args.seed, device=args.device,
                   device_threads=args.device_threads, host_threads=args.host_threads,
                   text=args.text, config=config, grad_accum=args.grad_accum, world=world,
                   precision=args.precision,  # None: the file's, else measured
                   zenflow=zenflow_given(args))
    try:
        return spec, engine_configs(spec, strategies, world)
    except ConfigError as err:
        given = [f for f, v in (("--batch", args.batch), ("--grad-accum",
                                args.grad_accum), ("--gpus", args.gpus)) if v]
        given += [zenflow_flags(k)[0] for k in spec.zenflow]
        hint = f" ({' and '.join(given)} given on the command line)" if given else ""
        raise ConfigError(err.key, str(err).split(": ", 1)[1] + hint) from None


def engine_configs(spec: RunSpec, strategies, world: int) -> dict[str, EngineConfig]:
    """Each strategy's effective engine config for `spec` on `world` ranks."""
    return {s: spec.engine_config(s, world) for s in strategies}


def requested_strategies(args) -> list[str]:
    """The strategies --strategy asks for; one the engine does not implement is refused,
    naming the simulator."""
    if args.strategy in SIMULATED_ONLY:
        raise ValueError(f"the engine does not implement {args.strategy} (ZeRO-3 with "
                         f"offloaded parameters); simulate it: python -m zfbench.simulate "
                         f"--strategy {args.strategy}")
    return list(STRATEGIES) if args.strategy == "all" else [args.strategy]


def fit_or_proxy(args, spec: RunSpec, configs: dict, use_cuda: bool, launched: bool
                 ) -> tuple[RunSpec, dict | None]:
    """(the run's spec, None) where it fits this machine; where a named model does not,
    (the proxy slice's spec, its record: zfbench.run.proxy). A slice the user chose, or
    ranks torchrun started, are refused (InsufficientMemoryError, naming what fits)."""
    try:
        check_configs_fit(spec.shape(), configs, spec.seq, use_cuda)
        return spec, None
    except InsufficientMemoryError as err:
        if args.layers is not None or "[" in spec.model or launched:
            raise
        from zfbench.run.proxy import proxy_spec

        return proxy_spec(spec, configs, use_cuda, err, args.steps is not None)


def size_and_precision(args, spec: RunSpec, strategies: list[str], use_cuda: bool,
                       launched: bool, proxy: dict | None) -> tuple[RunSpec, dict]:
    """The shape and precision decided on this machine where the flags leave them open:
    (the spec, {"scenario_probe", "precision_probe", "reasons", "measured_precision"})."""
    world = spec.world
    decided = {"scenario_probe": None, "precision_probe": None, "reasons": {},
               "measured_precision": False}
    why = decided["reasons"]
    if use_cuda and not shape_given(args):  # a GPU-sized run, not the CPU lanes' slice
        spec = gpu_sized(spec, strategies, world, args.quiet)
        why["sizing"] = why["precision"] = (
            f"GPU-sized default (no shape flag on CUDA): {spec.model}, batch "
            f"{spec.micro_batch} x seq {spec.seq}, {spec.precision}")
    if proxy is None and is_default_scenario(args, use_cuda, world):  # sized here
        scenario = size_default(spec, quiet=args.quiet)
        spec = replace(spec, seq=scenario["seq"], precision=scenario["precision"])
        decided.update(scenario_probe=scenario, measured_precision=True, precision_probe={
            k: scenario[k] for k in ("precision", "ratio")})
        why["sizing"] = why["precision"] = describe_scenario(scenario)
    elif spec.precision is None and spec.config is None:  # the default: measure it
        probe = decide_precision(spec, spec.shape(), use_cuda, world, launched,
                                 quiet=args.quiet)
        spec = replace(spec, precision=probe["precision"])
        decided.update(precision_probe=probe, measured_precision=True)
        why["precision"] = probe["rule"]
    return spec, decided


def plan(args, argv: list[str]) -> RunPlan:
    """Decide the run `args` (parsed from `argv`) asks for on this machine (module
    docstring); raises ValueError, ConfigError, InsufficientMemoryError ... with the
    one-line reason."""
    strategies = requested_strategies(args)
    world, launched = resolve_world(args)
    spec, configs = spec_and_configs(args, world, strategies)
    use_cuda = engine_on_cuda(spec)
    check_gpu_count(world, use_cuda)
    if world > 1 and (args.project or (args.profile and use_cuda)):
        raise ValueError("--project (and --profile with CUDA) measure one rank; run "
                         "them without --gpus" if args.project else
                         "--profile with CUDA measures one rank (a GPU of its own); "
                         "run it without --gpus")
    spec, proxy = fit_or_proxy(args, spec, configs, use_cuda, launched)
    reasons = {"sizing": "the shape the flags give", "proxy": "none: the run fits"}
    if proxy is not None:
        configs = engine_configs(spec, strategies, world)
        reasons["proxy"] = reasons["sizing"] = (
            f"{proxy['model']} does not fit ({proxy['why']}): the proxy {proxy['measured']}"
            f" is measured, bound by {proxy['bound_by']}")
    spec, decided = size_and_precision(args, spec, strategies, use_cuda, launched, proxy)
    reasons.update(decided["reasons"])
    configs = engine_configs(spec, strategies, world)
    reasons.setdefault("precision", f"--precision {args.precision}" if args.precision
                       else f"the --config file's ({configs[strategies[0]].precision})")
    if decided["measured_precision"] and args.precision is None:
        check_configs_fit(spec.shape(), configs, spec.seq, use_cuda)  # as decided
    if proxy is not None and not launched:  # the rates in the run's precision
        from zfbench.run.proxy import measure_host_rates

        proxy = {**proxy, **measure_host_rates(spec.shape().total_params,
                                               configs[strategies[0]].precision,
                                               proxy["threads"])}
    return RunPlan(command_line=tuple(argv), spec=spec, strategies=tuple(strategies),
                   configs=configs, world=world, use_cuda=use_cuda, out=args.out,
                   quiet=args.quiet, profile=args.profile, project=args.project,
                   bind_cores=args.bind_cores, precision_probe=decided["precision_probe"],
                   scenario_probe=decided["scenario_probe"], proxy=proxy, reasons=reasons)
