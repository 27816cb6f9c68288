"""A timeline's rows as a table and as CSV text, fast: the two costs of a simulation's
million spans after the simulation itself (zfbench.core.trace uses both).

- `rows_frame(rows, columns)`: `pd.DataFrame(rows, columns=columns)`, the very frame
  (values and dtypes), built column by column: about twice as fast.
- `span_lines(batch, memo)`: the CSV lines of a batch of span rows, each field its str()
  (floats as their shortest exact text), formatting each distinct time once (`memo`)
  and a rank's copy of the previous row's span once.
"""

from __future__ import annotations

from operator import itemgetter

# columns of words (the lanes' and ops' vocabulary), left to pandas' own inference
WORD_COLUMNS = frozenset(("lane", "op"))


def rows_frame(rows: list[tuple], columns: list[str]):
    """`pd.DataFrame(rows, columns=columns)`: a column of Python ints (within int64) or
    of Python floats alone as a NumPy int64 or float64 array, as pandas infers them;
    `WORD_COLUMNS` as pandas infers them. No rows, or any other number column (ints and
    floats mixed, bools, None, NumPy scalars, ints past int64), take pandas' own way."""
    import numpy as np
    import pandas as pd

    if not rows:
        return pd.DataFrame(rows, columns=columns)
    data = {}
    for i, name in enumerate(columns):
        # (not zip(*rows): an iterator per row, whose millions of allocations would set
        # the cyclic collector off again and again over every row)
        values = list(map(itemgetter(i), rows))
        if name in WORD_COLUMNS:
            data[name] = values
            continue
        kinds = set(map(type, values))
        try:
            if kinds == {int}:  # past int64 (uint64 to pandas): OverflowError
                data[name] = np.array(values, dtype=np.int64)
                continue
            if kinds == {float}:
                data[name] = np.array(values, dtype=np.float64)
                continue
        except OverflowError:
            pass
        return pd.DataFrame(rows, columns=columns)
    return pd.DataFrame(data)


def span_lines(batch: list[tuple], memo: dict) -> str:
    """The CSV lines of a batch of span rows `(rank, lane, op, step, t0, t1, bytes)`, each
    field as str(). `memo` maps floats other than zero to their text (a timeline's times
    repeat: one op ends as the next starts), so it is only read for floats (1 and 1.0,
    0.0 and -0.0 are equal keys with different texts). A row whose fields after the rank
    are the very objects of the previous row's (a rank's copy of another's span:
    zfbench.sims.replicas writes them one after the other) has the same text there,
    which is reused."""
    lines: list[str] = []
    append, get = lines.append, memo.get
    p_lane = p_op = p_step = p_t0 = p_t1 = p_bytes = None
    tail = ""
    rank_text: dict = {}
    for rank, lane, op, step, t0, t1, nbytes in batch:
        if t0 is not p_t0 or t1 is not p_t1 or step is not p_step or lane is not p_lane \
                or op is not p_op or nbytes is not p_bytes:  # the same objects: same text
            p_lane, p_op, p_step, p_t0, p_t1, p_bytes = lane, op, step, t0, t1, nbytes
            a = get(t0) if type(t0) is float else None
            if a is None:
                a = str(t0)
                if type(t0) is float and t0:
                    memo[t0] = a
            b = get(t1) if type(t1) is float else None
            if b is None:
                b = str(t1)
                if type(t1) is float and t1:
                    memo[t1] = b
            tail = f",{lane},{op},{step},{a},{b},{nbytes}\n"
        r = rank_text.get(rank) if type(rank) is int else None
        if r is None:
            r = str(rank)
            if type(rank) is int:
                rank_text[rank] = r
        append(r + tail)
    return "".join(lines)
