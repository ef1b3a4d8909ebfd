"""The reference documents' own distributed code, as their authors wrote it, for the user-code suites.

Seed 001 (a CPU DDP trainer launched with ``mp.spawn``, hard-coded ``MASTER_PORT``) is copied as it is,
except ``prepare_dataloader``, which downloaded MNIST: it builds MNIST-shaped synthetic data instead.
Seed 004's model-parallel ResNet50 lives in ``user_resnet.py`` (it imports torchvision, which ranks
running only seed 001 need not pay for).
"""
import os

import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

SAMPLES = 256  # synthetic "MNIST": enough for a few batches of 32 per rank


# ---- seed 001, "training code (full)" -----------------------------------------------------------
def ddp_setup(rank: int, world_size: int):
    """
    CPU를 위한 DDP 설정 함수
    """
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12555"
    init_process_group(backend="gloo", rank=rank, world_size=world_size)


class MLP(nn.Module):
    def __init__(self):
        super(MLP, self).__init__()
        self.fc1 = nn.Linear(28 * 28, 512)
        self.fc2 = nn.Linear(512, 10)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = x.view(-1, 28 * 28)
        x = self.relu(self.fc1(x))
        x = self.fc2(x)
        return x


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        train_data: torch.utils.data.DataLoader,
        optimizer: torch.optim.Optimizer,
        rank: int,
        save_every: int,
    ):
        self.rank = rank
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.model = DDP(self.model)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = nn.CrossEntropyLoss()(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def _save_checkpoint(self, epoch):
        ckp = self.model.module.state_dict()
        PATH = "checkpoint.pt"
        torch.save(ckp, PATH)
        print(f"Epoch {epoch} | Training checkpoint saved at {PATH}")

    def train(self, max_epochs: int):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_checkpoint(epoch + 1)


def synthetic_mnist(samples: int = SAMPLES):
    """MNIST-shaped data (1x28x28 images normalized as seed 001 does, 10 classes), no download."""
    g = torch.Generator().manual_seed(1234)
    images = (torch.rand(samples, 1, 28, 28, generator=g) - 0.1307) / 0.3081
    return torch.utils.data.TensorDataset(images, torch.randint(0, 10, (samples,), generator=g))


def prepare_dataloader(batch_size: int):
    dataset = synthetic_mnist()  # was: datasets.MNIST(root="./data", train=True, download=True, ...)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        sampler=DistributedSampler(dataset)
    )


def main(rank: int, world_size: int, total_epochs: int, save_every: int, batch_size: int):
    ddp_setup(rank, world_size)

    model = MLP()
    optimizer = optim.SGD(model.parameters(), lr=1e-3)
    train_data = prepare_dataloader(batch_size)

    print(f"Rank {rank} 시작")

    trainer = Trainer(model, train_data, optimizer, rank, save_every)
    trainer.train(total_epochs)

    destroy_process_group()


# ---- seed 001 with a fault: one rank's Trainer raises -------------------------------------------
class ShapeBugTrainer(Trainer):
    """Rank 1 feeds its batch flattened the wrong way: the MLP raises inside ``_run_batch``."""

    def _run_batch(self, source, targets):
        if self.rank == 1:
            source = source.view(source.size(0), -1)[:, :100]
        super()._run_batch(source, targets)


def main_with_bad_rank(rank: int, world_size: int, total_epochs: int, save_every: int, batch_size: int):
    ddp_setup(rank, world_size)
    model = MLP()
    optimizer = optim.SGD(model.parameters(), lr=1e-3)
    trainer = ShapeBugTrainer(model, prepare_dataloader(batch_size), optimizer, rank, save_every)
    trainer.train(total_epochs)
    destroy_process_group()


# ---- seed 001 on one device: what its main trains, as one process would ---------------------------
def one_device_main(world_size: int, total_epochs: int, batch_size: int):
    """Seed 001's training on one device, written as a user would for assert_same_training: the
    global batch (batch_size x world_size), drawn in the order the ranks' DistributedSampler shards
    make together (the same shuffle, unsharded), set_epoch every epoch, the same model and SGD."""
    dataset = synthetic_mnist()
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size * world_size, shuffle=False, sampler=sampler)
    model = MLP()
    optimizer = optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(total_epochs):
        sampler.set_epoch(epoch)
        for source, targets in loader:
            optimizer.zero_grad()
            loss = nn.CrossEntropyLoss()(model(source), targets)
            loss.backward()
            optimizer.step()
