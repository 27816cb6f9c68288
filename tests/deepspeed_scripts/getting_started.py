"""A training script written after DeepSpeed's getting-started (CIFAR-10) tutorial.

Only its import line differs from the DeepSpeed original (`import deepspeed`); run by
tests/test_deepspeed_scripts.py under `torchrun --nproc-per-node 2` and as one process.
The images are random tensors of CIFAR's shape, so nothing is downloaded. Rank 0 writes
the loss of every micro-step (averaged over the ranks) and the lr of every step to --out.

    torchrun --nproc-per-node 2 getting_started.py --deepspeed \
        --deepspeed_config ds_config_getting_started.json --out losses.json
"""

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import zfbench.real as deepspeed  # was: import deepspeed


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("--local_rank", type=int, default=-1,
                        help="local rank passed from distributed launcher")
    parser.add_argument("-e", "--epochs", default=2, type=int, help="number of epochs")
    parser.add_argument("--out", required=True, help="where rank 0 writes its losses")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        return self.fc2(F.relu(self.fc1(x)))


def main():
    args = add_argument()
    torch.manual_seed(0)  # every rank builds the same net and data (rank 0's wins anyway)
    gen = torch.Generator().manual_seed(1)
    trainset = torch.utils.data.TensorDataset(torch.randn(32, 3, 32, 32, generator=gen),
                                              torch.randint(0, 10, (32,), generator=gen))
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    model_engine, optimizer, trainloader, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset)
    criterion = nn.CrossEntropyLoss()
    losses, lrs = [], []
    for epoch in range(args.epochs):
        for i, data in enumerate(trainloader):
            inputs = data[0].to(model_engine.device)
            labels = data[1].to(model_engine.device)
            if model_engine.is_gradient_accumulation_boundary():
                lrs.append(model_engine.get_lr()[0])
            outputs = model_engine(inputs)
            loss = criterion(outputs, labels)
            model_engine.backward(loss)
            model_engine.step()
            seen = loss.detach().clone()
            if dist.is_initialized():  # the loss of the global batch, for the log
                dist.all_reduce(seen)
                seen /= dist.get_world_size()
            losses.append(float(seen))
    if model_engine.global_rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "lrs": lrs, "steps": model_engine.global_steps,
                       "batch": [model_engine.train_batch_size(),
                                 model_engine.train_micro_batch_size_per_gpu(),
                                 model_engine.gradient_accumulation_steps()]}, f)


if __name__ == "__main__":
    main()
