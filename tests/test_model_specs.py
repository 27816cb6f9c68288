"""Written-out model shapes (zfbench.core.model_specs): gpt2:/llama: specs and config.json
paths through get_model, their parameter counts by hand, and their errors."""

import json
from dataclasses import replace

import pytest

from zfbench.core.model_specs import ModelSpecError, llama_ffn
from zfbench.core.models import MODELS, UnknownModelError, get_model
from zfbench.sims.costs import SimSettings, SimSettingsError


def gpt2_params(layers: int, hidden: int, vocab: int = 50257, positions: int = 1024) -> int:
    """By hand: per layer 4H^2 (attention) + 8H^2 (4H MLP) + 9H of biases + 4H of the two
    LayerNorms; token and position tables; the final LayerNorm; the head is tied."""
    h = hidden
    return layers * (12 * h * h + 13 * h) + (vocab + positions) * h + 2 * h


@pytest.mark.parametrize("layers,hidden,heads,published", [
    (48, 1600, 25, 1.558e9),   # GPT-2 XL, "1.5B" (1,557,611,200 parameters)
    (12, 768, 12, 124.4e6),    # GPT-2 small, "124M"
    (20, 2048, 16, None), (50, 4096, 16, None), (10, 8192, 16, None),
])
def test_gpt2_spec_counts_by_hand(layers, hidden, heads, published):
    shape = get_model(f"gpt2:layers={layers},hidden={hidden},heads={heads}")
    assert shape.total_params == gpt2_params(layers, hidden)
    if published is not None:
        assert shape.total_params == pytest.approx(published, rel=2e-3)
    assert shape.tied_embeddings and shape.max_positions == 1024 and shape.vocab == 50257
    assert shape.intermediate == 4 * hidden


def test_gpt2_10b_shape_is_ten_billion():
    # ZeRO-Offload Table 3's 10B: 50 layers of hidden 4096: 50 x (12 x 4096^2 + 13 x 4096)
    # = 10.07e9 in the layers, (50257 + 1024) x 4096 = 0.21e9 in the embeddings
    assert get_model("gpt2:layers=50,hidden=4096,heads=16").total_params == \
        pytest.approx(10.27e9, rel=2e-3)


def test_llama_spec_defaults_reproduce_llama2():
    for name, layers, hidden in (("llama2-7b", 32, 4096), ("llama2-13b", 40, 5120)):
        spec = get_model(f"llama:layers={layers},hidden={hidden},heads={hidden // 128}")
        preset = MODELS[name]
        assert spec.total_params == preset.total_params
        assert spec.intermediate == preset.intermediate
    assert llama_ffn(4096) == 11008 and llama_ffn(5120) == 13824


def test_llama_spec_optional_keys_by_hand():
    shape = get_model("llama:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=1000,tied=true")
    h, kv, f, v = 256, 2 * 64, 512, 1000
    per_layer = 2 * h * h + 2 * kv * h + 3 * h * f + 2 * h
    assert shape.total_params == 2 * per_layer + v * h + h
    assert shape.name == "llama:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=1000,tied=true"


@pytest.mark.parametrize("text", [
    "gpt2:layers=48,hidden=1600,heads=25", "GPT2: heads=25, hidden=1600, layers=48",
    "gpt2:layers=4,hidden=64,heads=4,positions=2048", "llama:layers=2,hidden=128,heads=4,kv_heads=1",
    "gpt2:layers=48,hidden=1600,heads=25[2L]"])
def test_spec_names_round_trip(text):
    shape = get_model(text)
    assert get_model(shape.name) == shape


def test_spec_slices_like_a_preset():
    full = get_model("gpt2:layers=48,hidden=1600,heads=25")
    assert get_model("gpt2:layers=48,hidden=1600,heads=25[2L]") == full.with_layers(2)
    assert full.with_layers(2).base == full


@pytest.mark.parametrize("text,says", [
    ("gpt2:layers=2,hiden=64,heads=4", "unknown key 'hiden'"),
    ("gpt2:layers=2,hidden=64", "missing key 'heads'; add heads="),
    ("gpt2:layers=2,hidden=64,heads=5", "not divisible by heads 5"),
    ("gpt2:layers=x,hidden=64,heads=4", "key 'layers' must be a positive integer"),
    ("gpt2:layers=0,hidden=64,heads=4", "key 'layers' must be a positive integer"),
    ("gpt2:layers=2,hidden=64,heads=4,heads=4", "key 'heads' is given twice"),
    ("gpt2:layers=2,hidden=64 heads=4", "must be a positive integer"),
    ("gpt2:layers=2,,hidden=64,heads=4", "empty item"),
    ("gpt2:layers,hidden=64,heads=4", "item 'layers' is not key=value"),
    ("gpt3:layers=2,hidden=64,heads=4", "unknown spec style 'gpt3'"),
    ("llama:layers=2,hidden=64,heads=4,kv_heads=3", "not divisible by kv_heads 3"),
    ("llama:layers=2,hidden=64,heads=4,tied=maybe", "key 'tied' must be true or false"),
    ("gpt2:layers=2,hidden=64,heads=4,kv_heads=2", "unknown key 'kv_heads'"),
])
def test_malformed_specs_name_the_key(text, says):
    with pytest.raises(ModelSpecError, match=says.replace("(", r"\(")):
        get_model(text)
    with pytest.raises(SimSettingsError, match=says.replace("(", r"\(")):
        SimSettings.from_knobs(model=text)


def test_spec_errors_are_unknown_model_errors():
    with pytest.raises(UnknownModelError):
        get_model("gpt2:layers=2")


def write(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_hf_gpt2_config(tmp_path):
    path = write(tmp_path, {"model_type": "gpt2", "n_layer": 48, "n_embd": 1600, "n_head": 25,
                            "vocab_size": 50257, "n_positions": 1024})
    shape, spec = get_model(path), get_model("gpt2:layers=48,hidden=1600,heads=25")
    assert replace(shape, name=spec.name) == spec and shape.total_params == 1_557_611_200
    assert get_model(shape.name) == shape


def test_hf_qwen2_config_matches_preset(tmp_path):
    # Qwen/Qwen2.5-1.5B's config.json fields
    path = write(tmp_path, {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28,
                            "num_attention_heads": 12, "num_key_value_heads": 2,
                            "intermediate_size": 8960, "vocab_size": 151936,
                            "tie_word_embeddings": True})
    assert get_model(path).total_params == MODELS["qwen2.5-1.5b"].total_params


def test_hf_opt_config_matches_preset(tmp_path):
    # facebook/opt-350m's config.json fields
    path = write(tmp_path, {"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24,
                            "num_attention_heads": 16, "ffn_dim": 4096, "vocab_size": 50272,
                            "max_position_embeddings": 2048, "word_embed_proj_dim": 512,
                            "do_layer_norm_before": False})
    assert get_model(path).total_params == MODELS["opt-350m"].total_params


@pytest.mark.parametrize("cfg,says", [
    ({"model_type": "bert"}, "model_type 'bert' is not supported"),
    ({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "vocab_size": 10}, "field 'n_head' must be a positive"),
    ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
      "head_dim": 32, "intermediate_size": 128, "vocab_size": 10}, "head_dim 32"),
])
def test_hf_config_errors(tmp_path, cfg, says):
    with pytest.raises(ModelSpecError, match=says):
        get_model(write(tmp_path, cfg))


def test_missing_config_file(tmp_path):
    with pytest.raises(ModelSpecError, match="no such file"):
        get_model(str(tmp_path / "nothere.json"))
