"""What DeepSpeed's ZenFlow smoke tests (test_zf.py) do not check: the numbers. After
every step, every strategy's weights equal a plain-PyTorch reference of its schedule to
1e-5, on one rank and on two gloo ranks (conformance_schedule.py says what each
reference is). Not a port: DeepSpeed has no such test."""
import pytest

from conformance_schedule import CLIPS, VARIANTS, check_against_reference, run_engine


def cases():
    """Every strategy, clipped and not (the device strategy's clipping did nothing until
    these tests found it: DeviceStrategy.step clipped the .grad of the flat buffer, which
    has none)."""
    for variant in VARIANTS:
        for clip in CLIPS:
            yield pytest.param(variant, clip, id=f"{variant}-clip{clip}")


@pytest.mark.parametrize("variant,clip", list(cases()))
def test_one_rank_matches_the_reference(variant, clip):
    """One rank: the engine's parameters after each of 13 steps and after finish() equal
    the float64 reference of the same schedule fed the engine's gradients (torch AdamW for
    device / zero-offload, one step late for zero-offload-dpu, ReferenceZenFlow for
    zenflow with and without overlap_step: warm-up, reselections, windows cut short)."""
    check_against_reference(variant, clip, [run_engine(variant, clip)])


@pytest.mark.slow
@pytest.mark.parametrize("variant,clip", list(cases()))
def test_two_gloo_ranks_match_the_reference(variant, clip, two_ranks):
    """Two gloo ranks, each on its half of every global batch (train_batch_size 4, so a
    micro-batch of 2 each): both ranks' parameters after every step and after finish()
    equal the reference fed the ranks' averaged gradients, and both pick its columns."""
    check_against_reference(variant, clip,
                            [rank["schedule"][f"{variant}/{clip}"] for rank in two_ranks])
