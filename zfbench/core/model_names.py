"""The names of model slices: ``llama2-7b[2L]``, ``llama2-7b[w0.125]``,
``llama2-7b[1L][w0.125]`` -- how a slice is written and read back.

One bracket per item (``[<n>L]`` for the depth, ``[w<fraction>]`` for the width), depth
first in canonical names, either order read; no commas, colons or ``=``, so a name
survives comma-separated lists (``--sweep model=...``) and ``name.split("[")[0]`` is
its base. ``zfbench.core.models`` makes the slices these names describe; this module
only writes and parses the text (no shapes, no lookups).
"""

from __future__ import annotations

import math
import re


class UnknownModelError(ValueError):
    """Raised for a model name that names no model, or a malformed slice suffix."""


_SUFFIX_RE = re.compile(r"(?:\[[^\[\]]*\])+$")  # the trailing bracket groups
_GROUP_RE = re.compile(r"\[([^\[\]]*)\]")
_DEPTH_ITEM = re.compile(r"(\d+)L", re.IGNORECASE)
_WIDTH_ITEM = re.compile(r"w((?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)", re.IGNORECASE)
SLICE_SYNTAX = "<model>[<n>L], <model>[w<fraction>] or <model>[<n>L][w<fraction>], e.g. llama2-7b[1L][w0.125]"


def format_width(heads: int, base_heads: int) -> str:
    """The shortest of 4+ significant digits that names ``heads / base_heads`` unambiguously."""
    for digits in range(4, 18):
        text = format(heads / base_heads, f".{digits}g")
        if math.floor(float(text) * base_heads + 0.5) == heads:
            return text
    raise AssertionError(f"cannot name width {heads}/{base_heads}")  # pragma: no cover


def slice_name(root: str, depth: int | None, heads: int, base_heads: int) -> str:
    items = ([f"{depth}L"] if depth is not None else []) + \
        ([f"w{format_width(heads, base_heads)}"] if heads != base_heads else [])
    return root + "".join(f"[{item}]" for item in items)


def strip_suffix(name: str) -> str:
    """``name`` without a trailing slice suffix it may carry (a hand-made ``x[2L]``)."""
    m = _SUFFIX_RE.search(name)
    if m is None:
        return name
    try:
        _parse_suffix(m.group(0), name)
    except ValueError:
        return name
    return name[: m.start()]


def legacy_depth(name: str) -> int | None:
    """Depth named by a hand-made (unsliced) shape's ``[nL]`` suffix, else None."""
    m = _SUFFIX_RE.search(name)
    if m is None:
        return None
    try:
        return _parse_suffix(m.group(0), name)[0]
    except ValueError:
        return None


def _parse_suffix(suffix: str, name: str) -> tuple[int | None, float | None]:
    """``(depth, width)`` of a suffix of bracket groups (``"[1L][w0.125]"``)."""
    depth = width = None
    for item in _GROUP_RE.findall(suffix):
        item = item.strip()
        depth_m, width_m = _DEPTH_ITEM.fullmatch(item), _WIDTH_ITEM.fullmatch(item)
        if (depth_m and depth is not None) or (width_m and width is not None):
            raise UnknownModelError(f"model {name!r}: malformed slice suffix {suffix} (the "
                                    f"{'depth' if depth_m else 'width'} is given twice); write {SLICE_SYNTAX}")
        if depth_m:
            depth = int(depth_m.group(1))
        elif width_m:
            width = float(width_m.group(1))
        else:
            raise UnknownModelError(f"model {name!r}: malformed slice suffix {suffix} (item [{item}]); "
                                    f"write {SLICE_SYNTAX}")
    return depth, width


def parse_model_name(name: str) -> tuple[str, int | None, float | None]:
    """Split a model name into ``(base, layers, width)``: ``"llama2-7b[1L][w0.125]"`` ->
    ``("llama2-7b", 1, 0.125)``, ``"llama2-7b"`` -> ``("llama2-7b", None, None)``.

    The suffix is ``[<n>L]``, ``[w<fraction>]`` or both, one bracket each, in either
    order (case and spaces ignored).  The base is not looked up; a malformed suffix
    (or a ``[`` without one) raises :class:`UnknownModelError`.
    """
    if not isinstance(name, str):
        raise UnknownModelError(f"model name must be a string, got {name!r}")
    text = name.strip()
    m = _SUFFIX_RE.search(text)
    if m is None:
        if "[" in text or "]" in text:
            raise UnknownModelError(f"model {name!r}: malformed slice suffix; write {SLICE_SYNTAX}")
        return text, None, None
    base = text[: m.start()].strip()
    if not base or "[" in base or "]" in base:
        raise UnknownModelError(f"model {name!r}: malformed slice suffix; write {SLICE_SYNTAX}")
    depth, width = _parse_suffix(m.group(0), name)
    return base, depth, width
