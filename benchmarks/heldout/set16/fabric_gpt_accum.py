"""Lightning Fabric (``strategy="ddp"``, CPU) training a tiny GPT-like causal language model (token and
position embeddings, one pre-LayerNorm block with causal ``scaled_dot_product_attention`` and a GELU MLP,
a final LayerNorm and an untied head) with gradient accumulation over 2 micro-batches:
``with fabric.no_backward_sync(model, enabled=not is_last)``, ``fabric.backward(loss / ACC)``, then on the
last micro-batch ``fabric.clip_gradients(model, optimizer, max_norm=...)``, ``optimizer.step()``,
``optimizer.zero_grad()`` and a ``LambdaLR`` with linear warm-up then linear decay (the lambda returns a
factor of the base lr) stepped per update. Next-token loss: logits[:, :-1] against ids[:, 1:]. SGD with
momentum. Every random draw (token ids) is made for the global batch by a generator seeded per step and
each rank keeps its rows, its first half the first micro-batch; the reference runs the global batch in one
forward.

Follows the Lightning Fabric docs ("Efficient Gradient Accumulation": ``fabric.no_backward_sync``;
``fabric.backward``; "Gradient clipping": ``fabric.clip_gradients``), Lightning's
``examples/fabric/build_your_own_trainer/trainer.py`` (accumulation, clip, scheduler per step),
karpathy/nanoGPT ``model.py`` (``CausalSelfAttention`` with ``is_causal=True``, the shifted targets) and
the ``torch.optim.lr_scheduler.LambdaLR`` docs (the lambda computes a multiplicative factor).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import gen, rank, torchrun_env

V, S, D, NH, GB, ACC, SEED = 24, 8, 16, 2, 16, 2, 1633
LR, MOMENTUM, MAX_NORM, WARMUP = 0.5, 0.9, 1.0, 2
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "loss_not_scaled_by_accum": "fabric.backward(loss) is called on each micro-batch's loss without dividing by the accumulation steps: the accumulated gradient is the sum, twice the mean",
    "lr_lambda_returns_lr": "the LambdaLR lambda returns the learning rate (base lr x factor) instead of the factor: LambdaLR multiplies by the base lr again",
    "backward_sync_never": "fabric.no_backward_sync(model) is used without enabled=: the sync is skipped on every micro-batch, the gradients are never all-reduced",
    "no_zero_grad": "optimizer.zero_grad() is never called: the gradients keep accumulating across optimizer updates",
    "batch_seed_per_rank": "each rank draws its batch from a generator seeded with the rank instead of keeping its rows of the global per-step draw",
    "causal_mask_missing": "the attention is called without is_causal=True: tokens attend to the future tokens they predict",
    "labels_not_shifted": "the loss compares logits with the unshifted ids (position t against token t) instead of the next token",
}


class GPT(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(S, D)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D)
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, ids):
        b, s = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(s))
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, NH, D // NH).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.bug != "causal_mask_missing")
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, D))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return self.head(self.lnf(x))


def make_model(bug=None):
    torch.manual_seed(SEED)
    return GPT(bug)


def lr_lambda(s: int) -> float:
    return (s + 1) / WARMUP if s < WARMUP else max(0.0, (STEPS - s) / (STEPS - WARMUP))


def lm_loss(model, ids, bug=None):
    logits = model(ids)
    if bug == "labels_not_shifted":
        return F.cross_entropy(logits.reshape(-1, V), ids.reshape(-1))
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))


def batch(step: int):
    g = gen(SEED + step)
    base = torch.randint(0, V, (GB, 1), generator=g)
    return (base + torch.arange(S) * torch.randint(1, 4, (GB, 1), generator=g) + (torch.rand(GB, S, generator=g) < 0.2)) % V


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: Fabric DDP, its rows of each global batch in 2 micro-batches."""
    import lightning as L
    torchrun_env()
    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=world_size)
    fabric.launch()
    r, w = fabric.global_rank, fabric.world_size
    model = make_model(bug)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    model, opt = fabric.setup(model, opt)
    lam = (lambda s: LR * lr_lambda(s)) if bug == "lr_lambda_returns_lr" else lr_lambda
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
    lb, mb = GB // w, GB // w // ACC
    for step in range(STEPS):
        ids = batch(step)[r * lb:(r + 1) * lb]
        if bug == "batch_seed_per_rank":
            ids = batch(step * 131 + 7 + r)[:lb]
        for i in range(ACC):
            last = i == ACC - 1
            ctx = fabric.no_backward_sync(model) if bug == "backward_sync_never" else \
                fabric.no_backward_sync(model, enabled=not last)
            with ctx:
                loss = lm_loss(model, ids[i * mb:(i + 1) * mb], bug)
                fabric.backward(loss if bug == "loss_not_scaled_by_accum" else loss / ACC)
        fabric.clip_gradients(model, opt, max_norm=MAX_NORM)
        opt.step()
        sched.step()
        if bug != "no_zero_grad":
            opt.zero_grad()


def reference(world_size: int) -> None:
    """One device: the global batch in one forward, the same clip and schedule."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    for step in range(STEPS):
        lm_loss(model, batch(step)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        sched.step()
        opt.zero_grad()
