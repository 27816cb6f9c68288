"""The engine's checkpoints: one directory per checkpoint, DeepSpeed's tags and `latest`.

`EngineCheckpoint` is a mixin of `zfbench.real.engine.Engine` and owns:
- `save_state(directory)` / `load_state(directory)`: everything needed to continue exactly
  (parameters, device and host optimizer state, a pending asynchronous update, the fp16
  loss scale, the step counters, the lr schedule and the optimizer's lr) in one file per
  rank, each written via a rename; with several ranks a marker file says that every rank
  finished, and a directory without it is refused. A checkpoint of another strategy, model
  or number of ranks is refused with what to do.
- `save_checkpoint(save_dir, tag=None, client_state={}, save_latest=True, ...)` and
  `load_checkpoint(load_dir, tag=None, ...)`, as DeepSpeed 0.19.5 documents them: a
  checkpoint is the folder `save_dir/<tag>` (default tag `global_step<N>`), the file
  `save_dir/latest` names the last tag saved, `load_checkpoint` with no tag reads it
  (none there: a warning and `(None, None)`, as DeepSpeed returns), and returns
  `(path of this rank's file, client_state)`. The load options zfbench cannot honour
  (loading only the module, or no optimizer state: the host master would have to be
  rebuilt from the weights) are refused with the reason.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from zfbench.real.distributed import barrier

CHECKPOINT_FILE = "zfbench_engine.pt"
COMPLETE_MARKER = "zfbench_engine.complete"  # several ranks: written once all have saved
LATEST = "latest"


def saved_world(directory: Path) -> int | None:
    """How many ranks saved the checkpoint in `directory` (None: no checkpoint there)."""
    if (directory / CHECKPOINT_FILE).exists():
        return 1
    for path in sorted(directory.glob("zfbench_engine.rank*of*.pt")):
        return int(path.stem.rsplit("of", 1)[1])
    return None


def _check_tag(tag) -> str:
    tag = str(tag)
    if not tag or "/" in tag or os.sep in tag or tag in (".", ".."):
        raise ValueError(f"checkpoint tag {tag!r}: a tag names one folder inside save_dir;"
                         f" give a plain name such as 'global_step100'")
    return tag


class EngineCheckpoint:
    """Checkpoints of the engine (module docstring); a mixin of `Engine`."""

    # -- DeepSpeed's API ----------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False) -> bool:
        """Save into `save_dir/<tag>` (DeepSpeed's default tag `global_step<N>`), and name
        the tag in `save_dir/latest` (unless `save_latest` is False). `client_state` (a
        dict) comes back from `load_checkpoint`. Frozen parameters are never saved (they
        are not trained; `exclude_frozen_parameters` makes no difference)."""
        tag = _check_tag(f"global_step{self.global_steps}" if tag is None else tag)
        if client_state is not None and not isinstance(client_state, dict):
            raise TypeError(f"save_checkpoint: client_state must be a dict, not "
                            f"{type(client_state).__name__}")
        self.save_state(Path(save_dir) / tag, client_state=dict(client_state or {}))
        if save_latest and self.dist.rank == 0:
            latest = Path(save_dir) / LATEST
            tmp = latest.with_name(LATEST + ".tmp")
            tmp.write_text(tag)
            os.replace(tmp, latest)
        if self.dist.active:  # no rank returns before `latest` names the new tag
            barrier(self.dist, "save_checkpoint")
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, custom_load_fn=None):
        """Resume from `load_dir/<tag>` (tag None: the one `load_dir/latest` names);
        returns (path of this rank's file, client_state), or (None, None) with a warning
        when there is no `latest`, as DeepSpeed does."""
        refused = {"load_module_strict": (load_module_strict, True,
                                          "zfbench always loads every parameter"),
                   "load_optimizer_states": (load_optimizer_states, True,
                                             "the host master and moments are restored "
                                             "with the weights, never apart"),
                   "load_module_only": (load_module_only, False,
                                        "the host master and moments are restored with "
                                        "the weights, never apart"),
                   "custom_load_fn": (custom_load_fn, None, "zfbench reads its own files")}
        for name, (value, default, why) in refused.items():
            if value != default:
                raise ValueError(f"load_checkpoint: {name}={value!r} is not supported "
                                 f"({why}); leave it at {default!r}")
        if tag is None:
            latest = Path(load_dir) / LATEST
            if not latest.is_file():
                warnings.warn(f"load_checkpoint: no '{LATEST}' file in {load_dir}; nothing "
                              f"loaded (pass tag= to name a checkpoint)", stacklevel=2)
                return None, None
            tag = latest.read_text().strip()
        path, state = self.load_state(Path(load_dir) / _check_tag(tag),
                                      lr_schedule=load_lr_scheduler_states)
        return str(path), state.get("client_state", {})

    # -- one directory, one checkpoint ------------------------------------------------
    @property
    def checkpoint_name(self) -> str:
        if not self.dist.active:
            return CHECKPOINT_FILE
        return f"zfbench_engine.rank{self.dist.rank}of{self.dist.world}.pt"

    def save_state(self, directory: str | os.PathLike, client_state: dict | None = None
                   ) -> Path:
        """Everything needed to continue exactly (module docstring) into `directory`."""
        if self.micro_step != 0:
            raise RuntimeError(f"save_checkpoint after micro-step {self.micro_step} of "
                               f"{self.config.grad_accum}: the accumulated gradient would be "
                               f"lost; save after the step() that ends the accumulation")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        strategy_state = self.strategy.state_dict()  # waits for the host and the uploads
        self.backend.declare_state(strategy_state, self.flat_params, write=False)
        groups = [{k: v for k, v in g.items() if k != "params"}
                  for g in self.optimizer.param_groups]
        state = {"t": self.t, "strategy_name": self.config.strategy,
                 # ZeRO-3: the rank's shard is in the strategy's state ("owned")
                 "flat_params": (self.flat_params if self.zero3 is None
                                 else self.flat_params[:0]).detach().cpu(),
                 "strategy": strategy_state, "config": self.config.raw,
                 "loss_scaler": self.loss_scaler.state_dict() if self.loss_scaler
                 else None,
                 "global_steps": self.global_steps, "skipped_steps": self.skipped_steps,
                 "optimizer_groups": groups,
                 "lr_scheduler": (self.lr_scheduler.state_dict()
                                  if self.lr_scheduler is not None else None),
                 "client_state": client_state or {}}
        path = directory / self.checkpoint_name
        tmp = directory / (self.checkpoint_name + ".tmp")
        marker = directory / COMPLETE_MARKER
        if self.dist.active:  # an older set is being replaced: unmarked before any file
            if self.dist.rank == 0:
                marker.unlink(missing_ok=True)
            barrier(self.dist, "save_checkpoint")
        torch.save(state, tmp)
        os.replace(tmp, path)
        if self.dist.active:  # the set is whole only once every rank's file is in place
            barrier(self.dist, "save_checkpoint")
            if self.dist.rank == 0:
                marker.write_text(f"{self.dist.world} ranks, step {self.t}\n")
        return path

    def load_state(self, directory: str | os.PathLike, lr_schedule: bool = True
                   ) -> tuple[Path, dict]:
        """Continue from `directory` (refused: another strategy, model, number of ranks,
        an incomplete set); `lr_schedule` False keeps this engine's fresh schedule.
        Returns this rank's file and what it held."""
        path = Path(directory) / self.checkpoint_name
        if not path.exists():
            saved = saved_world(Path(directory))
            if saved is not None and saved != self.dist.world:
                raise ValueError(f"checkpoint {directory} was saved by {saved} rank(s); this "
                                 f"engine runs on {self.dist.world}: resume it on {saved} "
                                 f"rank(s) (its host state is sharded {saved} ways)")
            raise FileNotFoundError(f"no zfbench checkpoint at {path}")
        if self.dist.active and not (Path(directory) / COMPLETE_MARKER).exists():
            raise ValueError(f"checkpoint {directory} is incomplete: not every rank finished "
                             f"saving it ({COMPLETE_MARKER} is missing); resume from an "
                             f"earlier one")
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state["strategy_name"] != self.config.strategy:
            raise ValueError(f"checkpoint {path} was written by strategy "
                             f"{state['strategy_name']!r}, this engine runs "
                             f"{self.config.strategy!r}")
        saved3 = "owned" in state["strategy"]
        if saved3 != (self.zero3 is not None):
            raise ValueError(f"checkpoint {path} was saved on ZeRO stage "
                             f"{'3' if saved3 else '1 or 2'}; resume it with "
                             f"zero_optimization.stage {'3' if saved3 else '2'}")
        numel = (state["strategy"]["owned"] if saved3 else state["flat_params"]).numel()
        mine = self.flat_params if self.zero3 is None else self.zero3.owned
        if numel != mine.numel():
            raise ValueError(f"checkpoint {path} holds {numel} parameters, the model has "
                             f"{mine.numel()}" + (" in this rank's shard" if saved3 else ""))
        with torch.no_grad():
            if self.zero3 is None:
                self.flat_params.copy_(state["flat_params"])
            self.strategy.load_state_dict(state["strategy"])
        self.backend.declare_state(self.strategy.state_dict(), self.flat_params,
                                   write=True)
        if self.loss_scaler is not None and state.get("loss_scaler"):
            self.loss_scaler.load_state_dict(state["loss_scaler"])
        self.t = state["t"]
        self.global_steps = state.get("global_steps", self.t)
        self.skipped_steps = state.get("skipped_steps", 0)
        if lr_schedule:
            for group, saved in zip(self.optimizer.param_groups,
                                    state.get("optimizer_groups", [])):
                group.update(saved)
            if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
                self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        return path, state
