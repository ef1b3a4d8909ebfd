"""Lightning Fabric with float16 mixed precision and a dynamic loss scaler on CPU: ``L.Fabric(accelerator=
"cpu", strategy="ddp", plugins=MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", ...)))``
(Fabric refuses the string ``precision="16-mixed"`` on CPU and falls back to bf16, so the plugin is passed
as an instance: the forward runs under ``torch.autocast("cpu", torch.float16)``, inputs are cast to
float16 and outputs back to float32, ``fabric.backward`` scales the loss, ``optimizer.step()`` is
``scaler.step`` + ``scaler.update``). The classifier: an input batch norm over the global batch
(heldout14's ``SyncBatchNorm1d``, as ``nn.SyncBatchNorm`` would on GPUs, computed in float32), then
Linear / GELU / dropout (masks drawn for the global batch) / Linear / GELU / Linear. Two micro-batches
per update (``fabric.no_backward_sync(model, enabled=not last)``, ``fabric.backward(loss / ACC)``),
label-smoothed cross entropy, ``fabric.clip_gradients(model, opt, max_norm, error_if_nonfinite=False)``
(which unscales first), SGD momentum, ``OneCycleLR`` (``total_steps`` = the updates) stepped only when
the scaler did not skip the step (the scale did not go down, transformers' ``optimizer_was_run``). The
initial scale (2**20) overflows float16 in the first update's backward: that update is skipped (no
``optimizer.step()``) and the scale backs off by 1/8 to 2**17, 3/4 of an octave or more under the
overflow for the rest of the run (with the default backoff of 1/2 the scale settles just under the
overflow, which then depends on the rows each rank holds, and the world sizes skip different updates). Each rank holds
LB rows per update at every world size (the global batch is LB x W), so that each row's scaled gradient,
and with it the overflow, is the same at 2 and 4 ranks.

The one-device reference: the same float16 autocast per rank block (so that the float16 matmuls see the
same shapes and the same overflows), the batch norm over the global micro-batch, the loss of each block
backpropagated at the rank's scale (the sum of the blocks' means, so each row's scaled gradient is the
rank's), the summed gradients divided by W as DDP averages them; then the same unscale, clip, step, update
and schedule.

Follows Lightning Fabric docs ("Mixed precision": ``16-mixed``, the ``MixedPrecision`` plugin with a
custom ``scaler``; "Gradient accumulation": ``no_backward_sync``; ``fabric.clip_gradients``), Lightning
``src/lightning/fabric/plugins/precision/amp.py`` (``MixedPrecision.backward`` / ``optimizer_step`` /
``unscale_gradients``), the PyTorch AMP examples (``docs/source/notes/amp_examples.rst``: "Gradient
clipping" with ``unscale_`` first, "Gradient accumulation"), ``torch/amp/grad_scaler.py`` (skip on inf,
``backoff_factor``, ``growth_interval``), huggingface/transformers ``trainer.py`` (``optimizer_was_run =
scale_before <= scale_after``, the scheduler stepped only then) and the ``OneCycleLR`` docs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import Float32SyncBatchNorm1d, MaskDropout, gen, torchrun_env

DI, H, C, LB, ACC, SEED = 12, 32, 5, 8, 2, 1906
LR, MOMENTUM, MAX_NORM, LS, P = 0.2, 0.9, 1.0, 0.1, 0.2
INIT_SCALE, BACKOFF, GROWTH_INTERVAL = 2.0 ** 20, 0.125, 2000
UPDATES = 9
STEPS = UPDATES - 1   # the optimizer steps taken: the first update overflows and is skipped
CORRECT = {"default": (2, 4)}
BUGS = {
    "clip_before_unscale": "the gradients are clipped with torch.nn.utils.clip_grad_norm_ directly instead of fabric.clip_gradients: the clip sees the scaled gradients (norm x loss scale), so every step is clipped to a tiny update",
    "onecycle_on_skipped_step": "OneCycleLR.step() is called after every update, also when the scaler skipped optimizer.step() on an overflow: the schedule runs ahead of the real steps",
    "onecycle_total_in_micro_batches": "OneCycleLR's total_steps is the number of micro-batches (updates x accumulation) instead of the number of updates: warm-up and annealing run ACC times too slowly",
    "bn_not_synced": "the batch norm is left per-rank (no SyncBatchNorm conversion): each rank normalises with its own micro-batch's statistics",
    "sync_on_first_micro": "no_backward_sync(model, enabled=last) is inverted: the gradients are all-reduced after the first micro-batch and the last micro-batch's gradient stays local",
    "loss_not_divided_by_accum": "the loss is not divided by the accumulation steps before fabric.backward: the accumulated gradient is the sum of the micro-batch means (ACC times too large) and overflows at other scales",
    "zero_grad_every_micro": "optimizer.zero_grad() is called before every micro-batch's backward: only the last micro-batch's gradient reaches the step",
}


class Net(nn.Module):
    def __init__(self, synced: bool = True):
        super().__init__()
        self.bn = Float32SyncBatchNorm1d(DI) if synced else LocalBatchNorm1d(DI)
        self.fc1, self.drop, self.fc2, self.head = nn.Linear(DI, H), MaskDropout(P), nn.Linear(H, H), nn.Linear(H, C)

    def forward(self, x, part: str = "all"):
        """``part``: "all"; or, for the reference's blocks, "bn" (the batch norm) / "rest" (the layers after it)."""
        if part != "rest":
            x = self.bn(x)
        if part == "bn":
            return x
        return self.head(F.gelu(self.fc2(self.drop(F.gelu(self.fc1(x))))))


class LocalBatchNorm1d(Float32SyncBatchNorm1d):
    """The same batch norm with the rank's own statistics (no all-reduce): a plain BatchNorm1d."""

    def forward(self, x):
        x = x.float()
        mean, var = x.mean(0), x.var(0, unbiased=False)
        with torch.no_grad():
            n = x.shape[0]
            self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
            self.running_var.mul_(1 - self.momentum).add_(self.momentum * var * n / (n - 1))
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def make_model(synced: bool = True):
    torch.manual_seed(SEED)
    return Net(synced)


def batch(update: int, w: int):
    """The global batch of LB rows per rank (the per-rank batch is fixed, so that each row's scaled
    gradient, and with it the float16 overflow, is the same at every world size)."""
    g = gen(SEED + 10 * update)
    n = LB * w
    y = torch.randint(0, C, (n,), generator=g)
    x = 2.0 * torch.randn(n, DI, generator=g) + 3.0 * F.one_hot(y, DI).float() + 1.5
    return x, y, (torch.rand(n, H, generator=g) > P).float()


def scaler_new():
    return torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, backoff_factor=BACKOFF, growth_interval=GROWTH_INTERVAL)


def make_opt(model, bug=None):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    total = UPDATES * ACC if bug == "onecycle_total_in_micro_batches" else UPDATES
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=total, pct_start=0.3)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: Fabric DDP with the float16 plugin, its rows of every global batch and mask."""
    import lightning as L
    from lightning.fabric.plugins import MixedPrecision

    torchrun_env()
    scaler = scaler_new()
    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=world_size,
                      plugins=MixedPrecision("16-mixed", "cpu", scaler=scaler))
    fabric.launch()
    r, w = fabric.global_rank, fabric.world_size
    net = make_model(synced=bug != "bn_not_synced")
    opt, sched = make_opt(net, bug)
    model, opt = fabric.setup(net, opt)
    lb, mb = LB, LB // ACC
    for update in range(UPDATES):
        x, y, mask = batch(update, w)
        x, y, mask = x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb], mask[r * lb:(r + 1) * lb]
        for i in range(ACC):
            last = i == ACC - 1
            sl = slice(i * mb, (i + 1) * mb)
            if bug == "zero_grad_every_micro":
                opt.zero_grad()
            with fabric.no_backward_sync(model, enabled=last if bug == "sync_on_first_micro" else not last):
                net.drop.mask = mask[sl]
                loss = F.cross_entropy(model(x[sl]), y[sl], label_smoothing=LS)
                fabric.backward(loss if bug == "loss_not_divided_by_accum" else loss / ACC)
        if bug == "clip_before_unscale":
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        else:
            fabric.clip_gradients(model, opt, max_norm=MAX_NORM, error_if_nonfinite=False)
        scale_before = scaler.get_scale()
        opt.step()
        if bug == "onecycle_on_skipped_step" or scaler.get_scale() >= scale_before:
            sched.step()
        opt.zero_grad()


def reference(world_size: int) -> None:
    """One device: the ranks' blocks under the same float16 autocast, the batch norm over the global
    micro-batch, each block's mean loss at the rank's scale, the gradients summed / W."""
    w = world_size
    model = make_model()
    opt, sched = make_opt(model)
    scaler = scaler_new()
    lb, mb = LB, LB // ACC
    for update in range(UPDATES):
        x, y, mask = batch(update, w)
        for i in range(ACC):
            rows = torch.cat([torch.arange(r * lb + i * mb, r * lb + (i + 1) * mb) for r in range(w)])
            h = model(x[rows].half(), part="bn")          # Fabric casts the inputs to float16
            total = 0.0
            for r in range(w):
                sl = slice(r * mb, (r + 1) * mb)
                model.drop.mask = mask[rows][sl]
                with torch.autocast("cpu", dtype=torch.float16):
                    out = model(h[sl], part="rest")
                total = total + F.cross_entropy(out.float(), y[rows][sl], label_smoothing=LS) / ACC
            scaler.scale(total).backward()
        for p in model.parameters():
            p.grad /= w
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        scale_before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() >= scale_before:
            sched.step()
        opt.zero_grad()
