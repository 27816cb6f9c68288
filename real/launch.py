"""Launch N local ranks the way torchrun does: torch's elastic launcher, standalone.

`launch(nprocs, args)` starts `nprocs` copies of `python <args>` through
`torch.distributed.launcher.api.elastic_launch` with a c10d rendezvous on localhost (what
`torchrun --standalone --nproc-per-node N` sets up). Each child gets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT and joins the group itself
(`zfbench.real.distributed.init_from_env`). No restarts: when a rank fails, the launcher stops
the others and `launch` raises `LaunchError` naming the failed ranks and their exit
codes, so a dead rank never leaves the rest waiting.
"""

from __future__ import annotations

import sys
import uuid


class LaunchError(RuntimeError):
    """One or more ranks failed; the message names them and their exit codes."""


def launch(nprocs: int, args: list[str], *, monitor_interval_s: float = 0.2) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs,
                          run_id=f"zfbench-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=monitor_interval_s, start_method="spawn")
    try:
        elastic_launch(config, sys.executable)(*args)
    except ChildFailedError as err:
        failed = ", ".join(f"rank {rank} (exit code {f.exitcode})"
                           for rank, f in sorted(err.failures.items()))
        raise LaunchError(f"{nprocs}-rank run failed: {failed}; the launcher stopped the "
                          f"other ranks") from err
