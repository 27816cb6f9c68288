"""The host lane of a measured run against what the run's own probes say it could do
(issue 45's target: ZeRO-Offload's host lane at >= `TARGET` of AdamW alone on its
updates plus what the emulated link needs).

Owns `HOST_TARGET_COLUMNS` (summary columns a measured run adds, `MEASURED_ONLY`) and the
line printed under the run's table. For each strategy with host updates, from the
profile measured around it (`zfbench.run.expect.Calibration`: the host lane's AdamW alone
on its own thread count, `host_lanes`, and the h2d copy, both probed as the engine runs
them) and its own spans over the measured steps:

- `host_link_s_per_step`: the seconds a step's uploads take at the probed h2d rate, where
  the host worker runs them itself (the CPU lanes without a link thread, real/cpu_link.py;
  0 where a stream or a link thread runs them);
- `host_over_adam_alone`: AdamW alone's seconds for the step's host updates (plus, with
  ZenFlow's windows, the probed zeroing) over the `host_optim` busy seconds;
- `host_over_adam_plus_link`: the same with `host_link_s_per_step` added (the target).
NaN where the run measured no profile or the strategy has no host updates.
"""

from __future__ import annotations

import math

HOST_TARGET_COLUMNS = ("host_link_s_per_step", "host_over_adam_alone",
                       "host_over_adam_plus_link")
#: issue 45: ZeRO-Offload's host lane, AdamW alone plus the link's copies over busy time
TARGET = 0.85


def _lane_rates(calibration: dict, strategy: str) -> dict:
    """The calibration's host-lane rates on `strategy`'s own thread count where the
    profile measured them (`host_lanes`), else its default lane's."""
    lane = (calibration.get("host_lanes") or {}).get(strategy)
    return lane or calibration


def uploads_on_host_worker(backend) -> bool:
    """Whether the host worker runs the h2d copies itself: the CPU lanes (no CUDA stream)
    without a link thread for h2d."""
    return not backend.is_cuda and "h2d" not in getattr(backend, "links", {})


def host_target_columns(row: dict, spans, skip: int, calibration: dict | None,
                        on_worker: bool, windows: bool, params_per_step: float) -> dict:
    """`HOST_TARGET_COLUMNS` of one measured strategy: `row` its summary row (its
    `host_adam_params_per_s`), `spans` its spans frame, `skip` the steps left out,
    `calibration` the profile measured around it (None: all NaN), `on_worker` whether its
    uploads ran on the host worker, `windows` whether its host chunk zeroes ZenFlow's
    window, `params_per_step` the host updates' parameters per step."""
    out = dict.fromkeys(HOST_TARGET_COLUMNS, math.nan)
    rate = row.get("host_adam_params_per_s")
    if calibration is None or not params_per_step or not rate or rate != rate:
        return out
    lane = _lane_rates(calibration, row["strategy"])
    busy_s = params_per_step / rate
    alone_s = params_per_step / lane["host_adam_params_per_s"]
    if windows and lane.get("host_zero_elems_per_s"):
        alone_s += params_per_step / lane["host_zero_elems_per_s"]
    kept = spans[spans["step"] >= skip]
    steps = kept["step"].nunique() * kept["rank"].nunique()  # per rank, as `row`'s
    link_s = 0.0
    if on_worker and steps:
        up = kept[(kept["lane"] == "h2d") & (kept["op"] == "h2d_param")]
        link_s = float(up["bytes"].sum()) / steps / calibration["h2d_bytes_per_s"]
    out.update(host_link_s_per_step=link_s, host_over_adam_alone=alone_s / busy_s,
               host_over_adam_plus_link=(alone_s + link_s) / busy_s)
    return out


def host_target_line(rows: list[dict]) -> str | None:
    """The line under the run's table: each strategy's host lane against AdamW alone and
    the link's copies (None where no row has the columns)."""
    parts = []
    for r in rows:
        ratio = r.get("host_over_adam_plus_link")
        if ratio is None or ratio != ratio:
            continue
        link = r["host_link_s_per_step"]
        parts.append(f"{r['strategy']} {r['host_adam_params_per_s'] / 1e6:.0f} M params per "
                     f"busy s = {r['host_over_adam_alone']:.2f}x AdamW alone"
                     + (f", {ratio:.2f}x with the {link:.3f} s a step its worker's uploads "
                        f"need at the probed h2d rate" if link else ""))
    if not parts:
        return None
    return (f"host lane against the rates probed around it (issue 45 target for "
            f"zero-offload: {TARGET}x): " + "; ".join(parts))
