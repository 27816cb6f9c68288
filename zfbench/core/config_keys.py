"""One rule for every DeepSpeed config key: applied, ignored with a warning, or refused.

`KEY_RULES` maps each dotted key that DeepSpeed accepts (and zfbench's own `zfbench.*`
section) to its treatment in zfbench:
- **applied**: parsed by `zfbench.core.config` and it changes what the engine does;
- **ignored**: it cannot change what zfbench measures (logging, NVMe-only knobs, ZeRO-3
  knobs below stage 3, ...). It is dropped and the run prints one warning naming it and
  why; `EngineConfig.notes` keeps the lines and `summary.json` records them;
- **refused**: it would change training in a way zfbench does not implement; the config
  is an error that says what to remove or set instead. Some keys are refused only for
  values that would matter (`refuse_unless`: e.g. `prescale_gradients: false` is fine).

`triage(d)` walks a config dict against the table: it returns the dict with ignored
keys removed and the warning lines; an unknown key is an error with a "did you mean".
`treatment_table()` renders the table for docs/config_keys.md (a test keeps them equal).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from zfbench.core.config_fields import ConfigError, _unknown

APPLIED, IGNORED, REFUSED = "applied", "ignored", "refused"


@dataclass(frozen=True)
class KeyRule:
    treatment: str
    note: str  # what zfbench does with it (applied) or why (ignored / refused)
    # refused keys: values for which the key is harmless (then it counts as applied)
    harmless: Callable[[object], bool] | None = None
    section: bool = False  # a JSON object whose own keys have rules


def _applied(note: str, section: bool = False) -> KeyRule:
    return KeyRule(APPLIED, note, section=section)


def _ignored(reason: str) -> KeyRule:
    return KeyRule(IGNORED, reason)


def _refused(reason: str, harmless: Callable[[object], bool] | None = None) -> KeyRule:
    return KeyRule(REFUSED, reason, harmless)


_LOGGING = "logging or monitoring only: it cannot change a measured number"
_NVME = "only read with offload_optimizer.device 'nvme'; zfbench offloads to CPU memory"
_STAGE3 = ("a ZeRO-3 memory or communication knob of DeepSpeed's partitioner; zfbench's "
           "ZeRO-3 (zenflow only, real/zero3.py) gathers each module's parameters whole "
           "before its forward and backward and releases them after, with no persistence, "
           "reuse or live-parameter limit")
_COMM = ("zfbench all-reduces the flat gradient (averaged), whole after backward or, with "
         "overlap_comm, bucket by bucket during backward; the all-gather and scatter "
         "variants are not modelled; with one rank there is no collective at all")
_is_false = (lambda v: v is False)  # noqa: E731

KEY_RULES: dict[str, KeyRule] = {
    # ---- batch
    "train_batch_size": _applied("= micro batch x gradient_accumulation_steps x ranks; "
                                 "any two of the three derive the third, as DeepSpeed does"),
    "train_micro_batch_size_per_gpu": _applied("rows per rank per forward"),
    "gradient_accumulation_steps": _applied("micro-steps per optimizer step: the loss is "
                                            "divided by it and the update happens at the "
                                            "boundary, as DeepSpeed does"),
    # ---- optimizer
    "optimizer": _applied("Adam or AdamW (ZenFlow's device and host updates are AdamW)",
                          section=True),
    "optimizer.type": _applied("'Adam' or 'AdamW'; other optimizers are refused"),
    "optimizer.params": _applied("the AdamW hyper-parameters", section=True),
    "optimizer.params.lr": _applied("learning rate; with a scheduler section the schedule "
                                    "sets it, as in DeepSpeed"),
    "optimizer.params.betas": _applied("AdamW betas"),
    "optimizer.params.eps": _applied("AdamW eps"),
    "optimizer.params.weight_decay": _applied("decoupled weight decay, the same on device "
                                              "and host"),
    "optimizer.params.adam_w_mode": _applied("must be true (decoupled decay) for AdamW"),
    "optimizer.params.torch_adam": _ignored("picks DeepSpeed's kernel; zfbench uses its "
                                            "own AdamW kernels, the same arithmetic"),
    "optimizer.params.fused": _ignored("picks DeepSpeed's kernel; zfbench chooses its own"),
    "optimizer.params.amsgrad": _refused("zfbench's AdamW has no AMSGrad; remove it or set "
                                         "it to false", _is_false),
    "optimizer.params.bias_correction": _refused("zfbench always bias-corrects; remove it "
                                                 "or set it to true", lambda v: v is True),
    "scheduler": _applied("the lr schedule, stepped after every applied optimizer step as "
                          "DeepSpeed steps it; it sets the lr of the device and the host "
                          "AdamW of every strategy", section=True),
    "scheduler.type": _applied("'WarmupLR' or 'WarmupDecayLR' (DeepSpeed's arithmetic); "
                               "OneCycle, LRRangeTest and WarmupCosineLR are refused"),
    "scheduler.params": _applied("warmup_min_lr, warmup_max_lr, warmup_num_steps, "
                                 "warmup_type, total_num_steps (WarmupDecayLR)"),
    # ---- precision
    "bf16": _applied("bf16 weights and gradients on the device, fp32 master on the host",
                     section=True),
    "bf16.enabled": _applied("precision bf16"),
    "bf16.immediate_grad_update": _ignored("a DeepSpeed bf16-optimizer option; zfbench's "
                                           "gradients land in one flat buffer either way"),
    "bf16.check_grad_overflow": _ignored("zfbench checks every step for non-finite "
                                         "gradients (zfbench.nonfinite)"),
    "fp16": _applied("fp16 weights and gradients with loss scaling", section=True),
    "fp16.enabled": _applied("precision fp16"),
    "fp16.loss_scale": _applied("0 = dynamic loss scaling, > 0 = this static scale"),
    "fp16.initial_scale_power": _applied("dynamic: the first scale is 2**power"),
    "fp16.loss_scale_window": _applied("dynamic: overflow-free steps before the scale "
                                       "doubles"),
    "fp16.hysteresis": _applied("dynamic: overflows tolerated before the scale halves"),
    "fp16.consecutive_hysteresis": _applied("dynamic: refill the hysteresis after every "
                                            "overflow-free step"),
    "fp16.min_loss_scale": _applied("dynamic: the scale never drops below it"),
    "fp16.auto_cast": _refused("zfbench casts the whole model to fp16; remove it or set it "
                               "to false", _is_false),
    "amp": _refused("NVIDIA Apex AMP is not implemented; remove it and use bf16 or fp16 instead",
                    lambda v: isinstance(v, dict) and v.get("enabled", False) is False),
    "torch_autocast": _refused("torch autocast is not implemented; remove it and use bf16 or fp16 instead",
                               lambda v: isinstance(v, dict) and
                               v.get("enabled", False) is False),
    "gradient_clipping": _applied("global L2 norm clipping (host: of the window gradient)"),
    "communication_data_type": _applied("dtype of the gradient all-reduce with several "
                                        "ranks ('fp32', 'fp16', 'bf16'); with one rank "
                                        "there is no all-reduce"),
    "prescale_gradients": _refused("zfbench averages after one all-reduce; remove it or "
                                   "set it to false", _is_false),
    "gradient_predivide_factor": _refused("zfbench averages after one all-reduce; remove "
                                          "it or set it to 1.0", lambda v: v == 1.0),
    "gradient_allreduce_op": _refused(
        "zfbench averages the gradients over ranks ('mean', the default of DeepSpeed "
        "versions that have the key; 0.19.5 has none, later ones refuse 'sum' with "
        "ZenFlow); 'sum' is not implemented: remove it or set it to 'mean'",
        lambda v: isinstance(v, str) and v.lower() == "mean"),
    "sparse_gradients": _refused("sparse embedding gradients are not implemented; remove "
                                 "it or set it to false", _is_false),
    "data_types": _ignored("zfbench accumulates gradients in the model's dtype"),
    # ---- ZeRO
    "zero_optimization": _applied("stage, offload and ZenFlow", section=True),
    "zero_optimization.stage": _applied(
        "0 (device strategy only), 1 or 2: the optimizer state is sharded over ranks; "
        "gradients are all-reduced in both; 3 (zenflow, without zenflow.offload): the 16-bit "
        "parameters are sharded too, gathered per module and released, and the gradients "
        "reduce-scattered (docs/zenflow.md); the device strategy keeps stage 0's layout at "
        "every stage; 3 with zero-offload or zero-offload-dpu is refused"),
    "zero_optimization.offload_optimizer": _applied("device 'cpu' selects an offloading "
                                                    "strategy", section=True),
    "zero_optimization.offload_optimizer.device": _applied("'cpu' or 'none'; 'nvme' is "
                                                           "refused"),
    "zero_optimization.offload_optimizer.pin_memory": _applied(
        "pinned host buffers with CUDA; without CUDA there is nothing to pin"),
    "zero_optimization.offload_optimizer.ratio": _refused(
        "partial optimizer offload is not implemented; remove it or set it to 1.0",
        lambda v: v == 1.0),
    "zero_optimization.offload_optimizer.nvme_path": _ignored(_NVME),
    "zero_optimization.offload_optimizer.buffer_count": _ignored(_NVME),
    "zero_optimization.offload_optimizer.pipeline_read": _ignored(_NVME),
    "zero_optimization.offload_optimizer.pipeline_write": _ignored(_NVME),
    "zero_optimization.offload_optimizer.pipeline": _ignored(_NVME),
    "zero_optimization.offload_optimizer.fast_init": _ignored(_NVME),
    "zero_optimization.offload_optimizer.super_offload": _refused(
        "DeepSpeed's SuperOffload is not implemented; remove it or set it to false",
        _is_false),
    "zero_optimization.offload_optimizer.cpuadam_cores_perc": _ignored(
        "the share of cores DeepSpeed's SuperOffload CPU Adam binds; zfbench gives the "
        "host step all of a rank's cores on a GPU (half on the CPU lanes), ZenFlow's "
        "by zenflow.pt_reserved_cores_perc"),
    "zero_optimization.offload_param": _refused(
        "parameter offload (ZeRO-3 with offload_param: ZeRO-Infinity) is not in the engine (python -m zfbench.simulate "
        "--strategy zero-infinity simulates it): remove it or set its device to 'none'",
        lambda v: isinstance(v, dict) and v.get("device", "none") == "none"),
    "zero_optimization.zenflow": _applied("ZenFlow's knobs (docs/config_keys.md)",
                                          section=True),
    "zero_optimization.overlap_comm": _applied(
        "gradient buckets go down (d2h) during backward, as each is complete, for "
        "zero-offload and zenflow (real/grad_buckets.py); with several ranks each bucket "
        "is all-reduced first, in bucket order, and this rank's part of it goes down"),
    "zero_optimization.contiguous_gradients": _ignored("gradients always live in one flat "
                                                       "buffer in zfbench"),
    "zero_optimization.reduce_scatter": _ignored(_COMM),
    "zero_optimization.reduce_bucket_size": _applied(
        "elements per gradient bucket all-reduced and sent down during backward (with "
        "overlap_comm)"),
    "zero_optimization.allgather_partitions": _ignored(_COMM),
    "zero_optimization.allgather_bucket_size": _ignored(_COMM),
    "zero_optimization.round_robin_gradients": _ignored(_COMM),
    "zero_optimization.use_multi_rank_bucket_allreduce": _ignored(_COMM),
    "zero_optimization.load_from_fp32_weights": _ignored("checkpoints always hold the fp32 "
                                                         "master in zfbench"),
    "zero_optimization.elastic_checkpoint": _ignored("checkpoint layout only"),
    "zero_optimization.ignore_unused_parameters": _ignored("unused parameters get zero "
                                                           "gradients in the flat buffer"),
    "zero_optimization.sub_group_size": _ignored(_STAGE3),
    "zero_optimization.stage3_max_live_parameters": _ignored(_STAGE3),
    "zero_optimization.stage3_max_reuse_distance": _ignored(_STAGE3),
    "zero_optimization.stage3_prefetch_bucket_size": _applied(
        "ZeRO-3: the modules after the one in use are gathered ahead (in the order the "
        "first forward traced) while their elements stay within it; 0 gathers on demand"),
    "zero_optimization.prefetch_bucket_size": _applied(
        "the spelling of stage3_prefetch_bucket_size without the prefix"),
    "zero_optimization.stage3_param_persistence_threshold": _ignored(_STAGE3),
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": _ignored(_STAGE3),
    "zero_optimization.stage3_gather_fp16_weights_on_model_save": _ignored(_STAGE3),
    "zero_optimization.memory_efficient_linear": _ignored(_STAGE3),
    **{f"zero_optimization.{k}": _ignored(_STAGE3) for k in (
        "stage3_model_persistence_threshold", "stage3_module_granularity_threshold",
        "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential",
        "override_module_apply", "leaf_module",
        # the spellings without the stage3_ prefix DeepSpeed also accepts
        "param_persistence_threshold", "max_live_parameters",
        "max_reuse_distance", "gather_16bit_weights_on_model_save",
        "model_persistence_threshold", "module_granularity_threshold",
        "use_all_reduce_for_fetch_params", "allgather_sequential")},
    "zero_optimization.zero_hpz_partition_size": _refused(
        "ZeRO++ hierarchical partitioning is not implemented; remove it or set it to 1",
        lambda v: v == 1),
    "zero_optimization.zero_quantized_weights": _refused(
        "ZeRO++ quantized weights are not implemented; remove it or set it to false",
        _is_false),
    "zero_optimization.zero_quantized_gradients": _refused(
        "ZeRO++ quantized gradients are not implemented; remove it or set it to false",
        _is_false),
    "zero_optimization.cpu_offload": _refused("the pre-0.3.16 spelling; write "
                                              "offload_optimizer: {device: 'cpu'} instead"),
    "zero_optimization.cpu_offload_param": _refused(
        "the pre-0.3.16 spelling of offload_param (ZeRO-3, not implemented): remove it",
        _is_false),
    "zero_optimization.cpu_offload_use_pin_memory": _refused(
        "the pre-0.3.16 spelling; write offload_optimizer: {pin_memory: ...} instead",
        _is_false),
    "zero_optimization.legacy_stage1": _ignored("selects DeepSpeed's old stage-1 code; "
                                                "zfbench has one implementation"),
    "zero_optimization.zero_quantized_nontrainable_weights": _refused(
        "ZeRO++ quantized weights are not implemented; remove it or set it to false",
        _is_false),
    "zero_optimization.zeropp_loco_param": _refused(
        "ZeRO++ LoCo gradient compression is not implemented; remove it",
        lambda v: v is None),
    "zero_optimization.mics_shard_size": _refused(
        "MiCS sharding is not implemented; remove it or set it to -1", lambda v: v == -1),
    "zero_optimization.mics_hierarchical_params_gather": _refused(
        "MiCS sharding is not implemented; remove it or set it to false", _is_false),
    "zero_optimization.pipeline_loading_checkpoint": _ignored("checkpoint loading with "
                                                              "pipeline parallelism only"),
    "zero_optimization.log_trace_cache_warnings": _ignored(_LOGGING),
    "zero_optimization.enable_sanity_checks": _ignored("DeepSpeed's own debug checks"),
    "zero_optimization.save_muon_momentum_buffer_in_memory": _ignored(
        "only read with the Muon optimizer, which zfbench refuses"),
    # ---- things the model or the script would have to call
    "activation_checkpointing": _ignored("only acts when the model calls "
                                         "deepspeed.checkpointing; zfbench's models do not "
                                         "(the simulator has --activation-checkpointing)"),
    "zero_allow_untested_optimizer": _ignored("zfbench's optimizers are all tested"),
    "zero_force_ds_cpu_optimizer": _ignored("zfbench always runs its own host AdamW"),
    "dataloader_drop_last": _applied("drop_last of the loader initialize builds over "
                                     "training_data"),
    "checkpoint": _ignored("checkpoint layout only; zfbench writes one file per rank"),
    "compile": _ignored("torch.compile is not applied by zfbench"),
    "seq_parallel_communication_data_type": _ignored("no sequence parallelism in zfbench"),
    "aio": _ignored(_NVME),
    "pipeline": _refused("pipeline parallelism is not implemented; remove it"),
    "sparse_attention": _refused("sparse attention is not implemented; remove it"),
    "moe": _refused("mixture-of-experts is not implemented; remove it"),
    "curriculum_learning": _refused("changes the data; not implemented: remove it"),
    "data_efficiency": _refused("changes the data; not implemented: remove it"),
    "compression_training": _refused("changes the model; not implemented: remove it"),
    "progressive_layer_drop": _refused("changes the model; not implemented: remove it"),
    "elasticity": _refused("elastic batch sizes are not implemented; remove it"),
    "hybrid_engine": _refused("the RLHF hybrid engine is not implemented; remove it"),
    # ---- logging and monitoring
    **{k: _ignored(_LOGGING) for k in (
        "steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown",
        "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "flops_profiler",
        "timers", "autotuning")},
    # ---- zfbench's own section
    "zfbench": _applied("zfbench's own knobs", section=True),
    "zfbench.strategy": _applied("device | zero-offload | zero-offload-dpu | zenflow | auto"),
    "zfbench.nonfinite": _applied("'skip' or 'raise' on a NaN/inf gradient"),
    "zfbench.importance": _applied("ZenFlow column score: 'l1' or 'l2sq'"),
    "zfbench.select_comm": _applied("ZenFlow selection exchange: 'scores' or 'allgather'"),
    "zfbench.inplace_grads": _applied("weight gradients accumulated into the flat buffer "
                                      "(unset: on for the CPU lanes, off on CUDA)"),
    "zfbench.column_major": _applied("2-D weights and gradients stored column by column, "
                                     "so ZenFlow's selected columns are contiguous (false: "
                                     "row-major, to compare)"),
}

# ZenFlow's own keys (zfbench.core.config_zenflow parses them): all applied.
ZENFLOW_NOTES = {
    "topk_ratio": "share of each 2-D weight's columns updated on the device every step",
    "select_strategy": "'auto' | 'step' | 'epoch': how reselection is counted",
    "select_interval": "steps (or epochs) between reselections; 0 = select once",
    "update_interval": "host window U in steps, or 'auto' (adaptive)",
    "overlap_step": "host AdamW runs behind the next window's compute",
    "full_warm_up_rounds": "first W steps are plain synchronous offload steps",
    "auto_ratio": "share of 2-D weights whose test fires an adaptive boundary",
    "pt_reserved_cores_perc": "share of the rank's cores kept for the device (training) "
                              "lane, by DeepSpeed's rule: ceil(share x cores) for the "
                              "device lane, the rest for the host AdamW; where either side "
                              "would get none (0, 1, one core) both use every core",
    "offload": "the selected columns' Adam moments live in host memory and go to the "
               "device and back around each device update, in buckets of "
               "reduce_bucket_size elements; needs zero_optimization.overlap_comm true",
}
for _name, _note in ZENFLOW_NOTES.items():
    KEY_RULES[f"zero_optimization.zenflow.{_name}"] = _applied(_note)
KEY_RULES["zero_optimization.zenflow.steps_per_epoch"] = _ignored(
    "DeepSpeed fills it itself (internal); zfbench takes steps_per_epoch from the engine's "
    "argument")
def _children(prefix: str) -> list[str]:
    depth = prefix.count(".") + 1 if prefix else 0
    return [k.split(".")[-1] for k in KEY_RULES
            if k.count(".") == depth and (not prefix or k.startswith(prefix + "."))]


def triage(d: dict, prefix: str = "") -> tuple[dict, list[str]]:
    """(d without its ignored keys, one warning line per ignored key); refused and
    unknown keys raise ConfigError. d itself is not modified."""
    if not isinstance(d, dict):
        raise ConfigError(prefix or "config", f"got {d!r}; expected a JSON object")
    kept, notes = {}, []
    for key, value in d.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        rule = KEY_RULES.get(full)
        if rule is None:
            raise _unknown(full, str(key), _children(prefix))
        if value is None:  # null: not given, as DeepSpeed reads its optional fields
            continue
        if rule.section and not isinstance(value, dict) and rule.treatment != IGNORED:
            hint = (' (DeepSpeed\'s pre-0.3 true / false: write {"stage": 1} or '
                    '{"stage": 0})' if full == "zero_optimization" else "")
            raise ConfigError(full, f"got {value!r}; expected a JSON object{hint}")
        if rule.treatment == IGNORED:
            notes.append(f"{full}: ignored ({rule.note})")
            continue
        if rule.treatment == REFUSED and not (rule.harmless and rule.harmless(value)):
            raise ConfigError(full, f"zfbench does not implement this: {rule.note}")
        if rule.section and isinstance(value, dict):
            value, inner = triage(value, full)
            notes.extend(inner)
        if rule.treatment == APPLIED or rule.section:
            kept[key] = value
        # a harmless refused key (e.g. prescale_gradients: false) has nothing to apply
    return kept, notes


def treatment_table() -> str:
    """The Markdown table of every key and its treatment (docs/config_keys.md)."""
    lines = ["| key | treatment | what zfbench does, or why |", "|---|---|---|"]
    for key, rule in sorted(KEY_RULES.items()):
        what = rule.treatment + (" unless harmless" if rule.harmless else "")
        lines.append(f"| `{key}` | {what} | {rule.note} |")
    return "\n".join(lines)
