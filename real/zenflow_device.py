"""ZenFlow's device update: AdamW on the selected columns and the 1-D parameters.

`SelectedColumnsUpdate` is a mixin of `zfbench.real.zenflow.ZenFlowStrategy` and owns
step 4 of docs/zenflow.md (and the device half of step 5): `device_update`, one AdamW
(grad / U, in the AdamW pass) over each 2-D weight's selected columns and every 1-D
parameter, with the moments on the device or, with `zenflow.offload`, bucket by bucket
(real/zenflow_offload.py). Per selected weight it keeps reusable buffers (`_Selected`, in
`selected_values`): the fp32 values as the device holds them (with 16-bit weights the
only exact copy; the weights take them rounded), the gathered gradient, a low-precision
staging buffer and the AdamW's scratch. With fp32 weights whose columns and gradient
columns pass real/adamw.py `columns_in_place_ok`, the AdamW runs on those columns where
they are (`_in_place`, through views built once per selection), with no gather and no
scatter: the same bits. The strategy provides the selection (`selected`, `matrices`,
`vectors`, `by_name`, `entry_names`), the moments (`dm`, `dv`, `moments`), the 1-D
parameters' fp32 values (`vector_values`, 16-bit weights: `low`), `device_count`,
`grad_divisor` and `Strategy._device_adam`; it drops a weight's buffers on a reselection
or a checkpoint load (`_forget_columns`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zfbench.real import kernels
from zfbench.real.adamw import columns_in_place_ok, fused_ok
from zfbench.real.flat import selected_shape, take_columns


@dataclass
class _Selected:
    """One weight's selected columns on the device: values (fp32, as the device holds
    them; where the AdamW runs on the weight's own columns, `_in_place`, only a buffer
    `apply_pending` reuses), and reusable gradient (made by the first gather: none where
    the AdamW reads the gradient's own columns), low-precision and scratch buffers of the
    same shape."""
    values: torch.Tensor
    grad: torch.Tensor | None
    low: torch.Tensor | None
    scratch: torch.Tensor


class SelectedColumnsUpdate:
    """The device AdamW of ZenFlow's selected columns and 1-D parameters (module
    docstring); a mixin of `ZenFlowStrategy`."""

    def _init_device_update(self) -> None:
        """The update's own buffers: the 1-D parameters' gradient copies and scratch, and
        no selected weight's buffers yet."""
        self.vector_scratch = {name: torch.zeros_like(self.dv[name]) for name, _ in self.vectors}
        self.vector_grads = {name: torch.zeros_like(self.dv[name]) for name, _ in self.vectors}
        self._forget_columns()

    def _forget_columns(self, name: str | None = None) -> None:
        """Drop the reusable buffers and views of `name`'s selection (of every weight's
        when `name` is None): after a reselection or a checkpoint load."""
        if name is None:
            # The selected columns' values as the device AdamW reads them (fp32), kept
            # between steps so each step gathers only the gradient (column gathers are the
            # costliest device op on a CPU lane); rebuilt after a selection or a load.
            self.selected_values: dict[str, _Selected] = {}
            self._views: dict[str, tuple] = {}  # `_column_views`, by weight
            return
        self.selected_values.pop(name, None)
        self._views.pop(name, None)

    def device_update(self, t: int) -> None:
        """Device AdamW on the selected columns and the 1-D parameters (grad / U); with
        `offload`, bucket by bucket, each bucket's moments brought in and sent back."""
        e = self.e
        self.device_count += 1
        if self.moments is None:
            writes = (e.flat_params,)
            in_place = {name for name, p in self.matrices if self._in_place(p)}
            if in_place:
                # the quotients grad / U go into the gradients' selected columns
                self.B.wait("compute", e.grads_read, "the device update waits for the d2h "
                            "to have read the gradients it divides")
                e.grads_read = None  # the compute lane is past it: zeroing may follow
                writes += (e.flat_grads,)
            with e.compute("device_optim", t, reads=(e.flat_grads,), writes=writes):
                self._update_entries(self.entry_names, self.dm, self.dv, in_place)
            return
        staging = self.moments.staging
        for bucket in self.moments.buckets:
            ms, vs = self.moments.bring_in(t, bucket)
            with e.compute("device_optim", t, reads=(e.flat_grads, staging),
                           writes=(e.flat_params, staging)):
                self._update_entries(bucket.names, ms, vs)
            self.moments.send_back(t, bucket)

    def _update_entries(self, names, ms_of: dict, vs_of: dict,
                        in_place: frozenset | set = frozenset()) -> None:
        """One AdamW over the weights `names`: a matrix's selected columns, a vector whole,
        with the moments `ms_of[name]`, `vs_of[name]`; on their own columns for the weights
        `in_place` (`_in_place`, decided by the caller). The gradients are divided by U in
        the AdamW pass (`grad_divisor`), not in one of their own."""
        params, grads, ms, vs, slices, scratch = [], [], [], [], [], []
        whole = []  # the tensors whose fusability stands for all (`fused` below)
        for name in names:
            p = self.by_name[name]
            if p.dim() == 2:
                # The engine stores 2-D weights column by column (zfbench.real.flat.FlatLayout),
                # so each selected column is `rows` contiguous elements: reading and writing
                # k columns moves k columns' bytes, not a pass over the whole matrix.
                idx = self.selected[name]
                here = name in in_place
                work = self._work(name, p, idx, from_device=not here)
                if here:  # AdamW on the weight's and the gradient's own columns: no
                    # gather, no write-back (the quotients grad / U land in the gradient)
                    cols = self._column_views(name, p, idx, work, ms_of[name], vs_of[name])
                    for into, views in zip((params, grads, ms, vs, scratch), cols):
                        into.extend(views)
                    whole += [p.detach().t(), p.grad.t(), ms_of[name], vs_of[name]]
                    continue
                if work.grad is None:
                    work.grad = torch.empty_like(work.values)
                kernels.gather_grads_(p.grad, idx, work.grad, work.low)
                params.append(work.values)
                grads.append(work.grad)
                scratch.append(work.scratch)
                slices.append((p, idx, work.low, work.values))
            else:
                new = self.vector_values[name] if self.low else p.detach()
                params.append(new)
                grads.append(kernels.copy_(self.vector_grads[name], p.grad))
                scratch.append(self.vector_scratch[name])
                slices.append((p, None, None, new))
            ms.append(ms_of[name])
            vs.append(vs_of[name])
            whole += [params[-1], grads[-1], ms[-1], vs[-1]]
        # the per-column views are fp32, contiguous and on the CPU when the tensors they
        # are views of are: those are looked at, not the thousands of views
        fused = fused_ok(whole) if len(whole) < len(params) * 4 else None
        self._device_adam(params, grads, ms, vs, [self.device_count] * len(params), scratch,
                          grad_divisor=self.grad_divisor, fused=fused)
        # the fp32 values it wrote (the weights are declared by the caller's op)
        self.B.access("compute", "device_optim", writes=[new for *_, new in slices])
        for p, idx, low, new in slices:
            if idx is None:
                if new.data_ptr() != p.data_ptr():
                    kernels.copy_(p.data, new)
            else:  # bf16 weights: rounded from the fp32 values, which the device keeps
                kernels.scatter_(p.data, idx, new, low)

    def _in_place(self, p: torch.Tensor) -> bool:
        """Whether the device AdamW runs on `p`'s selected columns where they are, reading
        the gradient's own columns (fp32 weights, moments on the device, weight and
        gradient both passing real/adamw.py `columns_in_place_ok`): the same bits as on
        gathered copies, without the gathers of the values and the gradient and the
        values' scatter back. The division by U stores its quotients into those gradient
        columns (torch's fused AdamW's grad_scale), after the d2h read them
        (`device_update` waits for it); nothing reads them again before backward writes
        or the step zeroes them."""
        return (not self.low and self.moments is None and columns_in_place_ok(p)
                and p.grad is not None and columns_in_place_ok(p.grad))

    def _column_views(self, name: str, p: torch.Tensor, idx: torch.Tensor,
                      work: "_Selected", m: torch.Tensor, v: torch.Tensor) -> tuple:
        """The selected columns of `p` and of its gradient, and the rows of `m`, `v` and
        the scratch, one tensor each: built once per selection (or whenever a buffer is
        replaced), so a step makes no views."""
        key = (idx, work, m, v, (p.data_ptr(), p.grad.data_ptr()))
        cached = self._views.get(name)
        if cached is not None and all(a is b for a, b in zip(cached[0][:4], key[:4])) \
                and cached[0][4] == key[4]:
            return cached[1]
        columns, grad_columns = p.detach().t().unbind(0), p.grad.t().unbind(0)
        chosen = idx.tolist()
        views = ([columns[j] for j in chosen], [grad_columns[j] for j in chosen],
                 m.unbind(0), v.unbind(0), work.scratch.unbind(0))
        self._views[name] = (key, views)
        return views

    def _work(self, name: str, p: torch.Tensor, idx: torch.Tensor,
              from_device: bool = True) -> "_Selected":
        """The selected columns' reusable buffers, shaped as `selected_shape` (hot-path
        allocations page-fault on CPU: `.float()` of a fresh 54 MB tensor 33 ms vs
        `copy_` into an old one 4.5 ms). New values start as the device's weights
        (`from_device`; exact for fp32) or uninitialized, for the caller to fill."""
        work = self.selected_values.get(name)
        if work is None:
            if from_device:
                values = take_columns(p.detach(), idx).float()
            else:
                values = torch.empty(selected_shape(p, idx.numel()), dtype=torch.float32,
                                     device=p.device)
            low = None if p.dtype == torch.float32 else torch.empty_like(values, dtype=p.dtype)
            work = _Selected(values, None, low, torch.empty_like(values))
            self.selected_values[name] = work
        return work
