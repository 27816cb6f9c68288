"""Tests for zfbench.core.models: parameter totals, block structure, FLOPs, errors, slices."""

import math
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zfbench.core.models import (
    MODELS,
    Block,
    Matrix,
    ModelShape,
    UnknownModelError,
    Vector,
    get_model,
    model_names,
    parse_model_name,
)

# Published totals (model cards / papers).
PUBLISHED = {
    "opt-350m": 331e6,
    "opt-1.3b": 1.32e9,
    "tinyllama-1.1b": 1.1e9,
    "qwen2.5-1.5b": 1.54e9,
    "qwen2.5-3b": 3.09e9,
    "llama2-7b": 6.74e9,
    "llama2-13b": 13.0e9,
}


@pytest.mark.parametrize("name,published", sorted(PUBLISHED.items()))
def test_total_matches_published(name, published):
    total = get_model(name).total_params
    assert abs(total - published) / published < 0.005, (name, total)


def test_exact_totals_from_architecture():
    # Hand-derived counts (HF modules): these pin the structure, not just the rounding.
    assert get_model("llama2-7b").total_params == 6_738_415_616
    assert get_model("llama2-13b").total_params == 13_015_864_320
    # Llama-2-70b-hf's config.json shape (the paper's "70B"): 80 x (q, o 8192^2, k, v
    # 1024 x 8192 (8 key/value heads of 128), 3 x 8192 x 28672, 2 norms)
    # + untied 32000 x 8192 embed and head + final norm
    assert get_model("llama2-70b").total_params == 80 * (
        2 * 8192 ** 2 + 2 * 1024 * 8192 + 3 * 8192 * 28672 + 2 * 8192) + 2 * 32000 * 8192 \
        + 8192 == 68_976_648_192
    assert get_model("opt-350m").total_params == 331_196_416
    assert get_model("qwen2.5-1.5b").total_params == 1_543_714_304
    # tinyllama: untied 32000 x 2048 embed and head + 22 x (q,o 2048^2, k,v 256 x 2048,
    # 3 x 2048 x 5632, 2 norms) + final norm
    assert get_model("tinyllama-1.1b").total_params == 2 * 32000 * 2048 + 22 * (
        2 * 2048 ** 2 + 2 * 256 * 2048 + 3 * 2048 * 5632 + 2 * 2048) + 2048 == 1_100_048_384
    # tiny: embed 256*64, 2 layers of (q 64*64 + k,v 32*64 + o 64*64 + 3*64*128 + 2 norms), norm, lm_head
    layer = 64 * 64 * 2 + 2 * 32 * 64 + 3 * 64 * 128 + 2 * 64
    assert get_model("tiny").total_params == 256 * 64 + 2 * layer + 64 + 256 * 64


@pytest.mark.parametrize("name", model_names())
def test_totals_are_consistent(name):
    m = get_model(name)
    blocks = m.blocks()
    assert m.total_params == sum(b.numel for b in blocks)
    assert m.total_params == sum(x.numel for x in m.matrices()) + sum(v.numel for v in m.vectors())
    assert [b.name for b in blocks] == ["embed", *(f"layers.{i}" for i in range(m.layers)), "head"]
    assert [b.kind for b in blocks] == ["embedding"] + ["decoder"] * m.layers + ["head"]
    names = [x.name for x in m.matrices()] + [v.name for v in m.vectors()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", ["llama2-7b", "opt-350m", "qwen2.5-3b"])
def test_with_layers_keeps_width(name):
    m = get_model(name)
    s = m.with_layers(2)
    assert s.name == f"{name}[2L]"
    assert (s.hidden, s.vocab, s.intermediate, s.heads) == (m.hidden, m.vocab, m.intermediate, m.heads)
    blocks = s.blocks()
    assert sum(b.kind == "decoder" for b in blocks) == 2
    full = m.blocks()
    embed, dec, head = full[0].numel, full[1].numel, full[-1].numel
    assert s.total_params == embed + 2 * dec + head
    assert s.total_params < m.total_params
    assert get_model(f"{name}[2L]") == s


def test_with_layers_bounds():
    m = get_model("llama2-7b")
    assert m.with_layers(32).total_params == m.total_params
    for bad in (0, 33, -1):
        with pytest.raises(ValueError, match=r"1\.\.32"):
            m.with_layers(bad)


def test_llama2_7b_forward_flops_closed_form():
    # Independent closed form (Megatron/PaLM style, full seq x seq attention):
    #   forward/token = 2 * N_matmul + 4 * L * seq * h
    # with N_matmul = L*(4h^2 + 3hI) + V*h (lm_head; embedding lookup is free).
    V, h, L, I, seq = 32000, 4096, 32, 11008, 4096
    n_matmul = L * (4 * h * h + 3 * h * I) + V * h
    expected = 2 * n_matmul + 4 * L * seq * h
    m = get_model("llama2-7b")
    got = m.forward_flops_per_token(seq)
    assert abs(got - expected) / expected < 0.01
    # "6N" style cross-check: 2*(N - embedding table) + attention, norms are negligible.
    approx = 2 * (m.total_params - V * h) + 4 * L * seq * h
    assert abs(got - approx) / approx < 0.01
    assert m.backward_flops_per_token(seq) == pytest.approx(2 * got)
    # Attention grows linearly with seq: doubling seq adds exactly 4*L*seq*h more.
    assert m.forward_flops_per_token(2 * seq) - got == pytest.approx(4 * L * seq * h)


def test_block_forward_flops_counts_full_attention_matrix():
    m = get_model("tiny")
    dec = m.blocks()[1]
    assert dec.attention_flops_per_token_per_seq == 4 * 64
    # 3 sequences of 10 tokens: 30 tokens, each attending to 10 positions.
    expected = 30 * (dec.forward_flops_per_token + 4 * 64 * 10)
    assert dec.forward_flops(10, seqs=3) == pytest.approx(expected)
    with pytest.raises(ValueError):
        dec.forward_flops(0)
    total = sum(b.forward_flops(128, 2) for b in m.blocks())
    assert total == pytest.approx(256 * m.forward_flops_per_token(128))


def test_gqa_attention_uses_query_heads_and_small_kv():
    m = get_model("qwen2.5-1.5b")
    dec = m.blocks()[1]
    mats = {x.name: x for x in dec.matrices}
    assert (mats["k_proj"].rows, mats["k_proj"].cols) == (256, 1536)
    assert {v.name for v in dec.vectors} == {
        "q_proj.bias", "k_proj.bias", "v_proj.bias",
        "input_layernorm.weight", "post_attention_layernorm.weight",
    }
    assert dec.attention_flops_per_token_per_seq == 4 * 1536


@pytest.mark.parametrize("name", [n for n in model_names() if MODELS[n].tied_embeddings])
def test_tied_models_have_no_lm_head_but_pay_for_it(name):
    m = get_model(name)
    assert not any(x.kind == "lm_head" for x in m.matrices())
    head = m.blocks()[-1]
    assert head.forward_flops_per_token >= 2 * m.vocab * m.word_embed_proj_dim


def test_untied_model_has_lm_head():
    m = get_model("llama2-7b")
    lm = [x for x in m.matrices() if x.kind == "lm_head"]
    assert [(x.name, x.rows, x.cols) for x in lm] == [("head.lm_head", 32000, 4096)]
    assert m.blocks()[-1].forward_flops_per_token == 2 * 32000 * 4096


def test_opt_350m_projection_and_positions():
    m = get_model("opt-350m")
    mats = {x.name: x for x in m.matrices()}
    assert (mats["embed.embed_tokens"].rows, mats["embed.embed_tokens"].cols) == (50272, 512)
    assert (mats["embed.embed_positions"].rows, mats["embed.embed_positions"].cols) == (2050, 1024)
    assert (mats["embed.project_in"].rows, mats["embed.project_in"].cols) == (1024, 512)
    assert (mats["head.project_out"].rows, mats["head.project_out"].cols) == (512, 1024)
    assert m.vectors()[-1].name.startswith("layers.23.")  # no final norm for 350m
    assert "layers.0.fc1.bias" in {v.name for v in m.vectors()}
    assert m.blocks()[0].forward_flops_per_token == 2 * 1024 * 512
    assert m.blocks()[-1].forward_flops_per_token == 2 * 1024 * 512 + 2 * 50272 * 512


def test_unknown_model_lists_valid_names():
    with pytest.raises(UnknownModelError) as info:
        get_model("llama3")
    msg = str(info.value)
    assert "'llama3'" in msg
    for n in model_names():
        assert n in msg
    assert isinstance(info.value, ValueError)
    with pytest.raises(UnknownModelError):
        get_model("llama3[2L]")


def test_value_types_validate():
    assert Matrix("w", 3, 4).kind == "other" and Matrix("w", 3, 4).numel == 12
    with pytest.raises(ValueError):
        Matrix("w", 3, 4, "bogus")
    with pytest.raises(ValueError):
        Vector("b", 0)
    with pytest.raises(ValueError):
        Block("x", "encoder", (), (), 0.0)
    with pytest.raises(ValueError):
        ModelShape("bad", "llama", 10, 64, 1, 5, 5, 128)  # 64 not divisible by 5
    assert get_model("tiny").head_dim == 16



# ----------------------------------------------------------------------------- width slices
def _scaled(dim: int, r: float) -> set:
    """The dimensions a rounding of ``dim * r`` may give (half up, so within 0.5)."""
    return {math.floor(dim * r), math.ceil(dim * r)} if dim * r % 1 != 0.5 else {math.ceil(dim * r)}


@st.composite
def width_cases(draw):
    """(model, fraction): any fraction that leaves at least one head (>= 0.5 / heads)."""
    m = MODELS[draw(st.sampled_from(model_names()))]
    f = draw(st.floats(min_value=0.5 / m.heads, max_value=1.0, allow_nan=False))
    return m, f


@given(width_cases())
def test_with_width_rounds_heads_and_keeps_head_dim(case):
    m, f = case
    s = m.with_width(f)
    assert s.head_dim == m.head_dim and s.hidden == s.heads * s.head_dim
    assert s.heads == math.floor(f * m.heads + 0.5) >= 1  # half up, deterministic
    assert abs(s.width_fraction - f) <= 0.5 / m.heads + 1e-12
    assert s.width_ratio == Fraction(s.heads, m.heads) and s.width_fraction == float(s.width_ratio)
    # GQA: heads % kv_heads == 0, at least one K/V head, the grouping kept where it divides,
    # else the nearest divisor of the new head count.
    assert s.kv_heads >= 1 and s.heads % s.kv_heads == 0
    target = s.heads * m.kv_heads / m.heads
    divisors = [d for d in range(1, s.heads + 1) if s.heads % d == 0]
    assert abs(s.kv_heads - target) == min(abs(d - target) for d in divisors)
    if m.kv_heads == m.heads:
        assert s.kv_heads == s.heads
    if s.heads % (m.heads // m.kv_heads) == 0:
        assert s.heads // s.kv_heads == m.heads // m.kv_heads
    # Everything else the architecture says is kept.
    for attr in ("style", "tied_embeddings", "qkv_bias", "linear_bias", "norm", "max_positions",
                 "final_norm", "layers"):
        assert getattr(s, attr) == getattr(m, attr)
    assert s.base is m and (s.is_slice or s.heads == m.heads)
    assert m.with_width(s.width_fraction) == s  # the realised width names the same shape


@given(width_cases())
def test_with_width_scales_every_matrix_by_fraction_squared(case):
    """Per matrix: every dimension that is a width (hidden, vocab, intermediate, OPT's word
    projection) is rounded half up from ``dim * r``, r = heads'/heads the realised width, so
    numel'/numel is r**2 within (1 + 0.5/rows')(1 + 0.5/cols') - 1 from that rounding; only
    GQA's k/v rows (whole K/V heads) and OPT's learned positions (a count of positions, not a
    width) are exceptions.  Per block type the matrices then hold r**2 within the same bound,
    and r is within 0.5/heads of the fraction asked for, so against f**2 the bound widens by
    the head rounding: (1 +- 0.5/(heads f))**2."""
    m, f = case
    s = m.with_width(f)
    r = s.width_fraction
    gqa = m.kv_heads != m.heads
    full, cut = m.blocks(), s.blocks()
    for fb, cb in ((full[0], cut[0]), (full[1], cut[1]), (full[-1], cut[-1])):
        assert [x.name for x in fb.matrices] == [x.name for x in cb.matrices]
        scaled_full = scaled_cut = 0
        worst = 0.0
        for a, b in zip(fb.matrices, cb.matrices):
            assert b.cols in _scaled(a.cols, r), (a, b)
            if a.kind == "position":
                assert b.rows == a.rows
                continue
            if gqa and a.kind in ("k", "v"):
                assert b.rows == s.kv_heads * s.head_dim
                continue
            assert b.rows in _scaled(a.rows, r), (a, b)
            bound = (1 + 0.5 / b.rows) * (1 + 0.5 / b.cols) - 1
            assert abs(b.numel / (a.numel * r * r) - 1) <= bound + 1e-12, (a, b)
            worst = max(worst, bound)
            scaled_full, scaled_cut = scaled_full + a.numel, scaled_cut + b.numel
        if scaled_full:
            assert abs(scaled_cut / (scaled_full * r * r) - 1) <= worst + 1e-12
            delta = 0.5 / (m.heads * f)
            lo, hi = (1 - delta) ** 2 * (1 - worst), (1 + delta) ** 2 * (1 + worst)
            assert lo - 1e-12 <= scaled_cut / (scaled_full * f * f) <= hi + 1e-12


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-13b"])
def test_llama2_eighth_width_keeps_the_parameter_mix(name):
    m = get_model(name)
    s = m.with_width(0.125)
    assert s.name == f"{name}[w0.125]"
    assert (s.heads, s.kv_heads, s.head_dim) == (m.heads // 8, m.kv_heads // 8, 128)
    assert (s.hidden, s.vocab, s.intermediate) == (m.hidden // 8, m.vocab // 8, m.intermediate // 8)
    for a, b in zip(m.matrices()[:len(s.matrices())], s.matrices()):
        assert a.name == b.name and b.numel * 64 == a.numel  # every matrix exactly 1/64
    # Embedding, layers and head keep their shares (only the norm vectors scale by 1/8).
    def share(x):
        return [b.numel / x.total_params for b in (x.blocks()[0], x.blocks()[1], x.blocks()[-1])]

    for a, b in zip(share(m), share(s)):
        assert b == pytest.approx(a, rel=1e-3)
    assert s.total_params / m.total_params == pytest.approx(1 / 64, rel=1e-3)


@st.composite
def slice_cases(draw):
    m = MODELS[draw(st.sampled_from(model_names()))]
    n = draw(st.integers(1, m.layers))
    k = draw(st.integers(1, m.heads))
    return m, n, k / m.heads


@given(slice_cases())
def test_depth_and_width_compose_in_either_order(case):
    m, n, f = case
    a = m.with_layers(n).with_width(f)
    b = m.with_width(f).with_layers(n)
    assert a == b and a.name == b.name and a.blocks() == b.blocks()
    assert a.layers == n and a.heads == round(f * m.heads) and a.base is m and b.base is m
    width = "" if a.heads == m.heads else f"[w{parse_model_name(a.name)[2]:.4g}]"
    assert a.name == f"{m.name}[{n}L]{width}"
    # Re-slicing is relative to the whole model, never compounded.
    assert a.with_width(1.0) == m.with_layers(n)
    assert a.with_width(f) == a and a.with_layers(n) == a
    assert m.with_width(f).with_width(f) == m.with_width(f)


@given(slice_cases(), st.booleans(), st.booleans())
def test_slice_names_round_trip_through_get_model(case, depth, width):
    m, n, f = case
    s = m
    if width:
        s = s.with_width(f)
    if depth:
        s = s.with_layers(n)
    got = get_model(s.name)
    assert got == s and got.name == s.name and got.total_params == s.total_params
    assert got.base is m
    # Callers take the base as name.split("[")[0] and pass names in ",", ":" or "=" lists.
    assert s.name.split("[")[0] == m.name and not set(",:= ") & set(s.name)
    base, layers, w = parse_model_name(s.name)
    assert base == m.name and layers == (n if depth else None)
    assert (w is None) == (s.heads == m.heads)
    # Case, spaces and the order of the two items do not matter.
    if depth and w is not None:
        assert get_model(f" {m.name.upper()}[ w{w} ][{n}l] ") == s


def test_width_slice_names_and_summary():
    m = get_model("llama2-7b")
    assert m.with_width(0.126).name == "llama2-7b[w0.125]"  # the realised width is named
    assert m.with_width(1).name == "llama2-7b" and m.with_width(1) is m
    assert get_model("llama2-7b[w1]") is m
    assert get_model("llama2-7b[2L][w1]").name == "llama2-7b[2L]"
    assert get_model("qwen2.5-0.5b[w0.07]").name == "qwen2.5-0.5b[w0.07143]"  # 1 of 14 heads
    assert get_model("llama2-7b[w.125]").name == "llama2-7b[w0.125]"
    s = get_model("llama2-7b[1L][w0.125]")
    assert (s.layers, s.base.layers, s.width_ratio) == (1, 32, Fraction(1, 8))
    assert s.param_fraction == s.total_params / m.total_params
    assert s.slice_summary() == ("llama2-7b at 1 of 32 layers and 1/8 width: 0.108% of its parameters "
                                 "(7.26M of 6.74B)")
    assert get_model("llama2-7b[2L]").slice_summary().startswith("llama2-7b at 2 of 32 layers and full width: ")
    assert m.slice_summary() == "llama2-7b: the whole model (6.74B parameters)"
    assert get_model("llama2-7b[32L]").slice_summary() == ("llama2-7b at all 32 layers and full width: 100% of "
                                                          "its parameters (6.74B of 6.74B)")
    assert not m.is_slice and m.param_fraction == 1.0 and m.width_fraction == 1.0
    assert parse_model_name("llama2-7b") == ("llama2-7b", None, None)
    assert parse_model_name("llama2-7b[w0.125][1L]") == ("llama2-7b", 1, 0.125)


def test_with_width_on_custom_shapes():
    # Shapes not in MODELS slice too (relative to themselves); OPT's projection keeps its ratio.
    proj = ModelShape("tiny-opt-post", "opt", vocab=300, hidden=32, layers=2, heads=4, kv_heads=4,
                      intermediate=64, linear_bias=True, norm="layernorm", max_positions=66,
                      tied_embeddings=True, word_embed_proj_dim=16, final_norm=False)
    s = proj.with_width(0.5)
    assert s.name == "tiny-opt-post[w0.5]" and (s.hidden, s.word_embed_proj_dim, s.vocab) == (16, 8, 150)
    assert s.max_positions == 66 and s.with_layers(1).name == "tiny-opt-post[1L][w0.5]"
    assert get_model("opt-350m[w0.25]").word_embed_proj_dim == 128
    # A shape renamed away from its slice name is a model of its own; one that keeps the name
    # but not the dimensions is refused.
    renamed = replace(s, name="mine")
    assert not renamed.is_slice and renamed.base is renamed
    with pytest.raises(ValueError, match=r"not a slice of tiny-opt-post .*intermediate 48 \(expected 32\)"):
        replace(s, intermediate=48)


@pytest.mark.parametrize("bad", [0, 0.0, -0.125, 1.5, 2, float("nan"), float("inf"), True, "0.5", None])
def test_with_width_refuses_bad_fractions(bad):
    with pytest.raises(ValueError, match=r"^llama2-7b: width fraction must be a number in \(0, 1\], got .*"
                                         r"llama2-7b\[w0\.125\]"):
        get_model("llama2-7b[1L]").with_width(bad)


def test_with_width_refuses_a_fraction_below_one_head():
    with pytest.raises(ValueError, match=r"^llama2-7b: width fraction 0\.01 leaves 0\.32 of its 32 attention "
                                         r"heads .*at least 0\.03125 \(one head\), e\.g\. llama2-7b\[w0\.03125\]"):
        get_model("llama2-7b").with_width(0.01)
    with pytest.raises(ValueError, match="at least 0.07143"):
        get_model("qwen2.5-0.5b[w0.03]")
    for name in model_names():  # the suggested smallest width works
        m = get_model(name)
        least = get_model(f"{name}[1L][w{1 / m.heads:.4g}]")
        assert least.heads == 1 and least.layers == 1
    assert get_model("llama2-7b").with_width(0.5 / 32).heads == 1  # half a head rounds up


@pytest.mark.parametrize("name", ["llama2-7b[1L", "llama2-7b]", "llama2-7b[]", "llama2-7b[x]", "llama2-7b[1L,]",
                                  "llama2-7b[1L,w0.125]", "llama2-7b[1L][2L]", "llama2-7b[w0.5][w0.25]",
                                  "llama2-7b[w1/8]", "llama2-7b[1.5L]", "llama2-7b[L1]", "llama2-7b[1L]x[w0.5]",
                                  "[1L]", "llama2-7b[w]", "llama2-7b[-1L]", "llama2-7b[[1L]]"])
def test_malformed_slice_names_say_the_syntax(name):
    with pytest.raises(UnknownModelError, match=r"malformed slice suffix.*e\.g\. llama2-7b\[1L\]\[w0\.125\]"):
        get_model(name)


def test_slice_names_out_of_range_and_unknown_bases():
    with pytest.raises(ValueError, match=r"1\.\.32"):
        get_model("llama2-7b[33L][w0.5]")
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        get_model("llama2-7b[w1.5]")
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        get_model("llama2-7b[w0]")
    with pytest.raises(UnknownModelError, match=r"unknown model 'llama3\[w0\.5\]'.*\[<n>L\]\[w<fraction>\]"):
        get_model("llama3[w0.5]")


@settings(max_examples=25)
@given(slice_cases(), st.booleans())
def test_torch_model_of_a_width_slice_has_the_shapes_parameters(case, depth):
    torch = pytest.importorskip("torch")
    from zfbench.real.model import build_model, count_parameters

    m, n, f = case
    s = m.with_width(f)
    s = s.with_layers(n) if depth else s
    model = build_model(s, device="meta")
    got = {name: tuple(p.shape) for name, p in model.named_parameters()}
    want = {x.name + ".weight": (x.rows, x.cols) for x in s.matrices()}
    want.update({v.name: (v.numel,) for v in s.vectors()})
    assert got == want
    assert count_parameters(model) == s.total_params
    assert isinstance(model.embed.embed_tokens.weight, torch.Tensor)


@pytest.mark.parametrize("name", ["tiny[w0.5]", "llama2-7b[1L][w0.03125]", "opt-350m[1L][w0.0625]",
                                  "qwen2.5-0.5b[1L][w0.07143]"])
def test_width_slice_trains(name):
    torch = pytest.importorskip("torch")
    from zfbench.real.model import build_model, count_parameters

    s = get_model(name)
    model = build_model(s, seed=0)
    assert count_parameters(model) == s.total_params
    ids = torch.randint(0, s.vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    loss = model(ids, labels=ids)
    loss.backward()
    assert torch.isfinite(loss) and loss.item() < math.log(s.vocab) + 1.0  # about uniform at init
    assert all(p.grad is not None for p in model.parameters())


def test_a_profile_holds_for_the_same_width_at_any_depth():
    """sims.settings.load_calibration accepts a profile only for the model it was measured
    on at the same width: per-block times of a 1/8-width slice are not full-width ones."""
    from zfbench.sims.settings import _same_width

    full = get_model("llama2-7b")
    assert _same_width("llama2-7b[1L]", full)
    assert _same_width("llama2-7b[1L]", get_model("llama2-7b[4L]"))
    assert not _same_width("llama2-7b[1L][w0.125]", full)
    assert _same_width("llama2-7b[1L][w0.125]", get_model("llama2-7b[w0.125]"))
    assert not _same_width("tinyllama-1.1b[1L]", full)
    assert not _same_width("no-such-model", full)
