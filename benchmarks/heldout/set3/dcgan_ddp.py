"""A GAN under DDP: generator and discriminator each wrapped in DDP, two Adam optimizers, one
discriminator step then one generator step per iteration.

Follows pytorch/examples ``dcgan/main.py`` (``netD.zero_grad()``; ``errD_real = criterion(netD(real),
label)`` with ``real_label = 1``, ``errD_real.backward()``; ``noise = torch.randn(batch_size, nz, 1, 1)``,
``fake = netG(noise)``, ``errD_fake = criterion(netD(fake.detach()), label.fill_(fake_label))``,
``errD_fake.backward()``, ``optimizerD.step()``; ``netG.zero_grad()``, ``errG = criterion(netD(fake),
label.fill_(real_label))``, ``errG.backward()``, ``optimizerG.step()``; ``nn.BCELoss``, ``optim.Adam(...,
lr=opt.lr, betas=(opt.beta1, 0.999))`` with ``beta1 = 0.5``) made distributed as the DDP tutorial does
(``DDP(model)``, ``DistributedSampler``). MLPs stand for the convolutions and there is no BatchNorm
(per-rank batch statistics would differ from the one-device ones). Noise is drawn per iteration for
the global batch from a seeded generator and sliced per rank. A step is one ``optimizer.step()``:
six steps are three iterations (D, G, D, G, D, G).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import block, gen, rank

NZ, HID, DATA, ROWS, GLOBAL_BATCH, LR, BETA1 = 6, 24, 8, 48, 16, 5e-3, 0.5
ITERS = 3
STEPS = 2 * ITERS
CORRECT = {"default": (2, 4)}
BUGS = {
    "noise_same_seed": "every rank draws its noise from a generator seeded with the same seed (the same noise rows)",
    "no_dist_sampler": "the real rows read with shuffle=False and no DistributedSampler: every rank the same rows",
    "d_not_ddp": "only netG wrapped in DDP; netD a plain module whose gradients are never all-reduced",
    "g_no_zero_grad": "netG.zero_grad() left out: the generator's gradients pile up over iterations",
    "g_detached_fake": "errG computed on fake.detach() (reused from the D step): the generator gets no gradient",
    "g_module_bypass": "fake = netG.module(noise) in the D step (sampling through the inner module): G's gradients never all-reduced",
    "d_zero_grad_after_real": "netD.zero_grad() placed after errD_real.backward(): the real half of D's gradient dropped",
}


def generator() -> nn.Module:
    return nn.Sequential(nn.Linear(NZ, HID), nn.ReLU(), nn.Linear(HID, DATA), nn.Tanh())


def discriminator() -> nn.Module:
    return nn.Sequential(nn.Linear(DATA, HID), nn.LeakyReLU(0.2), nn.Linear(HID, 1), nn.Sigmoid())


def real_data() -> TensorDataset:
    g = gen(11)
    centers = torch.randn(4, DATA, generator=g) * 0.5
    x = centers[torch.randint(0, 4, (ROWS,), generator=g)] + 0.1 * torch.randn(ROWS, DATA, generator=g)
    return TensorDataset(x.tanh())


def noise(it: int) -> torch.Tensor:
    return torch.randn(GLOBAL_BATCH, NZ, generator=gen(200 + it))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP(netG), DDP(netD), the dcgan example's two steps per iteration."""
    netG = DDP(generator())
    netD = discriminator() if bug == "d_not_ddp" else DDP(discriminator())
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=LR, betas=(BETA1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=LR, betas=(BETA1, 0.999))
    data = real_data()
    local = GLOBAL_BATCH // world_size
    if bug == "no_dist_sampler":
        loader = DataLoader(data, batch_size=local, shuffle=False)
    else:
        loader = DataLoader(data, batch_size=local, sampler=DistributedSampler(data, shuffle=False))
    for it, (real,) in enumerate(loader):
        if it == ITERS:
            break
        # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
        if bug != "d_zero_grad_after_real":
            netD.zero_grad()
        label = torch.full((local, 1), 1.0)
        errD_real = criterion(netD(real), label)
        errD_real.backward()
        if bug == "d_zero_grad_after_real":
            netD.zero_grad()
        if bug == "noise_same_seed":
            z = torch.randn(local, NZ, generator=gen(200 + it))
        else:
            z = block(noise(it), rank(), world_size)
        fake = netG.module(z) if bug == "g_module_bypass" else netG(z)
        errD_fake = criterion(netD(fake.detach()), label.fill_(0.0))
        errD_fake.backward()
        optimizerD.step()
        # (2) Update G: maximize log(D(G(z)))
        if bug != "g_no_zero_grad":
            netG.zero_grad()
        out = netD(fake.detach() if bug == "g_detached_fake" else fake)
        errG = criterion(out, label.fill_(1.0))
        errG.backward()
        optimizerG.step()


def reference(world_size: int) -> None:
    """One device: the global batch of real rows and of noise, the same two steps."""
    netG, netD = generator(), discriminator()
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=LR, betas=(BETA1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=LR, betas=(BETA1, 0.999))
    data = real_data().tensors[0]
    local = GLOBAL_BATCH // world_size
    for it in range(ITERS):
        # DistributedSampler(shuffle=False) gives rank r the rows r, r + W, ...
        real = torch.cat([data[r::world_size][it * local:(it + 1) * local] for r in range(world_size)])
        netD.zero_grad()
        label = torch.full((GLOBAL_BATCH, 1), 1.0)
        criterion(netD(real), label).backward()
        fake = netG(noise(it))
        criterion(netD(fake.detach()), label.fill_(0.0)).backward()
        optimizerD.step()
        netG.zero_grad()
        criterion(netD(fake), label.fill_(1.0)).backward()
        optimizerG.step()
