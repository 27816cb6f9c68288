"""What a strategy and the engine hand each other, named and typed.

The engine (real/engine.py) owns the model's flat buffers, the lanes and the training
loop; a strategy (real/strategies.py, real/zenflow.py and its helpers) owns one way of
updating the parameters. They meet through two small protocols:

- `EngineForStrategy`: everything a strategy reads from the engine (its config, the
  flat parameter and gradient buffers and their layout, this rank's shard, the backend
  that runs device work on a lane, the host lane and how long to wait for it, the step
  number, the data-parallel context and the all-gather of updated shards) and the two
  slots they pass events through: `sent_down`, which the engine fills when the gradients
  went down bucket by bucket during backward (the strategy takes it and sets it None),
  and `grads_read`, which the strategy fills with the event after the last read of the
  gradients (the engine's zeroing waits for it, then clears it);
- `StrategyForEngine`: what the engine calls on a strategy: `step(t)` at each
  accumulation boundary (`zeroes_grads`: it zeroes the gradients itself), `grads_landing(t)`
  before backward (where gradients may land during it, or None), `finish()` at the end,
  and the checkpoint pair.

tests/test_engine_protocol.py checks that the engine and every strategy satisfy them and
that the strategy modules read nothing from the engine that `EngineForStrategy` does not
declare, so the protocol cannot drift from the code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ContextManager, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from zfbench.core.config import EngineConfig
    from zfbench.real.backend import Backend
    from zfbench.real.distributed import DistContext
    from zfbench.real.flat import FlatLayout
    from zfbench.real.host_lane import HostLane


@runtime_checkable
class EngineForStrategy(Protocol):
    """The engine as a strategy sees it (module docstring)."""

    config: EngineConfig
    backend: Backend  # device work on a lane, its waits and events (real/backend.py)
    named_params: list[tuple[str, torch.Tensor]]  # views into flat_params
    layout: FlatLayout  # where each parameter sits in the flat buffers
    flat_params: torch.Tensor  # the device's parameters, one flat buffer (empty on ZeRO-3)
    flat_grads: torch.Tensor  # their gradients, the same layout
    shard_lo: int  # this rank's shard [shard_lo, shard_hi) of the flat buffers
    shard_hi: int
    shard_grad_bytes: int  # bytes of that shard's gradient in the device's dtype
    dist: DistContext  # ranks, this rank, its groups (one rank: inactive)
    host_lane: HostLane  # the host worker that runs the host optimizer's jobs
    host_timeout_s: float  # how long a wait on the host lane may take before an error
    host_chunk_elems: int  # elements per host optimizer job (each chunk then goes up)
    bucketed: bool  # the gradients go down bucket by bucket during backward
    zero3: Any  # ZeRO-3: the rank's shard of the parameters and its gathers (real/zero3.py)
    steps_per_epoch: int | None  # for ZenFlow's epoch-based reselection (None: unsized)
    t: int  # the optimizer step being run
    lr: float  # its learning rate (the optimizer's, which a schedule moves)
    sent_down: Any  # (host buffer, d2h event) when backward sent the gradients; engine-set
    grads_read: Any  # the d2h event after the last read of the gradients; strategy-set

    def compute(self, op: str, t: int, reads=(), writes=()) -> ContextManager:
        """A block of device work on the compute lane."""

    def gather_params(self, target: torch.Tensor, t: int) -> None:
        """All-gather every rank's updated shard of `target`."""

    def new_device_flat(self) -> torch.Tensor:
        """A zeroed device buffer of the flat parameters' size and dtype."""


@runtime_checkable
class StrategyForEngine(Protocol):
    """A strategy as the engine sees it (module docstring)."""

    name: str
    zeroes_grads: bool  # its step zeroes the gradients in its own pass (the engine's not)

    def step(self, t: int) -> None:
        """The optimizer step at the accumulation boundary of step t."""

    def grads_landing(self, t: int) -> torch.Tensor | None:
        """Where step t's gradients may land on the host during backward, or None."""

    def finish(self, flush_partial: bool = False) -> None:
        """Wait for and apply any pending asynchronous update."""

    def state_dict(self) -> dict:
        """The strategy's state for a checkpoint."""

    def load_state_dict(self, state: dict) -> None:
        """Restore it."""
