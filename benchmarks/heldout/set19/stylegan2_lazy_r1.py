"""StyleGAN2's training loop under DDP on tiny MLPs: a generator (mapping network to a style, then a
synthesis MLP to a 16-value "image") and a discriminator (LeakyReLU MLP), each wrapped in DDP, with the
non-saturating logistic loss and lazy R1 regularisation. Per iteration i: ``requires_grad(G, False)``,
``requires_grad(D, True)``; ``d_loss = softplus(-D(real)).mean() + softplus(D(G(z))).mean()``,
``D.zero_grad()``, backward, ``d_optim.step()``; every ``D_REG_EVERY`` iterations (``i % D_REG_EVERY ==
0``) a separate R1 step: ``real.requires_grad = True``, ``grad_real = autograd.grad(D(real).sum(), real,
create_graph=True)``, ``r1 = grad_real.pow(2).reshape(B, -1).sum(1).mean()``, ``D.zero_grad()``,
``(R1_GAMMA / 2 * r1 * D_REG_EVERY + 0 * real_pred[0]).backward()`` through the DDP discriminator,
``d_optim.step()``; then ``requires_grad(G, True)``, ``requires_grad(D, False)``, ``g_loss =
softplus(-D(G(z'))).mean()``, ``G.zero_grad()``, backward, ``g_optim.step()``; then the G EMA
(``accumulate(g_ema, G, 0.5 ** (32 / 10000))``, not trained). The discriminator's Adam is set for lazy
regularisation: ``lr * k / (k + 1)``, ``betas = (0 ** (k / (k + 1)), 0.99 ** (k / (k + 1)))``; the
generator's has no lazy term (path-length regularisation is left out, its ratio is 1). Every random draw
(real rows, both latent draws) is made for the global batch by a generator seeded per iteration; each
rank keeps its rows (the losses are means over the rank's rows, DDP averages).

The one-device reference: the same loop on the global batch.

Follows rosinality/stylegan2-pytorch ``train.py`` (``d_logistic_loss``, ``d_r1_loss``,
``g_nonsaturating_loss``, ``requires_grad``, ``accumulate``, ``d_regularize = i % args.d_reg_every == 0``,
``(args.r1 / 2 * r1_loss * args.d_reg_every + 0 * real_pred[0]).backward()``, ``d_reg_ratio =
args.d_reg_every / (args.d_reg_every + 1)`` and the Adam ``lr`` / ``betas`` scaled by it) and
NVlabs/stylegan2-ada-pytorch ``training/training_loop.py`` (lazy regularisation: ``mb_ratio = reg_interval
/ (reg_interval + 1)``, ``opt_kwargs.lr * mb_ratio``, ``betas = [beta ** mb_ratio ...]``) and
``training/loss.py`` (``Dreg``: ``r1_penalty * (r1_gamma / 2)`` times the interval via ``gain``).
"""
from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import autograd, nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

# the R1 double backward leaves final_linear's weight gradient with other strides than DDP's bucket view
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")

Z, WD_, IMG, H, GB, SEED = 8, 16, 16, 32, 16, 1904
LR, R1_GAMMA, D_REG_EVERY, EMA_DECAY = 0.01, 10.0, 2, 0.5 ** (32 / 10000)
ITERS = 3
STEPS = 2 * ITERS + len(range(0, ITERS, D_REG_EVERY))   # D and G steps, and the lazy R1 steps
CORRECT = {"default": (2, 4)}
BUGS = {
    "r1_not_scaled_by_interval": "the lazy R1 loss is not multiplied by d_reg_every: the penalty, applied every d_reg_every iterations only, is d_reg_every times too weak",
    "lazy_ratio_not_applied": "the discriminator's Adam uses the plain lr and betas instead of lr * k / (k + 1) and beta ** (k / (k + 1)) for lazy regularisation",
    "r1_grad_of_mean": "the R1 gradient is taken of real_pred.mean() instead of real_pred.sum(): each image's input gradient is divided by the batch size, the penalty by its square",
    "r1_without_zero_grad": "discriminator.zero_grad() is missing before the R1 backward: the R1 step re-applies the logistic loss's gradient already used by the preceding D step",
    "r1_bypasses_ddp": "the R1 pass runs the discriminator's inner module (discriminator.module) to avoid DDP with double backward: the R1 gradients are never all-reduced, each rank steps with its own",
    "latents_seeded_per_rank": "each rank draws its latent codes from a generator seeded with seed + rank instead of taking its rows of the global per-iteration draw",
    "r1_on_fake": "the R1 penalty is computed on the generated images (detached fakes) instead of the real images",
}


def requires_grad(model, flag=True):
    for p in model.parameters():
        p.requires_grad = flag


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.style = nn.Sequential(nn.Linear(Z, WD_), nn.LeakyReLU(0.2), nn.Linear(WD_, WD_), nn.LeakyReLU(0.2))
        self.synthesis = nn.Sequential(nn.Linear(WD_, H), nn.LeakyReLU(0.2), nn.Linear(H, IMG))

    def forward(self, z):
        return self.synthesis(self.style(z))


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(nn.Linear(IMG, H), nn.LeakyReLU(0.2), nn.Linear(H, H), nn.LeakyReLU(0.2))
        self.final_linear = nn.Linear(H, 1)

    def forward(self, x):
        return self.final_linear(self.convs(x))


def make_models():
    torch.manual_seed(SEED)
    g, d = Generator(), Discriminator()
    g_ema = copy.deepcopy(g).eval()
    return g, d, g_ema


def make_opts(g, d, bug=None):
    ratio = 1.0 if bug == "lazy_ratio_not_applied" else D_REG_EVERY / (D_REG_EVERY + 1)
    g_optim = torch.optim.Adam(g.parameters(), lr=LR, betas=(0.0, 0.99))
    d_optim = torch.optim.Adam(d.parameters(), lr=LR * ratio, betas=(0.0 ** ratio, 0.99 ** ratio))
    return g_optim, d_optim


def draws(i: int):
    g = gen(SEED + 100 * i)
    centre = torch.randn(4, IMG, generator=gen(SEED - 1))
    which = torch.randint(0, 4, (GB,), generator=g)
    real = centre[which] + 0.3 * torch.randn(GB, IMG, generator=g)
    return real, torch.randn(GB, Z, generator=g), torch.randn(GB, Z, generator=g)


def d_logistic_loss(real_pred, fake_pred):
    return F.softplus(-real_pred).mean() + F.softplus(fake_pred).mean()


def d_r1_loss(real_pred, real_img, bug=None):
    out = real_pred.mean() if bug == "r1_grad_of_mean" else real_pred.sum()
    grad_real, = autograd.grad(outputs=out, inputs=real_img, create_graph=True)
    return grad_real.pow(2).reshape(grad_real.shape[0], -1).sum(1).mean()


@torch.no_grad()
def accumulate(model1, model2, decay):
    for p1, p2 in zip(model1.parameters(), model2.parameters()):
        p1.mul_(decay).add_(p2, alpha=1 - decay)


def loop(generator, discriminator, g_plain, d_plain, g_ema, rows, bug=None):
    """rosinality's iterations; ``rows(i)`` this side's real images and both latent draws."""
    g_optim, d_optim = make_opts(g_plain, d_plain, bug)
    for i in range(ITERS):
        real_img, z_d, z_g = rows(i)
        requires_grad(g_plain, False)
        requires_grad(d_plain, True)
        fake_img = generator(z_d)
        fake_pred = discriminator(fake_img)
        real_pred = discriminator(real_img)
        d_loss = d_logistic_loss(real_pred, fake_pred)
        discriminator.zero_grad()
        d_loss.backward()
        d_optim.step()

        if i % D_REG_EVERY == 0:
            reg_img = (fake_img.detach() if bug == "r1_on_fake" else real_img).clone()
            reg_img.requires_grad = True
            d_reg = d_plain if bug == "r1_bypasses_ddp" else discriminator
            real_pred = d_reg(reg_img)
            r1_loss = d_r1_loss(real_pred, reg_img, bug)
            if bug != "r1_without_zero_grad":
                discriminator.zero_grad()
            every = 1 if bug == "r1_not_scaled_by_interval" else D_REG_EVERY
            (R1_GAMMA / 2 * r1_loss * every + 0 * real_pred[0]).backward()
            d_optim.step()

        requires_grad(g_plain, True)
        requires_grad(d_plain, False)
        fake_pred = discriminator(generator(z_g))
        g_loss = F.softplus(-fake_pred).mean()
        generator.zero_grad()
        g_loss.backward()
        g_optim.step()
        accumulate(g_ema, g_plain, EMA_DECAY)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP generator and discriminator, its rows of every draw."""
    r, lb = rank(), GB // world_size
    g, d, g_ema = make_models()
    generator, discriminator = DDP(g), DDP(d)

    def rows(i):
        real, z_d, z_g = (t[r * lb:(r + 1) * lb] for t in draws(i))
        if bug == "latents_seeded_per_rank":
            g_r = gen(SEED + 1000 * (i + 1) + r)
            z_d, z_g = torch.randn(lb, Z, generator=g_r), torch.randn(lb, Z, generator=g_r)
        return real, z_d, z_g

    loop(generator, discriminator, g, d, g_ema, rows, bug)


def reference(world_size: int) -> None:
    """One device: the same loop on the global batch."""
    g, d, g_ema = make_models()
    loop(g, d, g, d, g_ema, draws)
