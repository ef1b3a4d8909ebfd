"""Small training loops for the evidence tests (``test_evidence.py``): a two-layer network trained by
hand-written data parallelism (all_reduce of the gradients) or by DDP, each with one flag per bug.
Every rank trains its block of one seeded global batch; ``reference`` trains the whole batch on one
device. Written as users write them: nothing in them knows about the plugin."""
from __future__ import annotations

import copy

import torch
import torch.distributed as tdist
from torch import nn

DIM, HIDDEN, OUT, BATCH, LR = 8, 16, 4, 16, 0.05


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(DIM, HIDDEN)
        self.gate = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        return self.head(h * torch.sigmoid(self.gate(h)))


class Teacher(nn.Module):
    """An EMA copy of the network, run forward for a distillation term (as DINO/BYOL do)."""

    def __init__(self, net: Net):
        super().__init__()
        self.net = copy.deepcopy(net).requires_grad_(False)
        self.updates = 0

    def forward(self, x):
        return self.net(x)

    @torch.no_grad()
    def update(self, net: Net, momentum: float = 0.9) -> None:
        for t, s in zip(self.net.parameters(), net.parameters()):
            t.mul_(momentum).add_(s.detach(), alpha=1 - momentum)
        self.updates += 1


def _runs(teacher, bug: str) -> bool:
    """Whether the distillation term runs: with a teacher, and (``ema_late_rank0``, SWA's way) only once
    the copy has been updated."""
    return teacher is not None and (bug != "ema_late_rank0" or teacher.updates > 0)


def batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, OUT, generator=g)


def _rank() -> int:
    return tdist.get_rank() if tdist.is_initialized() else 0


def _average(model: nn.Module, world: int, skip: str = "", divide: bool = True) -> None:
    for name, p in model.named_parameters():
        if p.grad is None or (skip and name.startswith(skip)):
            continue
        tdist.all_reduce(p.grad)
        if divide:
            p.grad.div_(world)


def hand_dp(world_size: int, bug: str = "", steps: int = 4, micro: int = 1, validate: bool = False) -> None:
    """Hand-written data parallelism: all_reduce SUM, then divide; ``micro`` accumulated micro-batches;
    ``validate``: rank 0 runs a validation forward after each step (not a bug)."""
    torch.manual_seed(0 + (_rank() if bug in ("seed_apart", "ema_copied_early") else 0))
    net = Net()
    teacher = Teacher(net) if (bug.startswith("ema") or bug == "teacher") and not bug.startswith("ema_late") else None
    if bug == "ema_copied_early":  # rank 0's weights broadcast after the copy, as DDP's constructor would
        for p in net.parameters():
            tdist.broadcast(p.data, 0)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    for step in range(steps):
        if bug.startswith("ema_late") and step == 1:  # an averaged copy made once training has begun
            teacher = Teacher(net)
        if validate and _rank() == 0:  # rank 0 validates first: not a bug, and not training rows
            net.eval()
            with torch.no_grad():
                net(batch(1000 + step)[0])
            net(batch(2000 + step)[0][:8]).sum()  # in eval mode, no backward
            net.train()
        x, y = (t.chunk(world_size)[_rank()] for t in batch(step))
        opt.zero_grad()
        for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
            if bug == "zero_grad_micro":
                opt.zero_grad()
            out = net(xm)
            loss = nn.functional.mse_loss(out, ym)
            if _runs(teacher, bug):
                loss = loss + nn.functional.mse_loss(out, teacher(xm))
            (loss / micro).backward()
        _average(net, world_size, skip="gate" if bug == "gate_not_reduced" else "", divide=bug != "sum_no_divide")
        opt.step()
        if bug == "rank1_nudge" and step == 1 and _rank() == 1:
            with torch.no_grad():
                net.head.weight.mul_(1.01)  # a change outside the optimizer, on one rank
        if teacher is not None and not (bug in ("ema_rank0_only", "ema_late_rank0") and _rank() != 0):
            teacher.update(net, momentum=ema_momentum(bug, step + (bug == "ema_ahead"), ranks=True))


def reference(world_size: int, bug: str = "", steps: int = 4, micro: int = 1) -> None:
    """One device, the global batch (``bug`` and ``micro`` only say whether a teacher is trained)."""
    torch.manual_seed(0)
    net = Net()
    teacher = Teacher(net) if (bug.startswith("ema") or bug == "teacher") and not bug.startswith("ema_late") else None
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    for step in range(steps):
        if bug.startswith("ema_late") and step == 1:
            teacher = Teacher(net)
        x, y = batch(step)
        opt.zero_grad()
        loss = 0.0
        for xs, ys in zip(x.chunk(world_size), y.chunk(world_size)):  # each rank's block, as the ranks see it
            out = net(xs)
            part = nn.functional.mse_loss(out, ys)
            if _runs(teacher, bug):
                part = part + nn.functional.mse_loss(out, teacher(xs))
            loss = loss + part / world_size
        loss.backward()
        opt.step()
        if teacher is not None:
            teacher.update(net, momentum=ema_momentum(bug, step))


def ema_momentum(bug: str, step: int, ranks: bool = False) -> float:
    """0.9, or warmed up as min(1 - 1 / (step + 1), 0.9) (timm's and Mean Teacher's) where ``bug`` is
    ``ema_warm`` (the ranks leave the warm-up out) or ``ema_ahead`` (the ranks count it from step 1); the
    ranks' ``ema_momentum``: 0.8."""
    if bug in ("ema_momentum", "ema_late_momentum") and ranks:
        return 0.8
    warm = bug == "ema_ahead" or (bug == "ema_warm" and not ranks)
    return min(1 - 1 / (step + 1), 0.9) if warm else 0.9


def ddp_bf16(world_size: int, steps: int = 3) -> None:
    """DDP with torch's bf16_compress_hook: gradients reduced in bfloat16."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(Net())
    model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(steps):
        x, y = (t.chunk(world_size)[_rank()] for t in batch(step))
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def reference_plain(world_size: int, steps: int = 3) -> None:
    """One device, the global batch, one backward."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()


def logged(log, world_size: int, factor: float = 1.0, steps: int = 3, from_step: int = 0) -> None:
    """``record="log"``: hand-written data parallelism that logs ``factor`` x the loss it backpropagates
    (from step ``from_step`` on)."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        x, y = (t.chunk(world_size)[_rank()] for t in batch(step))
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        _average(net, world_size)
        log(net, loss.detach() * (factor if step >= from_step else 1.0))
        opt.step()


def logged_reference(log, world_size: int, steps: int = 3) -> None:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        log(net, loss)
        opt.step()


def scheduled(world_size: int, bug: str = "", steps: int = 4, micro: int = 1, reference: bool = False,
              blocks: bool = False, clip: float = 0.0) -> None:
    """SGD with weight decay and a StepLR schedule, hand-written data parallelism (``reference=True``: one
    device, the global batch; with ``blocks`` as the ranks' W blocks, each block's mean loss backpropagated
    and the summed gradients divided by W: the same gradients, a loss counted W times). Bugs on the ranks:
    ``wd`` (weight decay 1e-4 relative off), ``sched_micro`` (the scheduler stepped after every micro-batch),
    ``sched_first`` (stepped before the optimizer), ``sched_epoch`` (stepped per epoch: never within these
    steps), ``sched_twice`` (stepped twice per update); with ``clip`` (a max norm) the gradients are clipped before the step, and on the ranks
    ``clip_micro`` clips after each micro-batch's backward instead, ``clip_late`` after opt.step(),
    ``clip_summed`` by hand with the tensors' norms summed, ``clip_per_tensor`` each tensor by its own norm;
    ``micro_undivided``: the ranks' micro-batch losses are not divided by ``micro``."""
    torch.manual_seed(0)
    net = Net()
    wd = 0.05 * (1 + 1e-4) if bug == "wd" and not reference else 0.05
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9, weight_decay=wd)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    for step in range(steps):
        x, y = batch(step) if reference else (t.chunk(world_size)[_rank()] for t in batch(step))
        opt.zero_grad()
        for xm, ym in zip(x.chunk(world_size if blocks else micro), y.chunk(world_size if blocks else micro)):
            divide = 1 if blocks or bug == "micro_undivided" and not reference else micro
            (nn.functional.mse_loss(net(xm), ym) / divide).backward()
            if bug == "sched_micro" and not reference:
                sched.step()  # the scheduler stepped per micro-batch
            if bug == "clip_micro" and not reference:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)  # each micro-batch's partial sum clipped
        if blocks:
            for p in net.parameters():
                p.grad.div_(world_size)
        elif not reference:
            _average(net, world_size)
        if clip and (reference or bug not in ("clip_micro", "clip_late", "clip_summed", "clip_per_tensor")):
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        elif bug == "clip_summed":  # by hand, with the tensors' norms summed (not the root of their squares)
            coef = min(1.0, clip / (sum(float(p.grad.norm()) for p in net.parameters()) + 1e-6))
            for p in net.parameters():
                p.grad.mul_(coef)
        elif bug == "clip_per_tensor":
            for p in net.parameters():
                torch.nn.utils.clip_grad_norm_([p], clip)  # each tensor by its own norm
        if bug == "sched_first" and not reference:
            sched.step()  # the scheduler stepped before the optimizer
        opt.step()
        if bug == "clip_late" and not reference:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)  # after the step: it used them unclipped
        if bug not in ("sched_micro", "sched_first", "sched_epoch") or reference:
            sched.step()
        if bug == "sched_twice" and not reference:
            sched.step()  # a second step per update (a per-epoch length stepped per update runs as fast)


def amp_scaled(world_size: int, bug: str = "", steps: int = 4, reference: bool = False) -> None:
    """A GradScaler (CPU, float32: its scale multiplies the loss) with clipping, hand-written data
    parallelism (``reference=True``: one device, the global batch). Bugs on the ranks: ``clip_scaled``
    (clip_grad_norm_ before scaler.unscale_: the clip sees the scaled gradients); ``overflow`` (a scale
    that overflows float32: the reference's backs off and then steps, a new scaler every step never does)."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127 if bug == "overflow" else 2.0 ** 16)
    for step in range(steps):
        x, y = batch(step) if reference else (t.chunk(world_size)[_rank()] for t in batch(step))
        opt.zero_grad()
        if bug == "overflow" and not reference:
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)  # a new scaler every step: never backs off
        big = 1e6 if bug == "overflow" else 1.0  # on both sides: 2**127 times it overflows float32 for sure
        scaler.scale(nn.functional.mse_loss(net(x), y) * big).backward()
        if not reference:
            _average(net, world_size)
        if bug == "clip_scaled" and not reference:
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)  # before unscale_: clips scaled gradients
        else:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()


class Shaky(nn.Module):
    """A layer that acts in training mode only (a dropout whose mask is each row's own, the same on
    both sides): a forward left in eval() computes otherwise."""

    def forward(self, x):
        return x * (1 + 0.5 * torch.sin(1000 * x.sum(1, keepdim=True))) if self.training else x


def plateau(world_size: int, bug: str = "", steps: int = 5, reference: bool = False) -> None:
    """Hand-written data parallelism, a validation pass after every step (``eval()``, ``no_grad``, the
    summed loss and row count all-reduced, ``train()`` again) and ``ReduceLROnPlateau`` stepped with it.
    ``reference=True``: one device backpropagates the ranks' W blocks one by one (its loss is W x a
    rank's) and divides the summed gradients by W. Bugs on the ranks: ``metric_local`` (each rank's own
    validation loss), ``metric_train`` (each rank's own training loss), ``eval_left`` (no ``train()``
    after validation), ``metric_on_train_rows`` (the ranks validate on the step's training rows, all-reduced:
    one metric on every rank, not the reference's), ``mode_max`` (mode='max' on a loss), ``stepped_twice``
    (scheduler.step(val) twice per validation), ``val_in_train`` (no ``eval()`` before validation)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(DIM, HIDDEN), Shaky(), nn.Tanh(), nn.Linear(HIDDEN, OUT))
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    mode = "max" if bug == "mode_max" and not reference else "min"
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode=mode, factor=0.5, patience=0, threshold=0.0)
    vx, vy = batch(99)
    blocks = world_size if reference else 1
    for step in range(steps):
        x, y = batch(step) if reference else (t.chunk(world_size)[_rank()] for t in batch(step))
        opt.zero_grad()
        for xb, yb in zip(x.chunk(blocks), y.chunk(blocks)):
            loss = nn.functional.mse_loss(net(xb), yb)
            loss.backward()
        if reference:
            for p in net.parameters():
                p.grad.div_(world_size)
        else:
            _average(net, world_size)
        opt.step()
        if bug != "val_in_train" or reference:
            net.eval()
        with torch.no_grad():
            if reference:
                val = nn.functional.mse_loss(net(vx), vy, reduction="sum") / len(vx)
            else:
                rows = (x, y) if bug == "metric_on_train_rows" else (vx.chunk(world_size)[_rank()],
                                                                    vy.chunk(world_size)[_rank()])
                mine = nn.functional.mse_loss(net(rows[0]), rows[1], reduction="sum")
                total = torch.stack([mine, torch.tensor(float(len(vx) // world_size))])
                if bug != "metric_local":
                    tdist.all_reduce(total)
                val = total[0] / total[1]
        if bug != "eval_left" or reference:
            net.train()
        sched.step(loss.detach() if bug == "metric_train" and not reference else val)
        if bug == "stepped_twice" and not reference:
            sched.step(val)  # a second call with the same metric (a wrapper that steps it per process)


class Balanced(nn.Module):
    """A network whose outputs take a bias no optimizer steps (an aux-loss-free router's): after each
    step it moves towards the classes the batch chose less often."""

    def __init__(self):
        super().__init__()
        self.net = Net()
        self.register_buffer("bias", torch.zeros(OUT))

    def forward(self, x):
        return self.net(x) + self.bias


def balanced(world_size: int, bug: str = "", steps: int = 4, reference: bool = False) -> None:
    """Hand-written data parallelism; the buffer's update reads the global batch's counts (all_reduce).
    Bugs on the ranks: ``counts_local`` (each rank's own counts), ``sign_flipped`` (moves the other way)."""
    torch.manual_seed(0)
    model = Balanced()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(step) if reference else (t.chunk(world_size)[_rank()] for t in batch(step))
        opt.zero_grad()
        out = model(x)
        nn.functional.mse_loss(out, y).backward()
        if not reference:
            _average(model, world_size)
        opt.step()
        with torch.no_grad():
            counts = torch.bincount((out + y).argmax(1), minlength=OUT).float()
            if not reference and bug != "counts_local":
                tdist.all_reduce(counts)
            push = (counts.mean() - counts) * 0.01
            model.bias.add_(-push if bug == "sign_flipped" and not reference else push)


def accumulate(world_size: int, bug: str = "", steps: int = 4, k: int = 2, reference: bool = False) -> None:
    """Gradient accumulation as a flat loop over micro-batches (``i``), an optimizer step after every k-th:
    ``(i + 1) % k == 0``; ``reference=True``: one device, one pass over a step's k micro-batches (each
    rank's block of each). Bug on the ranks: ``boundary_off`` steps when ``i % k == 0`` (after micro-batch 0
    alone, then every k)."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    if reference:
        for step in range(steps):
            x, y = (torch.cat([t for i in range(k) for t in batch(step * k + i)[j].chunk(world_size)])
                    for j in (0, 1))
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            opt.zero_grad()
        return
    for i in range(steps * k):
        x, y = (t.chunk(world_size)[_rank()] for t in batch(i))
        (nn.functional.mse_loss(net(x), y) / k).backward()
        if (i % k == 0) if bug == "boundary_off" else ((i + 1) % k == 0):
            _average(net, world_size)
            opt.step()  # after the k-th micro-batch
            opt.zero_grad()



class _Front(nn.Module):
    def __init__(self, net: Net):
        super().__init__()
        self.body = net.body

    def forward(self, x):
        return torch.tanh(self.body(x))


class _Back(nn.Module):
    def __init__(self, net: Net):
        super().__init__()
        self.gate, self.head = net.gate, net.head

    def forward(self, h):
        return self.head(h * torch.sigmoid(self.gate(h)))


def staged(world_size: int, bug: str = "", steps: int = 4, reference: bool = False) -> None:
    """A two-stage pipeline by hand (2 ranks; ``reference=True``: the whole network on one device): rank 0
    runs the body and sends its output, rank 1 receives it (``requires_grad_()``), runs the rest and the
    loss, and sends the gradient of what it received back. Bug: ``recv_no_grad`` leaves
    ``requires_grad_()`` out, so rank 1 has no gradient to send and rank 0's body is sent zeros."""
    torch.manual_seed(0)
    net = Net()
    stage = net if reference else (_Front(net) if _rank() == 0 else _Back(net))
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(step)
        if reference:
            nn.functional.mse_loss(net(x), y).backward()
        elif _rank() == 0:
            h = stage(x)
            tdist.send(h.detach(), 1)
            grad = torch.empty_like(h)
            tdist.recv(grad, 1)
            h.backward(grad)
        else:
            got = torch.empty(BATCH, HIDDEN)
            tdist.recv(got, 0)
            if bug != "recv_no_grad":
                got.requires_grad_()
            nn.functional.mse_loss(stage(got), y).backward()
            tdist.send(got.grad if got.grad is not None else torch.zeros_like(got), 0)
        opt.step()
        opt.zero_grad()


def ramped(world_size: int, bug: str = "", steps: int = 4, reference: bool = False) -> None:
    """Hand-written data parallelism with a consistency term whose weight ramps up from 0 over the steps
    (a KL or consistency warm-up); the term is the outputs' squared mean. Bug on the ranks: ``ramp_fast``
    (the ramp indexed by micro-step: twice as fast)."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(step) if reference else (t.chunk(world_size)[_rank()] for t in batch(step))
        opt.zero_grad()
        out = net(x)
        ramp = min(1.0, (2 * step if bug == "ramp_fast" and not reference else step) / steps)
        (nn.functional.mse_loss(out, y) + ramp * out.pow(2).mean()).backward()
        if not reference:
            _average(net, world_size)
        opt.step()
