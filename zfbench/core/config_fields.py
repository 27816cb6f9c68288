"""Typed readers for config values: each names the full dotted key when it refuses one.

Shared by `zfbench.core.config` (the DeepSpeed-style config) and `zfbench.core.config_zenflow`
(its ZenFlow section); `ConfigError` is the one error type of config validation.
"""
from __future__ import annotations

import difflib
import math

class ConfigError(ValueError):
    """A bad config value or key; `key` is the full dotted key (or a file path)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


# ---------------------------------------------------------------- typed field readers
def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _unknown(full: str, name: str, allowed) -> ConfigError:
    close = difflib.get_close_matches(name, list(allowed), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return ConfigError(full, f"unknown key; {hint}valid keys: {sorted(allowed)}")


def _check_keys(d, prefix: str, allowed) -> None:
    if not isinstance(d, dict):
        raise ConfigError(prefix, f"got {d!r}; expected a JSON object")
    for key in d:
        full = _join(prefix, str(key))
        if key not in allowed:
            raise _unknown(full, str(key), allowed)


def _int(v, key: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(key, f"got {v!r} ({type(v).__name__}); expected an integer"
                          + (f" >= {lo}" if lo is not None else ""))
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(key, f"got {v!r}; expected an integer {rng}")
    return v


def _float(v, key: str, lo: float, hi: float = math.inf, lo_open=False, hi_open=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(key, f"got {v!r} ({type(v).__name__}); expected a number")
    v = float(v)
    bad_lo = v <= lo if lo_open else v < lo
    bad_hi = v >= hi if hi_open else v > hi
    if not math.isfinite(v) or bad_lo or bad_hi:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ConfigError(key, f"got {v!r}; expected a finite number in {rng}")
    return v


def _bool(v, key: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(key, f"got {v!r} ({type(v).__name__}); expected true or false")
    return v


def _choice(v, key: str, allowed, fold_case=False):
    if isinstance(v, str):
        for a in allowed:
            if v == a or (fold_case and v.lower() == a.lower()):
                return a
    raise ConfigError(key, f"got {v!r}; expected one of {list(allowed)}")


def _count(v, key: str) -> int:
    """A positive size that JSON users often write as a float, e.g. 5e8."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return _int(v, key, lo=1)
