"""DeepSpeed's `initialize` and engine surface on one rank (issue 46); the same scripts
under torchrun are tests/test_deepspeed_scripts.py.

At c057941 `initialize(args=args, model=model, model_parameters=..., config=...)` was a
TypeError (no keyword `args`) and `engine.train_micro_batch_size_per_gpu()` an
AttributeError; here DeepSpeed's call returns its four values, each argument is honoured
or refused in one line naming it, and the getters hold the config's numbers."""

import argparse
import json
import warnings

import pytest
import torch

from engine_helpers import BiasMLP, batches, params_of
import zfbench.real as deepspeed
from zfbench.real import Engine, InitializeError
from zfbench.real.lr_schedule import WarmupLR

CPU = dict(device="cpu", device_threads=1, host_threads=1)
CONFIG = {"train_batch_size": 8, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
                                                       "warmup_max_lr": 1e-2,
                                                       "warmup_num_steps": 3}}}
NO_OPT = {"train_batch_size": 4}


def ds(model=None, **kw):
    kw.setdefault("config", CONFIG)
    return deepspeed.initialize(model=model or BiasMLP(), **kw, **CPU)


def test_the_canonical_call_returns_engine_optimizer_loader_and_schedule(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(CONFIG))
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", str(path)])
    model = BiasMLP()
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), **CPU)
    assert isinstance(engine, Engine) and loader is None
    assert optimizer is engine.optimizer and scheduler is engine.lr_scheduler
    assert isinstance(scheduler, WarmupLR)
    assert (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
            engine.gradient_accumulation_steps()) == (8, 4, 2)
    assert engine.module is model and engine.local_rank == 0 and engine.world_size == 1
    assert engine.device == torch.device("cpu") and engine.global_steps == 0
    assert engine.get_lr() == [0.0]
    data = batches(batch=4)
    seen = []
    for _ in range(6):  # 3 optimizer steps of 2 micro-steps
        ids, labels = next(data)
        seen.append(engine.is_gradient_accumulation_boundary())
        engine.backward(engine(ids, labels=labels))  # keywords go through
        engine.step()
    assert seen == [False, True] * 3 and engine.global_steps == 3
    assert engine.get_lr() == pytest.approx([1e-2])  # warm-up of 3 over: the max
    assert engine.global_samples == 24 and engine.was_step_applied()
    assert engine.eval() is engine and not model.training and engine.train().training
    engine.close()


def test_the_short_form_returns_the_engine_and_takes_no_deepspeed_argument():
    engine = deepspeed.initialize(BiasMLP(), NO_OPT, **CPU)
    assert isinstance(engine, Engine) and engine.train_micro_batch_size_per_gpu() == 4
    engine.close()
    assert isinstance(deepspeed.initialize(BiasMLP(), config=NO_OPT, **CPU), Engine)
    with pytest.raises(TypeError, match="short form"):
        deepspeed.initialize(BiasMLP(), NO_OPT, training_data=[1])
    with pytest.raises(TypeError, match="short form"):
        deepspeed.initialize(BiasMLP(), model=BiasMLP())
    # DeepSpeed's positional order when the first argument is not a model
    engine, *_ = deepspeed.initialize(None, BiasMLP(), config=NO_OPT, **CPU)
    assert isinstance(engine, Engine)


@pytest.mark.parametrize("kwargs, argument, why", [
    (dict(mpu=object()), "mpu", "model parallelism"),
    (dict(mesh_param=(2, 1)), "mesh_param", "data parallel only"),
    (dict(config=None), "config", "none given"),
    (dict(config=NO_OPT, config_params=NO_OPT), "config", "give exactly one"),
    (dict(collate_fn=list), "collate_fn", "pass training_data too"),
    (dict(training_data=iter(range(3))), "training_data", "no length"),
    (dict(lr_scheduler=lambda opt: None), "lr_scheduler", "beside the config's"),
    (dict(distributed_port=12345), "distributed_port", "launch with torchrun"),
    (dict(model_parameters=[torch.nn.Parameter(torch.zeros(1))]), "model_parameters",
     "0 of the model's"),
])
def test_what_zfbench_cannot_honour_is_refused_naming_the_argument(kwargs, argument, why):
    with pytest.raises(InitializeError, match=why) as info:
        ds(**kwargs)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"initialize: {argument}: ")
    assert "\n" not in str(info.value)


def _groups(model, decay=(0.0, 0.01)):
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n.endswith("bias")], "weight_decay": decay[0]},
            {"params": [p for n, p in named if not n.endswith("bias")],
             "weight_decay": decay[1]}]


@pytest.mark.parametrize("make, why", [
    (lambda m: torch.optim.SGD(m.parameters(), lr=0.1), "a SGD cannot be offloaded"),
    (lambda m: torch.optim.Adam(m.parameters(), weight_decay=0.1), "use torch.optim.AdamW"),
    (lambda m: torch.optim.AdamW(m.parameters(), amsgrad=True), "amsgrad=True"),
    (lambda m: torch.optim.AdamW(_groups(m)), "different weight_decay"),
    (lambda m: torch.optim.AdamW(m.up.parameters()), "of the model's"),
])
def test_an_optimizer_zfbench_cannot_offload_is_refused_with_the_reason(make, why):
    model = BiasMLP()
    with pytest.raises(InitializeError, match=why) as info:
        ds(model, optimizer=make(model), config=NO_OPT)
    assert info.value.argument == "optimizer"
    with pytest.raises(InitializeError, match="beside the config's 'optimizer'"):
        ds(model, optimizer=torch.optim.AdamW(model.parameters()))


def test_a_scripts_adamw_becomes_the_engines_and_trains_as_torch_does():
    """A fresh torch AdamW (or a callable building one, or param groups that agree): its
    hyper-parameters run on zfbench's AdamW; the result equals torch AdamW's."""
    model, twin = BiasMLP(), BiasMLP()
    opt = torch.optim.AdamW(_groups(model, (0.05, 0.05)), lr=3e-3, betas=(0.8, 0.99))
    engine, optimizer, _, _ = ds(model, optimizer=opt, config={"train_batch_size": 4})
    o = engine.config.optimizer
    assert (o.lr, o.betas, o.weight_decay) == (3e-3, (0.8, 0.99), 0.05)
    ref = torch.optim.AdamW(twin.parameters(), lr=3e-3, betas=(0.8, 0.99), weight_decay=0.05)
    data, again = batches(), batches()
    for _ in range(4):
        ids, labels = next(data)
        engine.backward(engine(ids, labels))
        engine.step()
        ids, labels = next(again)
        twin(ids, labels).backward()
        ref.step()
        ref.zero_grad()
    engine.close()
    for name, p in params_of(twin).items():
        assert torch.allclose(params_of(model)[name], p, atol=1e-6), name
    built, *_ = ds(optimizer=lambda params: torch.optim.AdamW(params, lr=7e-4),
                   config={"train_batch_size": 4})
    assert built.config.optimizer.lr == 7e-4 and built.get_lr() == [7e-4]
    built.close()
    with pytest.raises(RuntimeError, match="call engine.step"):
        optimizer.step()


def test_a_callable_lr_scheduler_drives_the_engines_lr_without_torch_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine, optimizer, _, sched = ds(
            config=NO_OPT, lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(
                opt, lambda k: 1.0 / (k + 1)))
        data = batches()
        for k in range(3):
            assert engine.get_lr() == pytest.approx([1e-3 / (k + 1)])
            ids, labels = next(data)
            engine.backward(engine(ids, labels))
            engine.step()
            assert engine.step_log[-1]["lr"] == pytest.approx(1e-3 / (k + 1))
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    engine.close()
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.AdamW(BiasMLP().parameters()), 1)
    with pytest.raises(InitializeError, match="pass a callable instead"):
        ds(config=NO_OPT, lr_scheduler=scheduler)


def test_training_data_gets_a_distributed_loader_of_the_micro_batch():
    rows = [(torch.full((6,), i), torch.full((6,), i)) for i in range(10)]
    engine, _, loader, _ = ds(training_data=rows,
                              config={**NO_OPT, "dataloader_drop_last": True})
    assert isinstance(loader.data_sampler, torch.utils.data.DistributedSampler)
    assert loader.batch_size == 4 and engine.training_dataloader is loader
    got = [ids[:, 0].tolist() for ids, _ in loader]
    assert len(got) == 2 and all(len(b) == 4 for b in got)  # 10 rows, last 2 dropped
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0)).tolist()
    assert sum(got, []) == perm[:8]  # DistributedSampler's default: shuffled, seed 0
    _, _, loader, _ = ds(training_data=rows, config=NO_OPT,
                         collate_fn=lambda b: len(b))
    assert list(loader) == [4, 4, 2]


def _train(engine, data, steps):
    losses = []
    for _ in range(steps):
        ids, labels = next(data)
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("strategy", ["zero-offload-dpu", "zenflow"])
def test_a_tagged_checkpoint_with_client_state_resumes_exactly(tmp_path, strategy):
    cfg = {**NO_OPT, "scheduler": {"type": "WarmupDecayLR", "params": {
        "warmup_max_lr": 1e-2, "warmup_num_steps": 4, "total_num_steps": 12}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "zfbench": {"strategy": strategy}}
    if strategy == "zenflow":
        cfg["zero_optimization"]["zenflow"] = {"topk_ratio": 0.25, "update_interval": 3,
                                               "select_strategy": "step",
                                               "select_interval": 6}
    engine, *_ = ds(config=cfg)
    data = batches()
    first = _train(engine, data, 5)
    assert engine.save_checkpoint(tmp_path, tag="mid", client_state={"epoch": 3})
    assert (tmp_path / "latest").read_text() == "mid"
    rest = _train(engine, data, 6)
    engine.finish()
    engine.close()
    resumed, *_ = ds(config=cfg)
    path, client = resumed.load_checkpoint(tmp_path)  # tag None: `latest`
    assert client == {"epoch": 3} and path.endswith("mid/zfbench_engine.pt")
    assert resumed.global_steps == 5
    assert resumed.get_lr() == [engine.step_log[5]["lr"]]  # mid-warm-up, restored
    again = batches()
    for _ in first:  # the batches of the first 5 steps, consumed before the save
        next(again)
    assert _train(resumed, again, 6) == rest
    resumed.finish()
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(),
                                                  engine.model.parameters()))
    resumed.close()


def test_checkpoint_arguments_zfbench_cannot_honour_are_refused(tmp_path):
    engine, *_ = ds(config=NO_OPT)
    with pytest.warns(UserWarning, match="no 'latest' file"):
        assert engine.load_checkpoint(tmp_path) == (None, None)
    engine.save_checkpoint(tmp_path)  # DeepSpeed's default tag
    assert (tmp_path / "latest").read_text() == "global_step0"
    with pytest.raises(ValueError, match="load_module_only=True is not supported"):
        engine.load_checkpoint(tmp_path, load_module_only=True)
    with pytest.raises(ValueError, match="a tag names one folder"):
        engine.save_checkpoint(tmp_path, tag="a/b")
    engine.close()
