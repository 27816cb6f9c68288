"""Every DeepSpeed config key is applied, ignored with a warning, or refused with a reason.

Configs are written here the way DeepSpeedExamples and the HF Trainer write them."""
import json

import pytest

from zfbench.core.config import AutoValues, ConfigError, load_config
from zfbench.core.config_auto import (HF_DEFAULT_EPS, HF_DEFAULT_LR, HF_DEFAULT_MAX_GRAD_NORM,
                                 HF_DEFAULT_WEIGHT_DECAY, derive_batch)
from zfbench.core.config_keys import APPLIED, IGNORED, KEY_RULES, REFUSED, treatment_table

# DeepSpeedExamples training/DeepSpeed-ZenFlow/finetuning: its ZenFlow config's keys
DS_EXAMPLES_ZENFLOW = {
    "train_batch_size": 32, "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2,
                          "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "zenflow": {"topk_ratio": 0.1, "update_interval": 4,
                                      "full_warm_up_rounds": 0, "overlap_step": True}},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.999],
                                              "eps": 1e-8, "weight_decay": 0.01}},
    "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
    "zero_allow_untested_optimizer": True}

# the HF Trainer's ZeRO-2 template with "auto" where the Trainer fills values
HF_ZERO2_AUTO = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
                                              "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto",
                                                 "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                            "pin_memory": True},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8,
                          "overlap_comm": True, "reduce_scatter": True,
                          "reduce_bucket_size": "auto", "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "steps_per_print": 2000, "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}


def test_deepspeed_examples_zenflow_config_runs_as_written():
    c = load_config(DS_EXAMPLES_ZENFLOW)
    assert (c.micro_batch, c.grad_accum, c.train_batch_size) == (32, 1, 32)
    assert c.strategy == "zenflow" and c.precision == "bf16" and c.pin_memory
    zf = c.zenflow
    assert (zf.topk_ratio, zf.update_interval, zf.full_warm_up_rounds, zf.overlap_step) == \
        (0.1, 4, 0, True)
    assert (c.optimizer.lr, c.optimizer.weight_decay, c.gradient_clipping) == \
        (2e-5, 0.01, 1.0)
    assert c.notes == ("zero_allow_untested_optimizer: ignored (zfbench's optimizers are "
                       "all tested)",)
    # two ranks: train_batch_size 32 = 16 per rank x 1 x 2, as DeepSpeed derives it
    assert load_config(DS_EXAMPLES_ZENFLOW, world_size=2).micro_batch == 16


def test_hf_trainer_auto_values_resolve_as_the_trainer_fills_them():
    c = load_config(HF_ZERO2_AUTO, world_size=2,
                    auto=AutoValues(micro_batch=3, grad_accum=2, precision="bf16"))
    assert (c.micro_batch, c.grad_accum, c.train_batch_size) == (3, 2, 12)
    assert c.precision == "bf16"
    o = c.optimizer
    assert (o.lr, o.betas, o.eps, o.weight_decay) == (HF_DEFAULT_LR, (0.9, 0.999),
                                                       HF_DEFAULT_EPS,
                                                       HF_DEFAULT_WEIGHT_DECAY)
    assert c.gradient_clipping == HF_DEFAULT_MAX_GRAD_NORM
    named = {n.split(":")[0] for n in c.notes}
    assert {"steps_per_print", "wall_clock_breakdown"} <= named
    # the scheduler applies, its "auto" filled as the Trainer fills it (warmup_steps 0:
    # DeepSpeed raises a warm-up below 2 to 2)
    s = c.scheduler
    assert (s.type, s.warmup_min_lr, s.warmup_max_lr, s.warmup_num_steps) == \
        ("WarmupLR", 0.0, HF_DEFAULT_LR, 2)
    # applied now (gradient buckets during backward), so not among the ignored keys
    assert c.overlap_comm is True and c.bucket_elems == 500_000_000
    # fp16 when the run asks for it, and then its loss-scale keys apply
    c16 = load_config(HF_ZERO2_AUTO, auto=AutoValues(precision="fp16"))
    assert c16.precision == "fp16" and c16.loss_scale.initial_scale_power == 16


def test_keys_deepspeed_accepts_are_applied_or_ignored_with_a_reason():
    c = load_config({"activation_checkpointing": {"partition_activations": False},
                     "communication_data_type": "bf16",
                     "zero_optimization": {"stage": 2, "offload_optimizer": {
                         "device": "cpu", "buffer_count": 4}}})
    assert c.comm_dtype == "bf16" and c.strategy == "zero-offload"
    notes = "\n".join(c.notes)
    for key, why in (("activation_checkpointing", "deepspeed.checkpointing"),
                     ("zero_optimization.offload_optimizer.buffer_count", "nvme")):
        assert f"{key}: ignored" in notes and why in notes


@pytest.mark.parametrize("key", sorted(k for k, r in KEY_RULES.items()
                                       if r.treatment == IGNORED))
def test_every_ignored_key_is_named_in_a_warning(key):
    d = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    *path, last = key.split(".")
    node = d
    for part in path:
        node = node.setdefault(part, {})
    node[last] = 7
    c = load_config(d)
    assert any(n.startswith(f"{key}: ignored (") for n in c.notes), c.notes


@pytest.mark.parametrize("key", sorted(k for k, r in KEY_RULES.items()
                                       if r.treatment == REFUSED))
def test_every_refused_key_names_itself_and_what_to_do(key):
    d = {}
    *path, last = key.split(".")
    node = d
    for part in path:
        node = node.setdefault(part, {})
    node[last] = {"enabled": True, "x": 1} if "." not in key else 7
    with pytest.raises(ConfigError) as info:
        load_config(d)
    assert info.value.key == key
    assert "zfbench does not implement this" in str(info.value)
    assert "remove it" in str(info.value) or "instead" in str(info.value) or \
        "set it" in str(info.value)


@pytest.mark.parametrize("key, value", [
    ("prescale_gradients", False), ("gradient_predivide_factor", 1.0),
    ("optimizer.params.amsgrad", False), ("zero_optimization.offload_optimizer.ratio", 1.0),
    ("amp", {"enabled": False}), ("sparse_gradients", False)])
def test_refused_keys_at_their_harmless_value_are_accepted(key, value):
    d = {}
    *path, last = key.split(".")
    node = d
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    assert load_config(d).notes == ()


def test_batch_rule_derives_the_third_of_three():
    assert derive_batch({"train_batch_size": 32, "gradient_accumulation_steps": 4}, 2) == \
        (4, 4)
    assert derive_batch({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4},
                        2) == (4, 4)
    assert derive_batch({"train_micro_batch_size_per_gpu": 4}, 8) == (4, 1)
    with pytest.raises(ConfigError, match="multiple of gradient_accumulation_steps"):
        derive_batch({"train_batch_size": 30, "gradient_accumulation_steps": 4}, 2)


def test_the_docs_table_is_the_table_in_the_code():
    from pathlib import Path
    doc = (Path(__file__).parent.parent / "docs" / "config_keys.md").read_text()
    assert treatment_table() in doc
    assert {r.treatment for r in KEY_RULES.values()} == {APPLIED, IGNORED, REFUSED}


def test_a_config_file_and_the_same_dict_agree(tmp_path):
    path = tmp_path / "zf.json"
    path.write_text(json.dumps(DS_EXAMPLES_ZENFLOW))
    assert load_config(path) == load_config(DS_EXAMPLES_ZENFLOW)
