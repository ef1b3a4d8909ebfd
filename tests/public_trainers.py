"""Small equivalents of real public training code, written as their authors write it (not for this
tool), each correct by default and with the bugs users write behind ``bug=``:

- the PyTorch DDP tutorial series' ``multigpu.py`` / ``single_gpu.py``: an epoch-based ``Trainer``,
  ``DistributedSampler`` with ``set_epoch``, an ``mp.spawn`` ``main(rank, world_size, ...)`` with its
  own ``ddp_setup`` (a fixed ``MASTER_PORT``) and, with ``gpu=True``, the GPU lines as the tutorial
  has them (``torch.cuda.set_device(rank)``, ``.to(rank)``, ``DDP(device_ids=[rank])``);
- the "writing distributed applications" tutorial's hand-written data parallel SGD: its
  ``DataPartitioner``, ``average_gradients`` (all_reduce SUM, divide), ``init_process(rank, size, fn)``;
- a minGPT-like trainer: a tiny GPT whose layers are built with ``dtype=torch.float32`` (pinned),
  AdamW with weight-decay groups, gradient clipping, optional bf16 autocast, DDP, epochs;
- a tensor-parallel feed-forward block: ``ColwiseParallel``/``RowwiseParallel`` on a 1-D CPU mesh;
- FSDP2 with a bfloat16 ``MixedPrecisionPolicy`` against bf16 autocast on one device.
Synthetic data only. The test files pair each with its one-device reference.
"""
import copy
import math
import os
import random

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


# ---- the DDP tutorial series: multigpu.py / single_gpu.py -----------------------------------------
class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup(rank, world_size, gpu=False):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    if gpu is True:
        torch.cuda.set_device(rank)
    init_process_group(backend="nccl" if gpu is True else "gloo", rank=rank, world_size=world_size)


def load_train_objs(size=256, dropout=0.0):
    train_set = MyTrainDataset(size)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    return train_set, model, optimizer


class Trainer:
    """multigpu.py's Trainer (``bug`` switches one of its lines to a bug users write)."""

    def __init__(self, model, train_data, optimizer, gpu_id, save_every, bug="", loss="mse"):
        self.gpu_id = gpu_id
        self.model = model.to(gpu_id)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.bug, self.loss = bug, loss
        if bug == "deepcopy":  # wrapped a copy: the optimizer still holds the original's parameters
            self.model = DDP(copy.deepcopy(self.model))
        elif isinstance(gpu_id, int):
            self.model = DDP(self.model, device_ids=[gpu_id])
        else:
            self.model = DDP(self.model, device_ids=[gpu_id.index] if gpu_id.type == "cuda" else None)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        if self.loss == "cross_entropy":  # the tutorial's own line: one output column, always 0 loss
            loss = F.cross_entropy(output, targets)
        else:
            loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        if self.bug not in ("no_set_epoch", "no_sampler"):
            self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            source = source.to(self.gpu_id)
            targets = targets.to(self.gpu_id)
            self._run_batch(source, targets)

    def _save_checkpoint(self, epoch):
        ckp = self.model.module.state_dict()
        torch.save(ckp, "checkpoint.pt")
        print(f"Epoch {epoch} | Training checkpoint saved at checkpoint.pt")

    def train(self, max_epochs: int):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            # (the tutorial also saves at epoch 0; from epoch 1 here, so tests write no file)
            if self.gpu_id in (0, torch.device("cpu")) and epoch % self.save_every == 0 and epoch:
                self._save_checkpoint(epoch)


def prepare_dataloader(dataset, batch_size, bug=""):
    if bug == "no_sampler":
        return DataLoader(dataset, batch_size=batch_size, pin_memory=False, shuffle=True)
    return DataLoader(dataset, batch_size=batch_size, pin_memory=False, shuffle=False,
                      sampler=DistributedSampler(dataset))


def multigpu_main(rank, world_size, save_every, total_epochs, batch_size, gpu=False, bug="", size=256,
                  loss="mse"):
    """multigpu.py's main, as mp.spawn calls it; ``gpu=True`` is the tutorial's GPU code as written."""
    ddp_setup(rank, world_size, gpu)
    dataset, model, optimizer = load_train_objs(size, 0.1 if bug == "dropout" else 0.0)
    train_data = prepare_dataloader(dataset, batch_size, bug)
    if gpu == "accelerator":  # today's tutorials: the build's accelerator, which says cuda on a CUDA build
        acc = torch.accelerator.current_accelerator()
        device = torch.device(f"{acc}:{rank}") if acc is not None else torch.device("cpu")
    else:
        device = rank if gpu else (torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu"))
    trainer = Trainer(model, train_data, optimizer, device, save_every, bug, loss)
    trainer.train(total_epochs)
    destroy_process_group()


class SingleTrainer(Trainer):
    """single_gpu.py's Trainer: no DDP; it reshuffles every epoch as the ranks' samplers do."""

    def __init__(self, model, train_data, optimizer, gpu_id, save_every, loss="mse"):
        self.gpu_id, self.train_data, self.optimizer, self.save_every = gpu_id, train_data, optimizer, save_every
        self.model, self.bug, self.loss = model.to(gpu_id), "", loss

    def _save_checkpoint(self, epoch):
        torch.save(self.model.state_dict(), "checkpoint.pt")


def single_gpu_main(device, total_epochs, save_every, batch_size, size=256, loss="mse", shuffle_seed=0):
    """single_gpu.py's main: the global batch, drawn in the order the ranks' shards make together."""
    dataset, model, optimizer = load_train_objs(size)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=shuffle_seed)
    train_data = DataLoader(dataset, batch_size=batch_size, pin_memory=False, shuffle=False, sampler=sampler)
    SingleTrainer(model, train_data, optimizer, torch.device(device), save_every, loss).train(total_epochs)


# ---- "writing distributed applications": data parallel SGD by hand ---------------------------------
class Partition:
    def __init__(self, data, index):
        self.data, self.index = data, index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, index):
        return self.data[self.index[index]]


class DataPartitioner:
    def __init__(self, data, sizes=(0.7, 0.2, 0.1), seed=1234):
        self.data = data
        self.partitions = []
        rng = random.Random()
        rng.seed(seed)
        indexes = list(range(len(data)))
        rng.shuffle(indexes)
        for frac in sizes:
            part_len = int(frac * len(data))
            self.partitions.append(indexes[0:part_len])
            indexes = indexes[part_len:]

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


def synthetic_mnist(n=512):
    g = torch.Generator().manual_seed(4321)
    images = (torch.rand(n, 1, 28, 28, generator=g) - 0.1307) / 0.3081
    return torch.utils.data.TensorDataset(images, torch.randint(0, 10, (n,), generator=g))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=5)
        self.fc1 = nn.Linear(4 * 12 * 12, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


GLOBAL_BATCH = 32


def partition_dataset():
    dataset = synthetic_mnist()
    size = dist.get_world_size()
    bsz = GLOBAL_BATCH // size
    partition = DataPartitioner(dataset, [1.0 / size] * size).use(dist.get_rank())
    return DataLoader(partition, batch_size=bsz, shuffle=True), bsz


def average_gradients(model, bug=""):
    size = float(dist.get_world_size())
    for param in model.parameters():
        if bug == "no_allreduce":
            continue
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        if bug != "sum_no_divide":
            param.grad.data /= size


def run(rank, size, bug="", epochs=10):
    """The tutorial's distributed synchronous SGD."""
    torch.manual_seed(1234 + (rank if bug == "rank_seed" else 0))
    train_set, bsz = partition_dataset()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for epoch in range(epochs):
        for data, target in train_set:
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            average_gradients(model, bug)
            optimizer.step()


def init_process(rank, size, fn, backend="gloo", **kwargs):
    """Initialize the distributed environment (the tutorial's, port 29500 and all)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size, **kwargs)


def run_one_device(size, epochs=10):
    """The same SGD on one device: per step the ranks' batches together (each rank's DataLoader
    shuffles its partition with the same seed, drawn from the same random state)."""
    torch.manual_seed(1234)
    dataset = synthetic_mnist()
    parts = DataPartitioner(dataset, [1.0 / size] * size)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for epoch in range(epochs):
        state, iters = torch.get_rng_state(), []
        for r in range(size):
            torch.set_rng_state(state)
            it = iter(DataLoader(parts.use(r), batch_size=GLOBAL_BATCH // size, shuffle=True))
            iters.append((next(it), it))  # the shuffle's seed is drawn at the first batch
        batches = [[first] + list(it) for first, it in iters]
        for step in range(len(batches[0])):
            data = torch.cat([b[step][0] for b in batches])
            target = torch.cat([b[step][1] for b in batches])
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()


# ---- a minGPT-like trainer: dtype pinned, AdamW with weight-decay groups, clipping, DDP -------------
class GPTConfig:
    def __init__(self, vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=32, dropout=0.0):
        self.vocab_size, self.block_size, self.n_layer = vocab_size, block_size, n_layer
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout


class CausalSelfAttention(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, dtype=dtype)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, dtype=dtype)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, config, dtype):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.attn = CausalSelfAttention(config, dtype)
        self.ln_2 = nn.LayerNorm(config.n_embd, dtype=dtype)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd, dtype=dtype), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd, dtype=dtype), nn.Dropout(config.dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """minGPT's GPT, small; every layer built with ``dtype`` (float32 by default: pinned, as the
    trainer that motivated this wrote it)."""

    def __init__(self, config, dtype=torch.float32):
        super().__init__()
        self.block_size = config.block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd, dtype=dtype),
            wpe=nn.Embedding(config.block_size, config.n_embd, dtype=dtype),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, dtype) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, dtype=dtype)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, dtype=dtype)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95)):
        decay, no_decay = set(), set()
        for mn, m in self.named_modules():
            for pn, p in m.named_parameters(recurse=False):
                fpn = f"{mn}.{pn}" if mn else pn
                if pn.endswith("weight") and isinstance(m, nn.Linear):
                    decay.add(fpn)
                else:
                    no_decay.add(fpn)
        params = dict(self.named_parameters())
        groups = [{"params": [params[n] for n in sorted(decay)], "weight_decay": weight_decay},
                  {"params": [params[n] for n in sorted(no_decay)], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


class CharDataset(Dataset):
    """Synthetic token sequences (a fixed generator: the same on every rank): next-token targets."""

    def __init__(self, n=512, block_size=8, vocab_size=16, seed=99):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab_size, (n, block_size + 1), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i, :-1], self.data[i, 1:]


class GPTTrainer:
    """The DDP tutorial series' minGPT Trainer, small: epochs over a DistributedSampler, AdamW,
    ``clip_grad_norm_``, optional autocast (``use_amp``)."""

    def __init__(self, model, optimizer, dataset, batch_size, distributed=True, use_amp=False, grad_norm_clip=1.0,
                 bug="", shuffle_seed=0):
        self.model, self.optimizer, self.use_amp, self.clip, self.bug = model, optimizer, use_amp, grad_norm_clip, bug
        if distributed:
            sampler = DistributedSampler(dataset, shuffle=True)
        else:
            sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=shuffle_seed)
        self.loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler)

    def _run_batch(self, source, targets):
        import contextlib

        with self.model.no_sync() if self.bug == "no_sync" else contextlib.nullcontext():
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=self.use_amp):
                _, loss = self.model(source, targets)
            self.optimizer.zero_grad(set_to_none=True)
            (loss * dist.get_world_size() if self.bug == "loss_times_world" else loss).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        return loss.item()

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self.loader.sampler.set_epoch(epoch)
            for source, targets in self.loader:
                self._run_batch(source, targets)


def gpt_ddp_train(world_size, batch_size=4, epochs=100, use_amp=False, bug="", dtype=torch.float32, n=64):
    """The distributed side: the process group is up (torchrun style); DDP, each rank batch_size."""
    model = DDP(GPT(GPTConfig(), dtype))
    optimizer = model.module.configure_optimizers()
    GPTTrainer(model, optimizer, CharDataset(n), batch_size, use_amp=use_amp, bug=bug).train(epochs)


def gpt_one_device(world_size, batch_size=4, epochs=100, use_amp=False, bug="", dtype=torch.float32, n=64,
                   shuffle_seed=0):
    """The same training on one device: the global batch (batch_size x world_size)."""
    model = GPT(GPTConfig(), dtype)
    optimizer = model.configure_optimizers()
    GPTTrainer(model, optimizer, CharDataset(n), batch_size * world_size, distributed=False, use_amp=use_amp,
               shuffle_seed=shuffle_seed).train(epochs)


# ---- a tensor-parallel feed-forward block on a 1-D CPU mesh ---------------------------------------
class FeedForward(nn.Module):
    def __init__(self, dim=16, hidden=64):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


def tp_batch(step, batch=8, dim=16):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(batch, dim, generator=g), torch.randn(batch, dim, generator=g)


def tp_train(world_size, steps=100, bug=""):
    """Tensor parallel as the torch docs write it: w1 column-wise, w2 row-wise; every rank feeds
    the same batch (``bug="rank_inputs"``: each rank its own)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    model = parallelize_module(FeedForward(), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rank = dist.get_rank()
    for step in range(steps):
        x, y = tp_batch(step * world_size + rank if bug == "rank_inputs" else step)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def tp_one_device(world_size, steps=100, bug=""):
    model = FeedForward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = tp_batch(step)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


# ---- FSDP2 with a mixed-precision policy, against bf16 autocast on one device ----------------------
def fsdp_mixed_precision_train(world_size, steps=100, bug=""):
    """fully_shard with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), as the FSDP2
    tutorial configures it: compute in bfloat16 (the loss too), gradients reduced in float32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 5))
    fully_shard(model, mesh=init_device_mesh("cpu", (world_size,)),
                mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dataset = _classification(world_size * 8 * steps)
    for x, y in DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, shuffle=False)):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        (loss * world_size if bug == "loss_times_world" else loss).backward()
        optimizer.step()


def autocast_one_device(world_size, steps=100, bug=""):
    """The same model and data on one device, under bf16 autocast (float32 parameters and loss)."""
    model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in DataLoader(_classification(world_size * 8 * steps), batch_size=8 * world_size, shuffle=False):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
        loss.backward()
        optimizer.step()


def _classification(n):
    g = torch.Generator().manual_seed(7)
    return torch.utils.data.TensorDataset(torch.randn(n, 20, generator=g), torch.randint(0, 5, (n,), generator=g))
