"""A causal-LM fine-tune in the style of DeepSpeed's ZenFlow example
(DeepSpeedExamples training/DeepSpeed-ZenFlow/finetuning): ZenFlow from the config, the
script's own DataLoader with a DistributedSampler and the engine's micro-batch, an
HF-style model whose forward takes `**batch` and returns an object with `.loss`.

Only the import line differs from a DeepSpeed script. The model is zfbench's `tiny`
decoder (standing in for AutoModelForCausalLM, so nothing is downloaded) and the text is
a counting pattern from random starts (learnable in a few steps). Rank 0 writes the loss of every micro-step (averaged over the ranks) and
the lr of every optimizer step to --out.

    torchrun --nproc-per-node 2 finetune_causal_lm.py \
        --deepspeed_config ds_config_zenflow.json --out losses.json
"""

import argparse
import json
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

import zfbench.real as deepspeed  # was: import deepspeed
from zfbench.core.models import get_model
from zfbench.real.model import build_model

SEQ = 16


class CausalLM(torch.nn.Module):
    """What AutoModelForCausalLM gives a script: forward(input_ids, labels) -> .loss."""

    def __init__(self):
        super().__init__()
        self.model = build_model(get_model("tiny"), seed=0)

    def forward(self, input_ids, labels=None, attention_mask=None):
        return SimpleNamespace(loss=self.model(input_ids, labels))


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, rows: int, vocab: int):
        gen = torch.Generator().manual_seed(7)
        starts = torch.randint(0, vocab, (rows, 1), generator=gen)
        self.tokens = (starts + 3 * torch.arange(SEQ + 1)) % vocab

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        row = self.tokens[i]
        return {"input_ids": row[:-1], "labels": row[1:],
                "attention_mask": torch.ones(SEQ, dtype=torch.long)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--num_train_epochs", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed()

    model = CausalLM()
    model_engine, optimizer, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters())
    dataset = TokenDataset(64, get_model("tiny").vocab)
    sampler = DistributedSampler(dataset) if dist.is_initialized() else \
        DistributedSampler(dataset, num_replicas=1, rank=0)
    loader = DataLoader(dataset, batch_size=model_engine.train_micro_batch_size_per_gpu(),
                        sampler=sampler)
    model_engine.train()
    losses, lrs = [], []
    for epoch in range(args.num_train_epochs):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            batch = {k: v.to(model_engine.device) for k, v in batch.items()}
            if model_engine.is_gradient_accumulation_boundary():
                lrs.append(model_engine.get_lr()[0])
            outputs = model_engine(**batch)
            loss = outputs.loss
            model_engine.backward(loss)
            model_engine.step()
            seen = loss.detach().clone()
            if dist.is_initialized():
                dist.all_reduce(seen)
                seen /= dist.get_world_size()
            losses.append(float(seen))
            if model_engine.global_rank == 0 and model_engine.global_steps % 4 == 0 and \
                    step % model_engine.gradient_accumulation_steps() == 1:
                print(f"step {model_engine.global_steps} loss {losses[-1]:.4f} "
                      f"lr {model_engine.get_lr()[0]:.2e}")
    if model_engine.global_rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "lrs": lrs, "steps": model_engine.global_steps},
                      f)


if __name__ == "__main__":
    main()
