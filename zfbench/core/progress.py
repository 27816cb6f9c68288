"""Progress that reads well wherever it goes: a live tqdm bar on a terminal, one line when
a phase starts and one when it ends where the output is a pipe, a file or a CI log (a
bar's carriage returns would pile up there), nothing when quiet.

`progress(iterable=None, total=None, desc=..., unit=..., quiet=False)` is used like
`tqdm`: iterate over it, or call `update()`, `set_postfix(...)` / `set_postfix_str(...)`
and `close()` (or use it as a context manager); `n` counts the units done.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable

from tqdm import tqdm


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
             unit: str = "it", quiet: bool = False, file=None, **tqdm_kwargs):
    """A tqdm bar on a terminal, `PhaseLines` off one, a silent tqdm when `quiet`."""
    file = file if file is not None else sys.stderr
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if quiet:
        return tqdm(iterable, total=total, disable=True)
    if getattr(file, "isatty", lambda: False)():
        return tqdm(iterable, total=total, desc=desc, unit=unit, file=file, **tqdm_kwargs)
    return PhaseLines(iterable, total, desc, unit, file)


class PhaseLines:
    """The bar's start and end as two plain lines, no carriage return:
    `simulating: 40 runs ...` then `simulating: 40/40 runs in 12.3 s (last: ...)`."""

    def __init__(self, iterable: Iterable | None, total: int | None, desc: str, unit: str,
                 file) -> None:
        self.iterable, self.total, self.unit, self.file = iterable, total, unit, file
        self.desc = desc.strip()
        self.n = 0
        self.postfix = ""
        self._started = time.perf_counter()
        self._closed = False
        count = f"{total} {unit}" if total is not None else unit
        self._print(f"{self.desc}: {count} ...")

    def _print(self, text: str) -> None:
        print(text, file=self.file, flush=True)

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.n += 1
        finally:
            self.close()

    def __len__(self) -> int:
        return self.total or 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def write(self, text: str) -> None:
        self._print(text)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        done = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        last = f" ({self.postfix})" if self.postfix else ""
        self._print(f"{self.desc}: {done} {self.unit} in "
                    f"{time.perf_counter() - self._started:.1f} s{last}")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
