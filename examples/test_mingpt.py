"""A minGPT-like trainer, judged against the same training on one device.

``dist.assert_same_training(fn, reference_fn, spawn=True, record="optimizer")`` runs ``fn`` as an
``mp.spawn`` entry point in every rank and ``reference_fn`` in one process, both unchanged, and
compares them at every ``optimizer.step()``: the loss, every gradient and every parameter.
"""
import functools
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from pytest_mgpu import world_sizes


class TinyGPT(nn.Module):
    def __init__(self, vocab=16, block=8, d=32, heads=2, layers=1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block))

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(t))
        logits = self.head(self.ln(self.blocks(x, mask=self.mask[:t, :t], is_causal=True)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Tokens(Dataset):
    def __init__(self, n=64, block=8, vocab=16):
        self.data = torch.randint(0, vocab, (n, block + 1), generator=torch.Generator().manual_seed(9))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i, :-1], self.data[i, 1:]


def train(model, loader, epochs):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            model(x, y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()


def main(rank, world_size, batch_size=4, epochs=1):
    """The distributed script: an mp.spawn entry point with its own process group."""
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    init_process_group("gloo", rank=rank, world_size=world_size)
    data = Tokens()
    train(DDP(TinyGPT()), DataLoader(data, batch_size=batch_size, sampler=DistributedSampler(data)), epochs)
    destroy_process_group()


def one_device(world_size, batch_size=4, epochs=1):
    """The same training in one process: the global batch, in the order the ranks' shards make."""
    data = Tokens()
    sampler = DistributedSampler(data, num_replicas=1, rank=0)
    train(TinyGPT(), DataLoader(data, batch_size=batch_size * world_size, sampler=sampler), epochs)


@world_sizes(2)
def test_mingpt_trains_like_one_device(dist):
    w = dist.world_size
    report = dist.assert_same_training(functools.partial(main, world_size=w), functools.partial(one_device, w),
                                       steps=4, record="optimizer", spawn=True)
    assert report.passed
