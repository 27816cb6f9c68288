"""When a simulated ZenFlow host window closes: a fixed `update_interval`, or Zen-auto.

The engine's `update_interval: "auto"` (zenflow.md "Adaptive update interval",
`zfbench.core.schedule.AutoIntervalTracker`) closes a window when the unselected columns'
gradient norms have caught up with the selected ones'. The simulator has no gradients, so
"auto" is resolved to window lengths (in steps) by a stated rule, `--auto-windows SPEC`:

- not given: an *assumed* constant window of `AUTO_ASSUMED_WINDOW_STEPS` steps (zfbench's
  fixed default update_interval; not measured), named as an assumption in the output;
- `N`: a constant window of N steps;
- `N1,N2,...`: those windows in order, cycled when the run outlasts them;
- a file: the windows the engine's rule chose in a real run, as `python -m zfbench.accuracy`
  writes them (`auto_interval/windows.csv`, column `length_steps`, or
  `accuracy/auto_intervals.csv`, column `length`: the first (strategy, seed) in the file),
  cycled when the run outlasts them.

Replay rule (the engine's, `real/zenflow.py`): every warm-up step is a boundary; after
warm-up each window closes when it has its length in steps, or earlier at a forced
boundary (the step before a reselection, `zfbench.core.schedule.is_update_boundary` with U
None); either way the next window takes the next length. So `auto` with a constant window
N gives the boundaries of `update_interval = N` whenever no reselection cuts a window
(select_interval 0, or a multiple of N with no warm-up).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from zfbench.core.schedule import AUTO_ASSUMED_WINDOW_STEPS, is_update_boundary, measurement_window
_FILE_COLUMNS = ("length_steps", "length")


@dataclass(frozen=True)
class WindowPlan:
    """The host windows of a run: `lengths` in steps (cycled), and where they come from."""

    auto: bool
    lengths: tuple[int, ...]
    rule: str  # one line, printed in the header and written to summary.json
    source: str  # "update_interval", "assumed", "given" or the file read

    def length(self, i: int) -> int:
        return self.lengths[i % len(self.lengths)]

    @property
    def constant(self) -> int | None:
        """The window length when every window has the same one, else None."""
        return self.lengths[0] if len(set(self.lengths)) == 1 else None

    def boundaries(self, steps: int, W: int, S: int) -> list[bool]:
        """Does the window close at the end of step t, for t in 0 .. steps - 1."""
        if not self.auto:
            return [is_update_boundary(t, W, self.lengths[0], S) for t in range(steps)]
        out, window, in_window = [], 0, 0
        for t in range(steps):
            if t < W:
                out.append(True)
                continue
            in_window += 1
            close = is_update_boundary(t, W, None, S) or in_window >= self.length(window)
            if close:
                window, in_window = window + 1, 0
            out.append(close)
        return out

    def skip_steps(self, W: int) -> int:
        """Warm-up plus the first two windows (left out of steady-state averages;
        zfbench.core.schedule.measurement_window)."""
        return measurement_window(True, W, self.lengths)[0]

    def steps_needed(self, W: int) -> int:
        """Steps a run needs to hold warm-up, the two skipped windows and one measured."""
        return measurement_window(True, W, self.lengths)[1]

    def closed_windows(self, steps: int, W: int, S: int) -> list[int]:
        """Lengths in steps of the post-warm-up windows that close within the run."""
        out, start = [], W
        for t, close in enumerate(self.boundaries(steps, W, S)):
            if t >= W and close:
                out.append(t + 1 - start)
                start = t + 1
        return out

    def mean_window_steps(self, steps: int, W: int, S: int) -> float:
        """Mean closed window in steps (the first length when none closes)."""
        closed = self.closed_windows(steps, W, S)
        return sum(closed) / len(closed) if closed else float(self.length(0))

    def describe(self, steps: int, W: int, S: int) -> dict:
        """What `auto` resolved to, for summary.json (None-free, JSON-ready)."""
        closed = self.closed_windows(steps, W, S)
        return {"rule": self.rule, "source": self.source,
                "windows_given_steps": list(self.lengths),
                "windows_in_run_steps": closed,
                "mean_window_steps": self.mean_window_steps(steps, W, S)}


def _positive_ints(values, where: str) -> tuple[int, ...]:
    out = []
    for v in values:
        try:
            n = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: window length {v!r} is not a number") from None
        if not n.is_integer() or n < 1:
            raise ValueError(f"{where}: window lengths must be integers >= 1 (steps), "
                             f"got {v!r}")
        out.append(int(n))
    if not out:
        raise ValueError(f"{where}: no window lengths")
    return tuple(out)


def _read_file(path: Path) -> tuple[tuple[int, ...], str]:
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"auto_windows {str(path)!r}: cannot read it ({err})") from None
    column = next((c for c in _FILE_COLUMNS if rows and c in rows[0]), None)
    if column is None:
        raise ValueError(f"auto_windows {str(path)!r}: not a windows file (want a CSV "
                         f"with a column {' or '.join(_FILE_COLUMNS)}, as python -m "
                         f"zfbench.accuracy writes in auto_interval/windows.csv)")
    which = ""
    if "strategy" in rows[0] and "seed" in rows[0]:
        first = (rows[0]["strategy"], rows[0]["seed"])
        rows = [r for r in rows if (r["strategy"], r["seed"]) == first]
        which = f" ({first[0]}, seed {first[1]})"
    return _positive_ints([r[column] for r in rows], f"auto_windows {str(path)!r}"), which


def window_plan(update_interval, auto_windows: str | None) -> WindowPlan:
    """Resolve `update_interval` (an int or "auto") and `--auto-windows` to windows;
    ValueError with the knob's name when they cannot be."""
    if update_interval != "auto":
        if auto_windows is not None:
            raise ValueError(f"auto_windows applies only with update_interval auto "
                             f"(update_interval is {update_interval!r})")
        return WindowPlan(False, (int(update_interval),),
                          f"fixed: every {update_interval} steps", "update_interval")
    if auto_windows is None:
        n = AUTO_ASSUMED_WINDOW_STEPS
        return WindowPlan(True, (n,), f"auto -> assumed constant {n}-step windows (not "
                          f"measured: the simulator has no gradients; pass --auto-windows "
                          f"N, N1,N2,... or a windows.csv from python -m zfbench.accuracy)",
                          "assumed")
    spec = str(auto_windows).strip()
    parts = [p.strip() for p in spec.split(",")]
    if parts and all(p.lstrip("+-").replace(".", "", 1).isdigit() for p in parts if p):
        lengths = _positive_ints([p for p in parts if p], "auto_windows")
        if len(lengths) == 1:
            rule = f"auto -> given constant {lengths[0]}-step windows"
        else:
            rule = f"auto -> given windows {','.join(map(str, lengths))} steps, cycled"
        return WindowPlan(True, lengths, rule, "given")
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"auto_windows {spec!r}: not a number, a list N1,N2,... or an "
                         f"existing file")
    lengths, which = _read_file(path)
    mean = sum(lengths) / len(lengths)
    return WindowPlan(True, lengths, f"auto -> {len(lengths)} measured windows from {spec}"
                      f"{which}, mean {mean:.2f} steps, cycled", str(path))
