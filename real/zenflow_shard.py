"""ZenFlow's columns against one rank's shard [lo, hi) of the flat buffer.

A rank's host holds only its shard of the flat buffer (real/strategies.py HostState), and a
2-D weight is stored column by column (or row by row: real/flat.py FlatLayout), so a shard
boundary can cut through a weight anywhere. This module owns the arithmetic of that:
- `shard_column_scores`: per-column partial selection scores from the gradient elements in
  the shard (summed over the ranks, they are the full scores);
- `master_take` / `master_put`: the elements of the selected columns (or of a 1-D
  parameter) that lie in the shard, read from or written into the host master;
- `master_from_device` / `device_from_master`: with bf16 or fp16 weights the device keeps
  fp32 values of exactly those elements, and a selection exchanges them with the master
  (real/zenflow.py): the old selection's values go in, the new selection's come out, the
  shards' pieces summed over the ranks by one all-reduce;
- `exchange_scores`: every 2-D weight's column scores, the same on every rank, from one
  all-reduce of the shards' partial scores (or, `select_comm: allgather`, from the
  all-gathered gradient).
Indices into `master` are shard-relative (`master[i]` is flat element `lo + i`).
"""

from __future__ import annotations

import dataclasses

import torch

from zfbench.real.distributed import allgather_flat, allreduce_sum_
from zfbench.real.flat import FlatLayout, Slot, put_columns, take_columns


def shard_column_scores(flat_grad: torch.Tensor, slot, lo: int, hi: int,
                        square: bool) -> torch.Tensor:
    """Per-column partial scores (|g| or g^2 summed over rows) of the 2-D weight in `slot`
    (stored at slot.offset of the flat buffer row-major [rows, cols], or column-major
    [cols, rows] when slot.column_major), from only the elements in [lo, hi): partial
    first and last lines and the whole lines between. Summed over ranks whose shards tile
    the buffer, they are exactly the scores of the full gradient."""
    rows, cols = slot.shape
    out = torch.zeros(cols, dtype=torch.float32, device=flat_grad.device)
    a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
    if a >= b:
        return out
    seg = flat_grad[a:b].float()
    seg = seg.square() if square else seg.abs()
    start = a - slot.offset
    if getattr(slot, "column_major", False):  # a line is one column of `rows` elements
        col, within = divmod(start, rows)
        pos = 0
        if within:
            pos = min(rows - within, seg.numel())
            out[col] += seg[:pos].sum()
            col += 1
        full = (seg.numel() - pos) // rows
        if full:
            out[col:col + full] += seg[pos:pos + full * rows].view(full, rows).sum(1)
            pos, col = pos + full * rows, col + full
        if pos < seg.numel():
            out[col] += seg[pos:].sum()
        return out
    col = start % cols
    head = min((cols - col) % cols, seg.numel())
    if head:
        out[col:col + head] += seg[:head]
    rest = seg[head:]
    full = rest.numel() // cols
    if full:
        out += rest[:full * cols].view(full, cols).sum(0)
    tail = rest[full * cols:]
    if tail.numel():
        out[:tail.numel()] += tail
    return out


def _two_d(slot: Slot) -> bool:
    return len(slot.shape) == 2


def _positions(slot: Slot, idx: torch.Tensor) -> torch.Tensor:
    """Flat positions of the columns `idx` of a 2-D slot, shaped as `selected_shape` of
    the weight ([k, rows] when it is stored by column and is a real matrix, as
    `is_column_major` decides; [rows, k] otherwise)."""
    rows, cols = slot.shape
    r = torch.arange(rows).unsqueeze(1)
    j = idx.cpu().unsqueeze(0)
    pos = slot.offset + (j * rows + r if slot.column_major else r * cols + j)
    by_column = slot.column_major and rows > 1 and cols > 1  # zfbench.real.flat.is_column_major
    return pos.t().contiguous() if by_column else pos


def _whole_view(master: torch.Tensor, slot: Slot, lo: int, hi: int):
    """The master's logical view of the parameter in `slot` when the shard holds all of
    it (laid out as the device's parameter), else None."""
    if slot.offset < lo or slot.offset + slot.numel > hi:
        return None
    return FlatLayout._view(master, dataclasses.replace(slot, offset=slot.offset - lo))


def master_take(master: torch.Tensor, lo: int, hi: int, slot: Slot,
                idx: torch.Tensor | None, out: torch.Tensor) -> int:
    """Fill `out` (fp32; shaped as `selected_shape`, or as the parameter when `idx` is
    None) with the master's values of the slot's columns `idx` (of the whole parameter)
    where they lie in [lo, hi), and zeros elsewhere; returns how many were read."""
    whole = _whole_view(master, slot, lo, hi)
    if whole is not None:
        out.copy_(take_columns(whole, idx.cpu()) if idx is not None else whole)
        return out.numel()
    if idx is None or not _two_d(slot):
        a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
        out.zero_()
        if a < b:
            out.view(-1)[a - slot.offset:b - slot.offset].copy_(master[a - lo:b - lo])
        return max(0, b - a)
    pos = _positions(slot, idx)
    inside = (pos >= lo) & (pos < hi)
    values = torch.zeros(pos.shape, dtype=master.dtype)
    values[inside] = master[pos[inside] - lo]
    out.copy_(values)
    return int(inside.sum())


def master_put(master: torch.Tensor, lo: int, hi: int, slot: Slot,
               idx: torch.Tensor | None, values: torch.Tensor) -> int:
    """Write the elements of `values` (laid out as in `master_take`) that lie in [lo, hi)
    into the master; returns how many were written."""
    whole = _whole_view(master, slot, lo, hi)
    if whole is not None:
        if idx is not None:
            put_columns(whole, idx.cpu(), values.cpu())
        else:
            whole.copy_(values)
        return values.numel()
    if idx is None or not _two_d(slot):
        a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
        if a < b:
            master[a - lo:b - lo].copy_(values.reshape(-1)[a - slot.offset:b - slot.offset])
        return max(0, b - a)
    pos = _positions(slot, idx)
    inside = (pos >= lo) & (pos < hi)
    master[pos[inside] - lo] = values.cpu()[inside]
    return int(inside.sum())


def master_from_device(e, host, items, t: int) -> None:
    """Each (slot, idx, fp32 values) of `items` into the rank's master shard (a d2h span):
    the device's values of the old selection and the 1-D parameters at a reselection."""
    nbytes = sum(values.numel() * 4 for _, _, values in items)
    with e.backend.op("d2h", "select", t, reads=[v for _, _, v in items],
                      writes=(host.master,), nbytes=nbytes, blocking=True):
        for slot, idx, values in items:
            master_put(host.master, host.lo, host.hi, slot, idx, values)


def device_from_master(e, host, items, t: int, reads=()) -> None:
    """Fill each fp32 `values` of `items` from the master (an h2d span; `reads`: the
    column indices it also reads, written on the compute lane); with several ranks each
    reads its shard's elements (zeros elsewhere) and one all-reduce of all the values (a
    net span) sums the pieces, exactly: every element comes from one rank."""
    fresh = [values for _, _, values in items]
    nbytes = sum(v.numel() * 4 for v in fresh)
    with e.backend.op("h2d", "select", t, reads=(host.master, *reads), writes=fresh,
                      nbytes=nbytes, blocking=True):
        for slot, idx, values in items:
            master_take(host.master, host.lo, host.hi, slot, idx, values)
    if e.dist.active and fresh:
        flat = torch.cat([v.view(-1) for v in fresh])
        with e.backend.op("net", "allreduce", t, reads=fresh, writes=fresh, nbytes=nbytes):
            allreduce_sum_(e.dist, flat)
        for v, part in zip(fresh, torch.split(flat, [v.numel() for v in fresh])):
            v.view(-1).copy_(part)


def exchange_scores(e, matrices, column_scores, t: int) -> dict[str, torch.Tensor]:
    """Per-column scores of every 2-D weight in `matrices` ((name, param) pairs),
    identical on every rank of engine `e`; `column_scores(grad)` scores a full matrix."""
    ctx, B = e.dist, e.backend
    if e.config.select_comm == "allgather":
        full = torch.empty_like(e.flat_grads)
        nbytes = ctx.shard * ctx.world * full.element_size()
        with B.op("net", "allgather", t, reads=(e.flat_grads,), writes=(full,),
                  nbytes=nbytes):
            allgather_flat(ctx, full, e.flat_grads)
        return {name: column_scores(e.layout.view(full, name)) for name, _ in matrices}
    square = e.config.importance == "l2sq"
    with e.compute("select", t, reads=(e.flat_grads,)):
        parts = [shard_column_scores(e.flat_grads, e.layout.by_name[name], ctx.lo, ctx.hi,
                                     square) for name, _ in matrices]
        flat = torch.cat(parts)
    with B.op("net", "allreduce", t, nbytes=flat.numel() * flat.element_size()):
        allreduce_sum_(ctx, flat)
    return dict(zip((name for name, _ in matrices),
                    torch.split(flat, [p.shape[1] for _, p in matrices])))
