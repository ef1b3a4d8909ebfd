"""Masked-autoencoder pre-training under DDP: tiny images patchified, a linear patch embedding with
fixed positional embeddings, per-sample random masking (noise drawn for the GLOBAL batch by a seeded
generator and sliced per rank, ``argsort`` shuffle, the first ``len_keep`` kept, ``ids_restore`` to
unshuffle), a cls token, one encoder block (attention without biases: a key bias has no gradient), a one-block decoder with a learned mask token, the pixel-normalised
MSE over the removed patches (``norm_pix_loss``); AdamW with MAE's betas. Every row removes the same
number of patches, so the mean of the ranks' losses is the global batch's and DDP's average is right.

The one-device reference draws the noise for the global batch of each step.

Follows facebookresearch/mae ``models_mae.py`` (``MaskedAutoencoderViT.random_masking``: ``noise =
torch.rand(N, L)``, ``ids_shuffle = argsort(noise)``, ``ids_restore = argsort(ids_shuffle)``, ``len_keep =
int(L * (1 - mask_ratio))``, ``mask = gather(mask, ids_restore)``; ``forward_encoder`` adds ``pos_embed``
before masking; ``forward_loss`` with ``norm_pix_loss``: mean and var over the last dim, ``(loss *
mask).sum() / mask.sum()``), ``patchify``, and ``main_pretrain.py`` (AdamW, betas (0.9, 0.95)); the
same loss in MohammedSB/Harmony ``losses/mae_loss.py``.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

IMG, P, D, DD, N, GB, SEED = 8, 2, 16, 16, 24, 8, 31
LP = (IMG // P) ** 2          # 16 patches
PD = P * P                    # pixels per patch (1 channel)
RATIO, LR = 0.75, 3e-3
STEPS = 3   # N / GB
CORRECT = {"default": (2, 4)}
BUGS = {
    "noise_local_draw": "every rank draws the masking noise for its own rows from the same seeded generator instead of slicing the global draw",
    "restore_is_shuffle": "ids_restore is ids_shuffle (the second argsort is missing): the decoder unshuffles with the wrong permutation",
    "loss_on_visible": "the loss is taken over the kept (visible) patches instead of the removed ones",
    "norm_pix_batch_dim": "norm_pix_loss normalises the target with mean and var over the batch (dim 0, the rank's rows) instead of each patch's pixels",
    "keep_ratio_swapped": "len_keep = int(L * mask_ratio): 75% of the patches kept instead of 25%",
    "pos_after_masking": "the positional embedding is added after the masking, by slot: kept patches get the first slots' positions",
    "mask_not_restored": "the binary mask is not unshuffled with ids_restore: the loss is taken over the wrong patches",
}


def fixed_pos(n: int, d: int, seed: int) -> torch.Tensor:
    """A fixed (not learned) positional table, as MAE's sin-cos one: from a seeded generator."""
    pos = torch.arange(n).float().unsqueeze(1)
    freq = torch.exp(-torch.arange(0, d, 2).float() / d * 4.0)
    tab = torch.zeros(n, d)
    tab[:, 0::2], tab[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return tab.unsqueeze(0) + 0.0 * seed


class TinyMAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = nn.Linear(PD, D)
        self.cls_token = nn.Parameter(torch.randn(1, 1, D) * 0.02)
        self.register_buffer("pos_embed", fixed_pos(LP + 1, D, 0))
        self.attn = nn.MultiheadAttention(D, 2, bias=False, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.decoder_embed = nn.Linear(D, DD)
        self.mask_token = nn.Parameter(torch.randn(1, 1, DD) * 0.02)
        self.register_buffer("decoder_pos_embed", fixed_pos(LP + 1, DD, 1))
        self.decoder_norm = nn.LayerNorm(DD)
        self.decoder_attn = nn.MultiheadAttention(DD, 2, bias=False, batch_first=True)
        self.decoder_mlp = nn.Sequential(nn.LayerNorm(DD), nn.Linear(DD, 2 * DD), nn.GELU(), nn.Linear(2 * DD, DD))
        self.decoder_pred = nn.Linear(DD, PD)

    def random_masking(self, x, noise, bug=None):
        n, l, d = x.shape
        len_keep = int(l * (RATIO if bug == "keep_ratio_swapped" else 1 - RATIO))
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = ids_shuffle if bug == "restore_is_shuffle" else torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x_masked = torch.gather(x, 1, ids_keep.unsqueeze(-1).repeat(1, 1, d))
        mask = torch.ones(n, l)
        mask[:, :len_keep] = 0
        if bug != "mask_not_restored":
            mask = torch.gather(mask, 1, ids_restore)
        return x_masked, mask, ids_restore

    def forward(self, patches, noise, bug=None):
        x = self.patch_embed(patches)
        if bug != "pos_after_masking":
            x = x + self.pos_embed[:, 1:]
        x, mask, ids_restore = self.random_masking(x, noise, bug)
        if bug == "pos_after_masking":
            x = x + self.pos_embed[:, 1:x.shape[1] + 1]
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], 1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        x = self.decoder_embed(x)
        toks = self.mask_token.repeat(x.shape[0], LP + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:], toks], 1)
        x_ = torch.gather(x_, 1, ids_restore.unsqueeze(-1).repeat(1, 1, DD))
        x = torch.cat([x[:, :1], x_], 1) + self.decoder_pos_embed
        h = self.decoder_norm(x)
        x = x + self.decoder_attn(h, h, h, need_weights=False)[0]
        x = x + self.decoder_mlp(x)
        return self.decoder_pred(x)[:, 1:], mask


def patchify(imgs: torch.Tensor) -> torch.Tensor:
    n, h = imgs.shape[0], IMG // P
    x = imgs.reshape(n, 1, h, P, h, P)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(n, h * h, PD)


def mae_loss(patches, pred, mask, bug=None):
    target = patches
    dim = 0 if bug == "norm_pix_batch_dim" else -1
    mean, var = target.mean(dim=dim, keepdim=True), target.var(dim=dim, keepdim=True)
    target = (target - mean) / (var + 1e-6) ** 0.5
    loss = ((pred - target) ** 2).mean(dim=-1)
    if bug == "loss_on_visible":
        mask = 1 - mask
    return (loss * mask).sum() / mask.sum()


def images() -> torch.Tensor:
    g = gen(SEED)
    base = torch.randn(N, 1, IMG // 2, IMG // 2, generator=g)
    up = base.repeat_interleave(2, 2).repeat_interleave(2, 3)
    return up + 0.3 * torch.randn(N, 1, IMG, IMG, generator=g)


def noise_for(step: int, rows: int) -> torch.Tensor:
    return torch.rand(rows, LP, generator=gen(SEED + 500 + step))


def build():
    torch.manual_seed(SEED)
    model = TinyMAE()
    return model, torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.05)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of each global batch and the matching rows of the global noise."""
    r, w = rank(), world_size
    model, opt = build()
    ddp = DDP(model)
    imgs, lb = images(), GB // w
    for step in range(STEPS):
        x = patchify(imgs[step * GB:(step + 1) * GB][r * lb:(r + 1) * lb])
        noise = noise_for(step, lb) if bug == "noise_local_draw" else noise_for(step, GB)[r * lb:(r + 1) * lb]
        pred, mask = ddp(x, noise, bug)
        loss = mae_loss(x, pred, mask, bug)
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch of each step and the global noise."""
    model, opt = build()
    imgs = images()
    for step in range(STEPS):
        x = patchify(imgs[step * GB:(step + 1) * GB])
        pred, mask = model(x, noise_for(step, GB))
        loss = mae_loss(x, pred, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
