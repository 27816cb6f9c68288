"""Command-line edges shared by the commands (`zfbench.simulate`, `zfbench.validate`,
`zfbench.run`, ...), and the ZenFlow flags they all spell the same way
(`add_zenflow_flags`: `--zenflow.topk-ratio`, `--zenflow.update-interval`, ...).

Every error is one line `error: ...` on stderr with exit code 2, raised before any work
starts: `OneLineParser` turns argparse's usage-plus-message into a `CliError`, and the
path checks look at output directories and input files without writing anything that
stays (a writable directory is proven by creating and removing a temporary file, since
`os.access` says yes to root on any directory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


class CliError(ValueError):
    """A bad flag, value or path; the message is printed as one `error:` line."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line raises CliError instead of printing usage, and a
    flag must be spelled whole: a prefix (`--lay 2` for `--layers 2`) is refused rather
    than taken for the flag it abbreviates."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise CliError(message)


def fail(err: Exception | str) -> int:
    """Print `error: <message>` as one line on stderr; the exit code 2."""
    text = " ".join(str(err).split())
    print(f"error: {text}", file=sys.stderr)
    return 2


def _probe_writable(directory: Path, what: str) -> None:
    try:
        fd, name = tempfile.mkstemp(prefix=".zfbench-probe-", dir=directory)
    except OSError as err:
        raise CliError(f"{what}: cannot write in {directory} ({err.strerror or err})") \
            from None
    os.close(fd)
    os.unlink(name)


def check_out_dir(out: Path | None, flag: str = "--out") -> None:
    """`out` is (or can be made) a writable directory: not a file, not under a file, not
    in a directory we cannot write. Creates nothing."""
    if out is None:
        return
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise CliError(f"{flag} {out} exists and is not a directory")
        _probe_writable(out, f"{flag} {out}")
        return
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise CliError(f"{flag} {out}: {parent} is not a directory")
    _probe_writable(parent, f"{flag} {out}")


def check_input_file(path: str | Path, flag: str) -> None:
    """`path` is an existing, readable regular file."""
    p = Path(path)
    if not p.exists():
        raise CliError(f"{flag} {path}: no such file")
    if not p.is_file():
        raise CliError(f"{flag} {path}: not a regular file")
    try:
        with open(p, "rb") as handle:
            handle.read(1)
    except OSError as err:
        raise CliError(f"{flag} {path}: cannot read it ({err.strerror or err})") from None


def check_profile(path: str | Path, flag: str = "--profile") -> dict:
    """A zfbench profile (`python -m zfbench.run --profile`): its `calibration` section."""
    check_input_file(path, flag)
    hint = "make one with python -m zfbench.run --profile --out DIR"
    try:
        with open(path) as handle:
            cal = json.load(handle)["calibration"]
        cal["model"], cal["batch"], cal["seq"]  # noqa: B018 - the keys simulate reads
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise CliError(f"{flag} {path}: not a zfbench profile ({type(err).__name__}: "
                       f"{err}); {hint}") from None
    if not isinstance(cal["model"], str) or not all(
            isinstance(cal[k], int) and cal[k] >= 1 for k in ("batch", "seq")):
        raise CliError(f"{flag} {path}: not a zfbench profile (calibration model, batch, "
                       f"seq malformed); {hint}")
    return cal


def positive_int(name: str, value, minimum: int = 1) -> int:
    """An integer flag value >= minimum, else CliError naming the flag."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CliError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value



# -- the ZenFlow knobs, spelled the same by every command ----------------------------
# `--zenflow.<knob>` (the config's zero_optimization.zenflow.<knob>, dashes for
# underscores); the older `--<knob>` spelling is kept as an alias. Values are read here
# and checked where they are used (zfbench.core.config_zenflow / SimSettings), so one
# rule says what a valid value is.
ZENFLOW_KNOBS = ("topk_ratio", "update_interval", "select_interval", "overlap_step",
                 "full_warm_up_rounds", "offload")
# knobs that came after the `--zenflow.*` spelling: no older alias (`--offload` would
# also read as parameter or optimizer offload)
_WITHOUT_ALIAS = ("offload",)
_BOOLEAN_KNOBS = ("overlap_step", "offload")


def zenflow_flags(knob: str) -> tuple[str, ...]:
    """(`--zenflow.<knob>`, its older alias `--<knob>` where it has one), dashes for
    underscores."""
    dashed = knob.replace("_", "-")
    if knob in _WITHOUT_ALIAS:
        return (f"--zenflow.{dashed}",)
    return f"--zenflow.{dashed}", f"--{dashed}"


def read_zenflow_value(knob: str, text: str):
    """A ZenFlow flag's text as the config's type: a float (topk_ratio), an integer or
    "auto" (the intervals), an integer (warm-up rounds), a boolean (overlap_step,
    offload)."""
    word = text.strip().lower()
    try:
        if knob == "topk_ratio":
            return float(word)
        if knob in _BOOLEAN_KNOBS:
            if word in ("1", "true", "yes", "on"):
                return True
            if word in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if knob in ("update_interval", "select_interval") and word == "auto":
            return "auto"
        return int(word)
    except ValueError:
        kind = {"topk_ratio": "a number", "overlap_step": "true or false",
                "offload": "true or false",
                "full_warm_up_rounds": "an integer"}.get(knob, "an integer or auto")
        raise CliError(f"{zenflow_flags(knob)[0]}: cannot read {text!r} as {kind}") from None


def add_zenflow_flags(p: argparse.ArgumentParser, knobs=ZENFLOW_KNOBS) -> None:
    """The ZenFlow flags (`--zenflow.topk-ratio` ...) on parser `p`, dest the knob's name,
    default None (not given); `zenflow_given(args)` reads them."""
    group = p.add_argument_group("ZenFlow", "the zenflow strategy's knobs (they override "
                                 "a config's zero_optimization.zenflow keys)")
    for knob in knobs:
        group.add_argument(*zenflow_flags(knob), dest=knob, default=None, metavar="V",
                           help=f"zero_optimization.zenflow.{knob}")


def zenflow_given(args, knobs=ZENFLOW_KNOBS) -> dict:
    """{knob: value} of the ZenFlow flags given on the command line."""
    return {k: read_zenflow_value(k, getattr(args, k)) for k in knobs
            if getattr(args, k, None) is not None}
