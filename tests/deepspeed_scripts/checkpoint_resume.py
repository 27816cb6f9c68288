"""Save and resume as DeepSpeed's checkpointing tutorial does it: `save_checkpoint(save_dir,
ckpt_id, client_state=client_sd)` every few steps, with the loss as the tag, and
`_, client_sd = load_checkpoint(load_dir, ckpt_id)` (no ckpt_id: the `latest` one) to
continue from `client_sd["step"]`.

Only the import line differs from a DeepSpeed script. With --save_dir the script trains
--steps optimizer steps and saves at every --save_interval; with --load_dir it resumes the
latest checkpoint and trains on to --steps. The model is a small MLP on random data;
the config (ZenFlow with overlap_step, WarmupDecayLR) is ds_config_zenflow.json, so a save
lands mid-window with a host update in flight. Rank 0 writes the loss of every
micro-step after the resume point (averaged over the ranks) to --out.
"""

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn as nn

import zfbench.real as deepspeed  # was: import deepspeed


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 24),
                                 nn.Tanh(), nn.Linear(24, 4))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.net(x), y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save_interval", type=int, default=3)
    parser.add_argument("--save_dir")
    parser.add_argument("--load_dir")
    parser.add_argument("--ckpt_id", default=None)
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.randn(64, 12, generator=gen),
                                          torch.randn(64, 4, generator=gen))
    model = MLP()
    model_engine, _, loader, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=data)
    step = 0
    if args.load_dir:
        _, client_sd = model_engine.load_checkpoint(args.load_dir, args.ckpt_id)
        step = client_sd["step"]
    losses, lrs = [], []
    micro = 0
    while model_engine.global_steps < args.steps:
        for x, y in loader:
            micro += 1
            if micro <= step * model_engine.gradient_accumulation_steps():
                continue  # the batches the checkpoint has seen
            if model_engine.is_gradient_accumulation_boundary():
                lrs.append(model_engine.get_lr()[0])
            loss = model_engine(x.to(model_engine.device), y.to(model_engine.device))
            model_engine.backward(loss)
            model_engine.step()
            seen = loss.detach().clone()  # summed over the ranks for the log
            world = dist.get_world_size() if dist.is_initialized() else 1
            if world > 1:
                dist.all_reduce(seen)
            losses.append(float(seen) / world)
            boundary = micro % model_engine.gradient_accumulation_steps() == 0
            if boundary and args.save_dir and \
                    model_engine.global_steps % args.save_interval == 0:
                client_sd = {"step": model_engine.global_steps}
                ckpt_id = f"{losses[-1]:.6f}"
                model_engine.save_checkpoint(args.save_dir, ckpt_id, client_state=client_sd)
            if model_engine.global_steps >= args.steps:
                break
    if model_engine.global_rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "start": step, "lrs": lrs}, f)


if __name__ == "__main__":
    main()
