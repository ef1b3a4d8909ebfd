"""Lightning Fabric (``strategy="ddp"``) training a tiny timm ``ConvNeXt`` built from its class (no
download: depths (1, 1, 1, 1), dims (8, 8, 16, 16), 1x1 patch stem, 3x3 depthwise kernels, LayerNorm, no drop path)
on 16x16 images. ``L.seed_everything(SEED)`` before everything (Fabric's ``DistributedSampler`` takes its
seed from it), the shuffled loader passed to ``fabric.setup_dataloaders`` (each rank: every W-th index of
the epoch's permutation; Fabric sets the sampler's epoch at each ``iter``), the lr scaled with the
GLOBAL batch (``base_lr * batch * W / 16``), SGD Nesterov with weight decay, ``OneCycleLR`` with
``total_steps = epochs * len(train_loader)`` (the loader after setup: the rank's batches) stepped every
batch, ``fabric.backward(loss)`` then ``fabric.clip_gradients(model, optimizer, max_norm=...)`` then
``optimizer.step()``.

The one-device reference: the same permutations (``randperm`` seeded ``SEED + epoch``), each global
batch the ranks' batches together, the same lr, schedule and clip.

Follows the Lightning Fabric docs ("Convert PyTorch code to Fabric": ``fabric.setup``,
``fabric.setup_dataloaders``, ``fabric.backward``; "Gradient clipping": ``fabric.clip_gradients``;
``Fabric._get_distributed_sampler``: ``seed=int(os.getenv("PL_GLOBAL_SEED", 0))``), huggingface/
pytorch-image-models ``timm/models/convnext.py`` (``ConvNeXt``) and ``train.py`` (``lr = base_lr *
global_batch_size / 256`` scaling), and the ``OneCycleLR`` docs (``steps_per_epoch=len(data_loader)``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from .common import gen, torchrun_env

IMG, CLASSES, BATCH, NB, EPOCHS, SEED = 16, 4, 4, 3, 2, 191
BASE_LR, MOMENTUM, WD, MAX_NORM = 0.1, 0.9, 5e-4, 1.0
STEPS = NB * EPOCHS
CORRECT = {"default": (2, 4)}
BUGS = {
    "onecycle_len_before_setup": "OneCycleLR's total_steps uses len(train_loader) taken before fabric.setup_dataloaders (the whole dataset's batches): the schedule is W times too long",
    "lr_scaled_local_batch": "the lr is scaled with the per-rank batch size instead of the global batch (batch * world size)",
    "clip_before_backward": "fabric.clip_gradients is called before fabric.backward: it clips nothing (the gradients were zeroed), the step uses unclipped gradients",
    "clip_val_not_norm": "fabric.clip_gradients(clip_val=...) clips each gradient element by value instead of the total norm (max_norm)",
    "onecycle_per_epoch": "OneCycleLR (total_steps in batches) is stepped once per epoch instead of after every batch",
    "no_distributed_sampler": "setup_dataloaders(use_distributed_sampler=False): every rank reads the whole dataset in the same order",
    "seed_everything_per_rank": "L.seed_everything(SEED + rank): the DistributedSampler's seed differs per rank, the ranks' permutations overlap",
}


def make_model():
    from timm.models.convnext import ConvNeXt
    torch.manual_seed(SEED)
    return ConvNeXt(in_chans=3, num_classes=CLASSES, depths=(1, 1, 1, 1), dims=(8, 8, 16, 16), patch_size=1, kernel_sizes=3,
                    ls_init_value=0.5, drop_path_rate=0.0)


def dataset(w: int) -> TensorDataset:
    n = NB * BATCH * w
    g = gen(SEED)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = torch.randn(n, 3, IMG, IMG, generator=g) * 0.5
    x[torch.arange(n), y % 3] += (1.0 + y[:, None, None].float() * 0.5) * torch.linspace(-1, 1, IMG)  # class patterns
    return TensorDataset(x, y)


def make_opt(model, lr: float, total: int):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM, nesterov=True, weight_decay=WD)
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: Fabric DDP, the loader set up by Fabric (its share of each epoch's permutation)."""
    import lightning as L

    torchrun_env()
    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=world_size)
    fabric.launch()
    r, w = fabric.global_rank, fabric.world_size
    L.seed_everything(SEED + r if bug == "seed_everything_per_rank" else SEED, verbose=False)
    model = make_model()
    loader = DataLoader(dataset(w), batch_size=BATCH, shuffle=True)
    n_before = len(loader)
    loader = fabric.setup_dataloaders(loader, use_distributed_sampler=bug != "no_distributed_sampler")
    lr = BASE_LR * BATCH * (1 if bug == "lr_scaled_local_batch" else w) / 16
    opt, sched = make_opt(model, lr, EPOCHS * (n_before if bug == "onecycle_len_before_setup" else len(loader)))
    model, opt = fabric.setup(model, opt)
    model.train()
    steps = 0
    for _ in range(EPOCHS):
        for x, y in loader:
            if steps == STEPS:
                break
            opt.zero_grad()
            if bug == "clip_before_backward":
                fabric.clip_gradients(model, opt, max_norm=MAX_NORM)
            fabric.backward(F.cross_entropy(model(x), y))
            if bug == "clip_val_not_norm":
                fabric.clip_gradients(model, opt, clip_val=MAX_NORM)
            elif bug != "clip_before_backward":
                fabric.clip_gradients(model, opt, max_norm=MAX_NORM)
            opt.step()
            steps += 1
            if bug != "onecycle_per_epoch":
                sched.step()
        if bug == "onecycle_per_epoch":
            sched.step()


def reference(world_size: int) -> None:
    """One device: the ranks' batches of each epoch's permutation together."""
    w = world_size
    model = make_model()
    x_all, y_all = dataset(w).tensors
    opt, sched = make_opt(model, BASE_LR * BATCH * w / 16, EPOCHS * NB)
    model.train()
    for epoch in range(EPOCHS):
        perm = torch.randperm(len(y_all), generator=gen(SEED + epoch))
        shards = [perm[r::w] for r in range(w)]
        for b in range(NB):
            idx = torch.cat([s[b * BATCH:(b + 1) * BATCH] for s in shards])
            opt.zero_grad()
            F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            sched.step()
