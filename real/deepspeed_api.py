"""DeepSpeed's front door: `initialize` with DeepSpeed 0.19.5's arguments, and its helpers.

Owns `initialize`, `add_config_arguments` and `init_distributed`, so that a script written
for DeepSpeed runs with `import zfbench.real as deepspeed` in place of `import deepspeed`.

The rule for the first positional argument (DeepSpeed's is `args`): when it is a
`torch.nn.Module` the call is zfbench's short form `initialize(model, config)`, which
returns the engine alone (zfbench's own code uses it) and takes no other DeepSpeed
argument; every other call is DeepSpeed's, positional arguments in DeepSpeed's order
`(args, model, optimizer, model_parameters, training_data, lr_scheduler, ...)`, and returns
`(engine, optimizer, training_dataloader, lr_scheduler)`. What each argument does, and
what is refused, is in `initialize`'s docstring and docs/commands.md ("From a DeepSpeed
script").
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from zfbench.core.config import ConfigError, EngineConfig, load_config, read_config
from zfbench.real.distributed import env_world, from_process_group, init_from_env, \
    join_launch
from zfbench.real.engine import Engine, initialize as initialize_engine, resolve_device

DEFAULT_PORT = 29500  # DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT
HYPER = ("lr", "betas", "eps", "weight_decay")


class InitializeError(ValueError):
    """An argument of `initialize` zfbench cannot honour; the message names it and why."""

    def __init__(self, argument: str, why: str):
        super().__init__(f"initialize: {argument}: {why}")
        self.argument = argument


class EngineDataLoader(DataLoader):
    """The loader `initialize` builds over training_data (DeepSpeed names its sampler
    `data_sampler`: call `loader.data_sampler.set_epoch(epoch)` to reshuffle)."""

    @property
    def data_sampler(self):
        return self.sampler


def initialize(args=None, model=None, optimizer=None, model_parameters=None,
               training_data=None, lr_scheduler=None, distributed_port=DEFAULT_PORT,
               mpu=None, dist_init_required=None, collate_fn=None, config=None,
               mesh_param=None, config_params=None, *, dist=None, **engine_kwargs):
    """DeepSpeed's `initialize` (the first argument's rule: module docstring); `dist` and
    `engine_kwargs` (device, device_threads, host_threads, ...) are zfbench's own, keyword
    only.

    What each argument does here (docs/commands.md, "From a DeepSpeed script"):
    - `config` (dict or JSON path), or `args.deepspeed_config`, or the old `config_params`;
      exactly one of them, as DeepSpeed requires;
    - `optimizer`: None (the config's `optimizer` section), or a fresh `torch.optim.AdamW` /
      `torch.optim.Adam` (or a callable that builds one from the parameters): its
      hyper-parameters become the engine's AdamW, offloaded as the config says. Any other
      optimizer, one that already stepped, AMSGrad, `maximize`, Adam's coupled L2 decay, or
      parameter groups that differ are refused: zfbench runs its own AdamW on the device and
      the host, one set of hyper-parameters over the flat buffer;
    - `model_parameters`: must be the model's trainable parameters (param-group dicts may set
      lr, betas, eps, weight_decay, the same in every group);
    - `training_data` (+ `collate_fn`): a DataLoader with a DistributedSampler over the ranks
      (DeepSpeed's default: shuffled, seed 0) and the micro-batch;
      `dataloader_drop_last` from the config;
    - `lr_scheduler`: a callable `optimizer -> scheduler` (torch's or any with `step()`),
      given the engine's optimizer; a scheduler object built on another optimizer is refused
      (it would move an lr the engine never reads), and so is one beside a config `scheduler`;
    - `dist_init_required`: None / True join (or create) torchrun's group; False uses the
      group the script made, and is refused under a launch of several ranks without one;
    - `distributed_port`: DeepSpeed uses it only for MPI discovery outside a launcher;
      refused there (zfbench does none), accepted under torchrun, which set MASTER_PORT;
    - `mpu` (model parallelism) and `mesh_param` (sequence / tensor-parallel meshes): refused.
    """
    if isinstance(args, nn.Module):
        given = {k: v for k, v in dict(
            optimizer=optimizer, model_parameters=model_parameters,
            training_data=training_data, lr_scheduler=lr_scheduler, mpu=mpu,
            dist_init_required=dist_init_required, collate_fn=collate_fn,
            mesh_param=mesh_param, config_params=config_params).items() if v is not None}
        if isinstance(model, nn.Module) or (model is not None and config is not None) or \
                given or distributed_port != DEFAULT_PORT:
            raise TypeError("initialize(model, config) is zfbench's short form and takes no "
                            "other DeepSpeed argument; call initialize(model=model, "
                            "config=config, ...) for DeepSpeed's form")
        return initialize_engine(args, model if model is not None else config, dist=dist,
                                 **engine_kwargs)
    if not isinstance(model, nn.Module):
        raise InitializeError("model", f"got {type(model).__name__}; pass model= a "
                              f"torch.nn.Module")
    config = _one_config(args, config, config_params)
    for name, value, why in (
            ("mpu", mpu, "model parallelism is not implemented; zfbench runs data "
                         "parallel only"),
            ("mesh_param", mesh_param, "sequence and tensor-parallel meshes are not "
                                       "implemented; zfbench runs data parallel only")):
        if value is not None:
            raise InitializeError(name, f"{why}: remove it")
    if dist is None:
        dist = _join(dist_init_required, distributed_port, engine_kwargs)
    cfg = config if isinstance(config, EngineConfig) else load_config(config,
                                                                     world_size=dist.world)
    cfg = _with_optimizer(cfg, model, optimizer, model_parameters)
    if lr_scheduler is not None and cfg.scheduler is not None:
        raise InitializeError("lr_scheduler", "given beside the config's 'scheduler' "
                              "section; DeepSpeed would keep only one of them: remove one")
    if collate_fn is not None and training_data is None:
        raise InitializeError("collate_fn", "it only serves the loader built over "
                              "training_data: pass training_data too, or drop it")
    if lr_scheduler is not None and not callable(lr_scheduler):
        raise InitializeError("lr_scheduler", f"a {type(lr_scheduler).__name__} object "
                              f"moves the lr of the optimizer it was built on, which "
                              f"zfbench's engine does not read; pass a callable instead, "
                              f"lr_scheduler=lambda opt: {type(lr_scheduler).__name__}"
                              f"(opt, ...) (DeepSpeed accepts one too)")
    engine = Engine(model, cfg, dist=dist, **engine_kwargs)
    if lr_scheduler is not None:
        engine.lr_scheduler = lr_scheduler(engine.optimizer)
        if not callable(getattr(engine.lr_scheduler, "step", None)):
            raise InitializeError("lr_scheduler", "the callable must return a scheduler "
                                  "with a step() method")
        engine.lr = engine.optimizer.lr
    loader = None
    if training_data is not None:
        loader = _loader(engine, training_data, collate_fn)
        engine.training_dataloader = loader
    return engine, engine.optimizer, loader, engine.lr_scheduler


def _one_config(args, config, config_params):
    """The config from `config`, `config_params` or `args.deepspeed_config`: exactly one."""
    sources = {"config": config, "config_params": config_params}
    for attr in ("deepspeed_config", "deepscale_config"):
        if getattr(args, attr, None) is not None:
            sources[f"args.{attr}"] = getattr(args, attr)
    given = {k: v for k, v in sources.items() if v is not None}
    if not given:
        raise InitializeError("config", "none given; pass config= (a dict or a JSON path) "
                              "or args.deepspeed_config, as DeepSpeed requires")
    if len(given) > 1:
        raise InitializeError("config", f"given as {' and '.join(given)}; give exactly one")
    value = next(iter(given.values()))
    return value if isinstance(value, EngineConfig) else read_config(value)


def _join(required, port, engine_kwargs):
    """The data-parallel context: torchrun's group, the script's, or one rank."""
    launched = env_world()
    if port != DEFAULT_PORT and launched is None:
        raise InitializeError("distributed_port", f"{port}: DeepSpeed uses it for MPI "
                              f"discovery outside a launcher, which zfbench does not do; "
                              f"launch with torchrun (--master-port) or drop it")
    cuda = resolve_device(engine_kwargs.get("device", "auto")).type == "cuda"
    if required is False:
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        if not initialized and launched is not None and launched[1] > 1:
            raise InitializeError("dist_init_required", f"False, but torch.distributed is "
                                  f"not initialized in a launch of {launched[1]} ranks: "
                                  f"call init_process_group first or leave it None")
        return from_process_group()
    return join_launch(cuda)


def _params_from(groups, argument: str) -> tuple[list, dict]:
    """(parameters, hyper-parameters shared by every group) of param groups or tensors."""
    groups = list(groups)
    if groups and not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    params, shared = [], {}
    for group in groups:
        extra = set(group) - {"params", *HYPER}
        if extra:
            raise InitializeError(argument, f"param-group keys {sorted(extra)} "
                                  f"are not supported; zfbench's AdamW takes {list(HYPER)}")
        p = group["params"]
        params += [p] if isinstance(p, torch.Tensor) else list(p)
        for key in HYPER:
            if key in group:
                value = tuple(group[key]) if key == "betas" else group[key]
                if shared.setdefault(key, value) != value:
                    raise InitializeError(argument, f"param groups with different "
                                          f"{key} ({shared[key]} and {value}); zfbench "
                                          f"applies one AdamW setting to the whole flat "
                                          f"buffer: give every group the same")
    return params, shared


def _check_covers(params, model, argument: str) -> None:
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    given = {id(p) for p in params if p.requires_grad}
    if given != trainable:
        raise InitializeError(argument, f"holds {len(given & trainable)} of the model's "
                              f"{len(trainable)} trainable parameters (and {len(given - trainable)}"
                              f" others); zfbench trains every parameter that requires grad: "
                              f"freeze the rest with requires_grad_(False)")


def _with_optimizer(cfg: EngineConfig, model, optimizer, model_parameters) -> EngineConfig:
    """`cfg` with the AdamW hyper-parameters a script's optimizer or param groups set."""
    if optimizer is not None and callable(optimizer) and \
            not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer(model_parameters if model_parameters is not None
                              else model.parameters())
    if optimizer is None:
        if model_parameters is None:
            return cfg
        params, shared = _params_from(model_parameters, "model_parameters")
        _check_covers(params, model, "model_parameters")
        return _replace_opt(cfg, **shared)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InitializeError("optimizer", f"got {type(optimizer).__name__}; expected a "
                              f"torch.optim.AdamW or Adam, or a callable building one")
    if "optimizer" in cfg.raw:
        raise InitializeError("optimizer", "given beside the config's 'optimizer' section; "
                              "DeepSpeed refuses both too: remove one")
    kind = type(optimizer)
    if kind not in (torch.optim.AdamW, torch.optim.Adam):
        raise InitializeError("optimizer", f"a {kind.__name__} cannot be offloaded: zfbench "
                              f"runs its own AdamW on the device and the host; use "
                              f"torch.optim.AdamW or the config's optimizer section")
    if optimizer.state:
        raise InitializeError("optimizer", "it has stepped already; zfbench starts AdamW "
                              "from zero moments: pass a fresh one (resume with "
                              "engine.load_checkpoint)")
    groups = [{k: g[k] for k in ("params", *HYPER)} for g in optimizer.param_groups]
    for group in optimizer.param_groups:
        for flag in ("amsgrad", "maximize"):
            if group.get(flag):
                raise InitializeError("optimizer", f"{flag}=True is not implemented by "
                                      f"zfbench's AdamW; leave it False")
        if kind is torch.optim.Adam and group["weight_decay"] != 0 and \
                not group.get("decoupled_weight_decay", False):
            raise InitializeError("optimizer", "torch.optim.Adam with weight_decay adds L2 "
                                  "to the gradient; zfbench's decay is decoupled (AdamW): "
                                  "use torch.optim.AdamW")
    params, shared = _params_from(groups, "optimizer")
    _check_covers(params, model, "optimizer")
    return _replace_opt(cfg, **shared)


def _replace_opt(cfg: EngineConfig, **hyper) -> EngineConfig:
    if not hyper:
        return cfg
    if "betas" in hyper:
        hyper["betas"] = tuple(float(b) for b in hyper["betas"])
    opt = dataclasses.replace(cfg.optimizer, type="AdamW", adam_w_mode=True, **hyper)
    # the same checks as a config's values (a bad lr is refused, not run)
    try:
        load_config({"optimizer": {"type": "AdamW", "params": {
            k: (list(v) if k == "betas" else v) for k, v in hyper.items()}}})
    except ConfigError as err:
        raise InitializeError("optimizer", str(err)) from None
    return dataclasses.replace(cfg, optimizer=opt)


def _loader(engine, data, collate_fn) -> EngineDataLoader:
    if isinstance(data, torch.utils.data.IterableDataset) or not hasattr(data, "__len__"):
        raise InitializeError("training_data", f"a {type(data).__name__} has no length to "
                              f"split over the ranks; pass a map-style Dataset (or build "
                              f"your own DataLoader)")
    sampler = DistributedSampler(data, num_replicas=engine.dist.world,
                                 rank=engine.dist.rank)
    return EngineDataLoader(data, batch_size=engine.config.micro_batch, sampler=sampler,
                            collate_fn=collate_fn, pin_memory=engine.use_cuda,
                            drop_last=engine.config.dataloader_drop_last)


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """DeepSpeed's command-line flags: --deepspeed, --deepspeed_config (the config file
    `initialize(args=args, ...)` reads), and their old --deepscale spellings."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="enable DeepSpeed (accepted; zfbench's engine is always on)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="DeepSpeed json configuration file")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser


def init_distributed(dist_backend=None, auto_mpi_discovery=True,
                     distributed_port=DEFAULT_PORT, verbose=True, timeout=None,
                     init_method=None, dist_init_required=None, config=None, rank=-1,
                     world_size=-1) -> None:
    """Create the default process group from torchrun's variables, as DeepSpeed's does
    under a launcher (nothing to do when it exists, or outside a launch: one rank)."""
    if init_method is not None or rank != -1 or world_size != -1:
        raise InitializeError("init_distributed", "init_method, rank and world_size are "
                              "not supported; zfbench joins the group torchrun describes "
                              "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
    if dist_init_required is False or torch.distributed.is_initialized():
        return
    if env_world() is None and distributed_port != DEFAULT_PORT:
        raise InitializeError("distributed_port", "zfbench does no MPI discovery; "
                              "launch with torchrun")
    if dist_backend not in (None, "gloo", "nccl"):
        raise InitializeError("dist_backend", f"{dist_backend!r}; expected 'nccl' or "
                              f"'gloo' (or None: nccl with CUDA, gloo without)")
    cuda = torch.cuda.is_available() if dist_backend is None else dist_backend == "nccl"
    kw = {} if timeout is None else {"timeout_s": timeout.total_seconds()}
    init_from_env(cuda, **kw)


__all__ = ["initialize", "add_config_arguments", "init_distributed", "InitializeError",
           "EngineDataLoader"]
