"""Small equivalents of the modern stack's public trainers, written as their authors write them, for
dist.assert_same_training(record="optimizer"): FSDP2 with a DCP checkpointer (pytorch/examples'
FSDP2 example: every rank feeds the same batch, the model rebuilt and reloaded in the process),
DDP with gradient accumulation and StepLR, the sequence-parallel toy (each rank its shard of the
rows, the loss a sum over the local output). ``bug`` switches one line to a bug users write."""
import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(16, 32), nn.Linear(32, 32)])
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        for block in self.blocks:
            x = F.relu(block(x))
        return self.head(x)


def batch(step, rows):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, 16, generator=g), torch.randint(0, 4, (rows,), generator=g)


def _fsdp_model(seed):
    torch.manual_seed(seed)
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model, optimizer, step, rows=8, clip=None, zero_grad=True):
    x, y = batch(step, rows)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    if clip == "global":
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    elif clip == "local":  # by hand, with the norm of this rank's shards only
        grads = [p.grad.to_local() for p in model.parameters()]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        torch._foreach_mul_(grads, torch.clamp(0.5 / (norm + 1e-6), max=1.0))
    optimizer.step()
    if zero_grad:
        optimizer.zero_grad()


def fsdp2_dcp(folder, steps=6, save_at=3, bug="", clip=None):
    """Trains save_at steps, saves model and optimizer with DCP, builds both anew, loads, trains on."""
    model, optimizer = _fsdp_model(0)
    for step in range(save_at):
        _step(model, optimizer, step, clip="local" if bug == "local_clip" else "global" if clip else None,
              zero_grad=bug != "no_zero_grad")
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=folder)
    tdist.barrier()
    model, optimizer = _fsdp_model(1)  # another seed: only the checkpoint can make it the same
    if bug == "no_optimizer_state":  # the model's weights alone are restored
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(model, state["model"])
    else:
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optim"])
    for step in range(save_at, steps):
        data_step = step - save_at if bug == "data_restarted" else step  # the loader started over
        _step(model, optimizer, data_step, clip="local" if bug == "local_clip" else "global" if clip else None,
              zero_grad=bug != "no_zero_grad")


def one_device(steps=6, clip=None, **_):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        _step(model, optimizer, step, clip="global" if clip else None)


def ddp_accumulate(steps=6, micro=2, rows=4, bug=""):
    """DDP, `micro` micro-batches per optimizer step (no_sync on all but the last), loss / micro, StepLR."""
    torch.manual_seed(0)
    rank, world = tdist.get_rank(), tdist.get_world_size()
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for step in range(steps):
        x, y = batch(step, world * micro * rows)
        mine = slice(rank * micro * rows, (rank + 1) * micro * rows)
        for i, (xb, yb) in enumerate(zip(x[mine].split(rows), y[mine].split(rows))):
            last = i == micro - 1
            with (model.no_sync() if not last else torch.enable_grad()):
                loss = F.cross_entropy(model(xb), yb)
                (loss if bug == "not_divided" else loss / micro).backward()
            if bug == "scheduler_per_micro_batch":
                scheduler.step()
        optimizer.step()
        optimizer.zero_grad()
        if bug != "scheduler_per_micro_batch":
            scheduler.step()


def accumulate_one_device(world, steps=6, micro=2, rows=4, **_):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for step in range(steps):
        x, y = batch(step, world * micro * rows)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


def _toy_rows(step, rows):
    return torch.randn(rows, 10, generator=torch.Generator().manual_seed(step))


def sequence_parallel(steps=4, rows=4, bug=""):
    """sequence_parallel_example.py: each rank feeds its shard of the rows, the loss is the sum of the
    local output (each rank holds part of the loss)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world = tdist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = parallelize_module(Toy(), mesh, {"in_proj": ColwiseParallel(input_layouts=Shard(0)),
                                             "out_proj": RowwiseParallel(output_layouts=Shard(0))})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    rank = tdist.get_rank()
    for step in range(steps):
        x = _toy_rows(step, world * rows)
        if bug == "same_rows_everywhere":
            mine = x[:rows]
        else:
            mine = x[rank * rows:(rank + 1) * rows]
        model(mine).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def toy_one_device(world, steps=4, rows=4, bug=""):
    torch.manual_seed(0)
    model = Toy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        model(_toy_rows(step, world * rows)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


CUTS = {2: [0, 4, 7], 4: [0, 2, 4, 6, 7]}  # stage boundaries over the 7 modules below


def _deep():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def pipeline(steps=4, micro=2, rows=8, bug=""):
    """torch.distributed.pipelining as torchtitan uses it: every rank builds the whole model and keeps
    its stage (an nn.Sequential slice keeps the layers' names), GPipe over `micro` micro-batches."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, world = tdist.get_rank(), tdist.get_world_size()
    cuts = CUTS[world]
    stage_mod = _deep()[cuts[rank]:cuts[rank + 1]]
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=micro, loss_fn=F.cross_entropy)
    optimizer = torch.optim.SGD(stage_mod.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch(step, rows)
        if bug == "detached_stage" and rank == world - 1:
            stage_mod.requires_grad_(False)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad()


def interleaved(steps=4, micro=2, rows=8):
    """ScheduleInterleaved1F1B: four stages over the ranks, each rank holding every world-th one (two
    stage modules per rank at 2 ranks, one optimizer over both)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    rank, world = tdist.get_rank(), tdist.get_world_size()
    cuts, model = CUTS[4], _deep()
    mine = [i for i in range(4) if i % world == rank]
    mods = [model[cuts[i]:cuts[i + 1]] for i in mine]
    stages = [PipelineStage(m, i, 4, torch.device("cpu")) for m, i in zip(mods, mine)]
    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=micro, loss_fn=F.cross_entropy)
    optimizer = torch.optim.SGD([p for m in mods for p in m.parameters()], lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch(step, rows)
        if rank == 0:
            schedule.step(x, target=y)
        else:
            schedule.step(target=y)
        optimizer.step()
        optimizer.zero_grad()


def pipeline_one_device(steps=4, rows=8, **_):
    model = _deep()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch(step, rows)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
