"""SNGAN with the hinge loss, generator and discriminator each under DDP: every discriminator layer under
``torch.nn.utils.parametrizations.spectral_norm`` (one power iteration per training forward, its u / v
vectors buffers that DDP broadcasts from rank 0), Adam with betas (0, 0.9) for both, ``N_DIS``
discriminator steps per generator step. D step: ``relu(1 - D(x)).mean() + relu(1 + D(G(z).detach())).mean()``;
G step: ``-D(G(z)).mean()``. Latents are drawn for the global batch from a generator seeded per step and
each rank keeps its rows, as the one-device run draws them. Real data: a 2-D mixture of Gaussians.

The one-device reference: the same loop on the global batch.

Follows pfnet-research/sngan_projection ``updater.py`` (``loss_hinge_dis``: ``relu(1 - dis_real).mean() +
relu(1 + dis_fake).mean()``, ``loss_hinge_gen = -dis_fake.mean()``, n_dis discriminator updates per
generator update, Adam(alpha=2e-4, beta1=0.0, beta2=0.9)), ajbrock/BigGAN-PyTorch ``train_fns.py``
(``GAN_training_function``: D steps with ``G_z.detach()``-free no_grad fakes, then ``G.optim.zero_grad()`` and
the G loss) and ``torch/nn/utils/parametrizations.py`` (``spectral_norm``: ``_u`` / ``_v`` buffers, the
power method run in ``forward`` only in training mode).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils.parametrizations import spectral_norm

from .common import gen, rank

Z, H, GB, SEED = 4, 16, 8, 97
LR, N_DIS, ITERS = 1e-3, 2, 3
STEPS = ITERS * (N_DIS + 1)
CORRECT = {"default": (2, 4)}
BUGS = {
    "hinge_sign_flipped": "the D loss's fake term is relu(1 - D(fake)) instead of relu(1 + D(fake)): the hinge sign flipped",
    "d_grads_leak_into_g": "the D step's fakes are not detached and G's zero_grad is called before the D steps: D-loss gradients leak into G's step",
    "d_zero_grad_once": "the discriminator's zero_grad is called once before the n_dis loop: the second D step adds the first step's gradient",
    "g_betas_default": "the generator's Adam keeps the default betas (0.9, 0.999) instead of (0, 0.9)",
    "z_per_rank": "the latents are drawn from a generator seeded per rank instead of rows of the global draw",
    "d_lr_world": "the discriminator's lr is multiplied by the world size",
}


def nets():
    torch.manual_seed(SEED)
    g = nn.Sequential(nn.Linear(Z, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, 2))
    d = nn.Sequential(spectral_norm(nn.Linear(2, H)), nn.LeakyReLU(0.1), spectral_norm(nn.Linear(H, H)),
                      nn.LeakyReLU(0.1), spectral_norm(nn.Linear(H, 1)))
    return g, d


def real(step: int) -> torch.Tensor:
    g = gen(SEED + step)
    centers = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    return centers[torch.randint(0, 4, (GB,), generator=g)] + 0.2 * torch.randn(GB, 2, generator=g)


def latents(step: int, shift: int = 0) -> torch.Tensor:
    return torch.randn(GB, Z, generator=gen(SEED * 50 + step + shift))


def run(gm, dm, G, D, rows, bug=None, shift=0, d_scale=1) -> None:
    opt_g = torch.optim.Adam(gm.parameters(), lr=LR, betas=(0.9, 0.999) if bug == "g_betas_default" else (0.0, 0.9))
    opt_d = torch.optim.Adam(dm.parameters(), lr=LR * d_scale, betas=(0.0, 0.9))
    n = 0
    for it in range(ITERS):
        if bug == "d_grads_leak_into_g":
            opt_g.zero_grad()
        if bug == "d_zero_grad_once":
            opt_d.zero_grad()
        for _ in range(N_DIS):
            x = rows(real(n))
            z = rows(latents(n, shift))
            n += 1
            fake = G(z)
            if bug != "d_grads_leak_into_g":
                fake = fake.detach()
            fake_term = F.relu(1 - D(fake)) if bug == "hinge_sign_flipped" else F.relu(1 + D(fake))
            loss_d = F.relu(1 - D(x)).mean() + fake_term.mean()
            if bug != "d_zero_grad_once":
                opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
        z = rows(latents(1000 + it, shift))
        if bug != "d_grads_leak_into_g":
            opt_g.zero_grad()
        (-D(G(z)).mean()).backward()
        opt_g.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: G and D each under DDP, its block of every global batch."""
    r, lb = rank(), GB // world_size
    gm, dm = nets()
    run(gm, dm, DDP(gm), DDP(dm), lambda t: t[r * lb:(r + 1) * lb], bug,
        777 * (r + 1) if bug == "z_per_rank" else 0, world_size if bug == "d_lr_world" else 1)


def reference(world_size: int) -> None:
    """One device: the same loop on the global batch."""
    gm, dm = nets()
    run(gm, dm, gm, dm, lambda t: t)
