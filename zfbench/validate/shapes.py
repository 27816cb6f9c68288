"""The three shapes `zfbench.validate` runs, sized on this machine.

`sizing_profiles` measures forward+backward at 4 and 256 tokens (again where the larger came
out no slower: the machine was busier during the first); `sized_shapes` fits it as a + b *
tokens and picks the token counts at which the host Adam is about 2, 1 and 0.5 times it
(capped where a noisy machine cannot reach a ratio); beyond the model's positions the
batch grows (rows of its longest sequence, at most MAX_BATCH). `fitting` then halves a
shape's batch until every strategy fits this machine's memory (zfbench.real.memory).
"""

from __future__ import annotations

import sys
from dataclasses import replace

from zfbench.core.config import STRATEGIES
from zfbench.core.memory_model import element_bytes
from zfbench.core.strategies import buckets_on
from zfbench.real.engine import resolve_device
from zfbench.real.runner import RunSpec

# token counts of the two sizing profiles: on a CPU lane forward+backward at 256 tokens is
# about 2-4x the 4-token one (tinyllama-1.1b[1L], bf16, Intel Xeon with AMX, 2026-11-27),
# beyond the +-30% the machine drifts between profiles; at 64 it was 0.9-1.7x, so a busy
# moment could invert the slope and size a shape 30x too long (docs/results.md)
SIZING_SEQ = (4, 256)
SIZING_ATTEMPTS = 3  # measurements of the pair before a noisy machine is reported
RATIOS = (2.0, 1.0, 0.5)  # host Adam / (forward + backward), host longer to shorter
MAX_BATCH = 64  # sized shapes: at most this many sequences of the model's longest
REGIMES = ("longer", "equal", "shorter")  # the host Adam against forward+backward, per ratio


def compute_s(profile: dict, shape) -> float:
    """Forward + backward seconds per step at the profile's token count."""
    blocks = profile["calibration"]["blocks"]
    return sum((b["forward_s"] + b["backward_s"]) * (shape.layers if k == "decoder" else 1)
               for k, b in blocks.items())


def host_adam_s(profile: dict, shape) -> float:
    return shape.total_params / profile["calibration"]["host_adam_params_per_s"]


class NoisySizingError(RuntimeError):
    """Forward+backward measured no slower at many tokens than at few, attempt after attempt."""


def sizing_profiles(base: RunSpec, measure, attempts: int = SIZING_ATTEMPTS,
                    cap_tokens: bool = False) -> tuple[dict, dict]:
    """The few- and many-token profiles (`measure(spec)` -> profile) that `sized_shapes`
    fits. Where the many-token forward+backward came out no slower, the pair is measured
    again, up to `attempts` times; then, unless the shapes' tokens are capped
    (`cap_tokens`, --quick), NoisySizingError names the problem and the fixes, as a
    clamped slope would ask for the largest shape there is (hours on a CPU lane)."""
    shape = base.shape()
    for attempt in range(1, attempts + 1):
        low, high = (measure(replace(base, micro_batch=1, seq=n)) for n in SIZING_SEQ)
        c_lo, c_hi = compute_s(low, shape), compute_s(high, shape)
        if c_hi > c_lo:
            return low, high
        print(f"forward+backward measured no slower at {SIZING_SEQ[1]} tokens ({c_hi:.3g} s) "
              f"than at {SIZING_SEQ[0]} ({c_lo:.3g} s), attempt {attempt} of {attempts}: "
              f"the machine was busier during the first profile", file=sys.stderr)
    if cap_tokens:
        return low, high
    raise NoisySizingError(
        f"forward+backward of {shape.name} measured no slower at {SIZING_SEQ[1]} tokens than "
        f"at {SIZING_SEQ[0]} in {attempts} attempts: this machine is too busy to size "
        f"validate's shapes; run it again when the machine is quieter, or pass --quick "
        f"(shapes capped at a few hundred tokens)")


def sized_shapes(base: RunSpec, low: dict, high: dict, max_seq: int,
                 max_tokens: int | None = None) -> dict[str, RunSpec]:
    """Token counts at which host Adam / (forward + backward) is about 2, 1 and 0.5 (the
    regimes `longer`, `equal`, `shorter`), from two profiles (at few and at many tokens):
    forward + backward is fitted as a + b * tokens. On a CPU lane a (the weight traffic)
    dominates at small token counts, so the ratio cannot exceed r_max = host / (a + 4 b);
    the targets are min(2, r_max), min(1, r_max / 1.5) and min(0.5, r_max / 3), so they
    stay distinct whatever r_max a noisy measurement gives, and below r_max = 1 (no shape
    of this model has the host longer) a warning names a model that has. Each shape is
    named by its target ratio (`ratio2`, `ratio0.45` ...); validate prints the ratio its
    own profile measured. `max_tokens` caps a shape's tokens (`--quick`: a noisy pair of
    profiles, the many-token one no slower than the few-token one, would otherwise ask
    for the largest shape there is)."""
    shape = base.shape()
    t_lo = low["calibration"]["batch"] * low["calibration"]["seq"]
    t_hi = high["calibration"]["batch"] * high["calibration"]["seq"]
    c_lo, c_hi = compute_s(low, shape), compute_s(high, shape)
    if c_hi <= c_lo:
        print(f"forward+backward measured no slower at {t_hi} tokens ({c_hi:.3g} s) than at "
              f"{t_lo} ({c_lo:.3g} s): the machine was busier during the first profile; the "
              f"shapes are sized from a noisy fit", file=sys.stderr)
    slope = max((c_hi - c_lo) / max(t_hi - t_lo, 1), 1e-9)
    intercept = c_lo - slope * t_lo
    host_s = host_adam_s(low, shape)
    r_max = host_s / (intercept + slope * 4)
    targets = tuple(min(r, r_max / shrink) for r, shrink in zip(RATIOS, (1.0, 1.5, 3.0)))
    if r_max < 1.0:
        print(f"host Adam / (forward + backward) measured at most {r_max:.2f} with "
              f"{shape.name} here (at 4 tokens): no shape has the host clearly longer; "
              f"shapes spread over {targets[-1]:.2f}-{r_max:.2f}. On a shared machine "
              f"this sizing varies by +-30% run to run; a model with untied embeddings "
              f"(the default, tinyllama-1.1b[1L]) usually measures 1.1-1.6", file=sys.stderr)
    out = {}
    for target in targets:
        tokens = int(min(max(4, round((host_s / target - intercept) / slope)),
                         MAX_BATCH * max_seq, max_tokens or MAX_BATCH * max_seq))
        # beyond the model's positions the batch grows (a GPU needs many tokens before
        # its forward+backward is as long as the host Adam)
        batch = -(-tokens // max_seq)
        out[f"ratio{target:.3g}"] = replace(base, micro_batch=batch, seq=-(-tokens // batch))
    return out


def fitting(spec: RunSpec) -> RunSpec:
    """`spec` with its batch halved until every strategy fits this machine's memory (a
    GPU's free memory; the CPU lanes' RAM): `sized_shapes` may ask for tens of thousands
    of tokens on a GPU. Raises InsufficientMemoryError when one sequence does not fit."""
    from zfbench.real.memory import InsufficientMemoryError, check_fits

    on_cuda = resolve_device(spec.device).type == "cuda"
    shape = spec.shape()
    cfg = spec.engine_config("zenflow")  # precision and overlap_comm: not the batch
    elem, bucketed = element_bytes(cfg.precision), buckets_on(cfg.precision,
                                                              cfg.overlap_comm)
    while True:
        try:
            check_fits(shape, list(STRATEGIES), spec.micro_batch, spec.seq, elem, on_cuda,
                       bucketed=bucketed)
            return spec
        except InsufficientMemoryError:
            if spec.micro_batch == 1:
                raise
            print(f"batch {spec.micro_batch} x seq {spec.seq} does not fit: batch "
                  f"{spec.micro_batch // 2}", file=sys.stderr)
            spec = replace(spec, micro_batch=spec.micro_batch // 2)
