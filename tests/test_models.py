"""Tests for zfbench.core.models: parameter totals, block structure, FLOPs, errors."""

import pytest

from zfbench.core.models import (
    MODELS,
    Block,
    Matrix,
    ModelShape,
    UnknownModelError,
    Vector,
    get_model,
    model_names,
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
