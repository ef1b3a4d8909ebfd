"""Loops whose steps are more than one forward and backward (``tests/test_step_passes.py``): two passes
per step with the gradients zeroed between them (SAM's ascent, then its descent), two micro-batches
accumulated per step, a critic with a gradient penalty (``torch.autograd.grad(create_graph=True)``), and
a 2-D layout by hand (two tensor-parallel groups of two, data parallel across them), and a
BatchNorm net the reference runs on blocks of a rank's size (ghost BatchNorm). Every side is
seeded alike; ``bug`` changes the ranks' loop only."""
import torch
import torch.distributed as tdist
from torch import nn

ROWS, X, STEPS = 8, 6, 4


def batch(step: int):
    g = torch.Generator().manual_seed(50 + step)
    return torch.randn(ROWS, X, generator=g), torch.randn(ROWS, 1, generator=g)


def _one_device(model: nn.Module, opt, loss_of) -> None:
    """The one-device loop: each step the whole batch, ``loss_of(model, x, y, step)`` backpropagated, one step."""
    for step in range(STEPS):
        x, y = batch(step)
        loss_of(model, x, y, step).backward()
        opt.step()
        opt.zero_grad()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(X, 16), nn.Tanh(), nn.Linear(16, 1))


def _mean_grads(model: nn.Module, world_size: int) -> None:
    for p in model.parameters():
        tdist.all_reduce(p.grad)
        p.grad /= world_size


def _sam_step(model, opt, x, y, sync, zero_between: bool = True) -> None:
    """SAM: ascend to w + rho g/||g||, take the gradient there, restore w, step."""
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    sync()
    norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    moved = []
    with torch.no_grad():
        for p in model.parameters():
            e = 0.05 * p.grad / (norm + 1e-12)
            p.add_(e)
            moved.append(e)
    if zero_between:
        opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    sync()
    with torch.no_grad():
        for p, e in zip(model.parameters(), moved):
            p.sub_(e)
    opt.step()
    opt.zero_grad()


class Ghost(nn.Module):
    """A BatchNorm net run on blocks of a rank's size (ghost BatchNorm, as MoCo's shuffled keys): the
    one-device loop normalises each block alone, as data-parallel ranks without SyncBatchNorm do."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(X, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 1))
        self.temperature, self.blocks = 1.0, 1

    def forward(self, x):
        return torch.cat([self.body(c) for c in x.chunk(self.blocks)]) / self.temperature


def _penalty(model, x):
    """A gradient penalty on the inputs: its gradient is taken with create_graph (a double backward)."""
    x = x.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
    return ((g.norm(dim=1) - 1) ** 2).mean()


def train(world_size: int, kind: str, bug: str = "") -> None:
    rank = tdist.get_rank()
    model = Ghost() if kind == "ghost" else _model()
    if bug == "temperature":
        model.temperature = 2.0  # a constant of the forward set otherwise on the ranks
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    n = ROWS // world_size
    sync = lambda: _mean_grads(model, world_size)  # noqa: E731
    for step in range(STEPS):
        x, y = batch(step)
        sl = slice(rank * n, (rank + 1) * n)
        if kind == "sam":
            _sam_step(model, opt, x[sl], y[sl], sync, zero_between=bug != "kept")
        elif kind == "accum":
            for micro in range(2):  # two micro-batches of the rank's rows
                part = slice(sl.start + micro * n // 2, sl.start + (micro + 1) * n // 2)
                (nn.functional.mse_loss(model(x[part]), y[part]) / 2).backward()
                if bug == "micro_step":
                    sync()
                    opt.step()
                    opt.zero_grad()
            if bug != "micro_step":
                sync()
                opt.step()
                opt.zero_grad()
        elif kind == "ghost":
            nn.functional.mse_loss(model(x[sl]), y[sl]).backward()
            sync()
            opt.step()
            opt.zero_grad()
        else:  # "penalty": the critic's term on real rows, and the penalty on other rows
            rows = slice(0, n) if bug == "unsharded" and step >= 2 else sl
            loss = model(x[rows]).mean() + 0.1 * _penalty(model, y[rows].expand(-1, X) * x[rows])
            loss.backward()
            sync()
            opt.step()
            opt.zero_grad()


def reference(world_size: int, kind: str) -> None:
    model = Ghost() if kind == "ghost" else _model()
    model.blocks = world_size  # ghost BatchNorm: blocks of a rank's size
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(step)
        if kind == "sam":
            _sam_step(model, opt, x, y, lambda: None)
        elif kind == "accum":
            for micro in range(2):
                part = slice(micro * ROWS // 2, (micro + 1) * ROWS // 2)
                (nn.functional.mse_loss(model(x[part]), y[part]) / 2).backward()
            opt.step()
            opt.zero_grad()
        elif kind == "ghost":
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        else:
            loss = model(x).mean() + 0.1 * _penalty(model, y.expand(-1, X) * x)
            loss.backward()
            opt.step()
            opt.zero_grad()


# -- a 2-D layout by hand: ranks {0, 1} and {2, 3} are tensor-parallel groups, {0, 2} and {1, 3} replicas --
class ColumnRow(nn.Module):
    """A Megatron MLP by hand: the first layer's rows and the second's columns split over the group."""

    def __init__(self, rank_in_group: int = 0, tp: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        full1, full2, self.head = nn.Linear(X, 16), nn.Linear(16, 1, bias=False), nn.Linear(1, 1)
        part = slice(rank_in_group * 16 // tp, (rank_in_group + 1) * 16 // tp)
        self.fc1 = nn.Linear(X, 16 // tp)
        self.fc2 = nn.Linear(16 // tp, 1, bias=False)
        with torch.no_grad():
            self.fc1.weight.copy_(full1.weight[part])
            self.fc1.bias.copy_(full1.bias[part])
            self.fc2.weight.copy_(full2.weight[:, part])
        self.group = None

    def forward(self, x):
        out = self.fc2(torch.tanh(self.fc1(x)))
        if self.group is not None:
            out = _ReduceForward.apply(out, self.group)
        return self.head(out)


class _ReduceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        tdist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


# the pieces of the first tensor-parallel group put together (the other group holds the same pieces)
SHARDS_2D = {"fc1.*": lambda pieces: torch.cat(pieces[:2], 0), "fc2.weight": lambda pieces: torch.cat(pieces[:2], 1)}


def train_2d(world_size: int, bug: str = "") -> None:
    rank = tdist.get_rank()
    groups = [tdist.new_group([0, 1]), tdist.new_group([2, 3])]
    replicas = [tdist.new_group([0, 2]), tdist.new_group([1, 3])]
    group, place = rank // 2, rank % 2  # its tensor-parallel group, and its place in it
    model = ColumnRow(place, 2)
    model.group = groups[group]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    n = ROWS // 2
    for step in range(STEPS):
        x, y = batch(step)
        sl = slice(group * n, (group + 1) * n)  # each tensor-parallel group its half of the batch
        nn.functional.mse_loss(model(x[sl]), y[sl]).backward()
        if bug != "no_dp_reduce":
            for p in model.parameters():
                tdist.all_reduce(p.grad, group=replicas[place])
                p.grad /= 2
        opt.step()
        opt.zero_grad()


def reference_2d(world_size: int) -> None:
    model = ColumnRow()
    _one_device(model, torch.optim.SGD(model.parameters(), lr=0.05), lambda m, x, y, s: nn.functional.mse_loss(m(x), y))


# -- an optimizer written in the loop's file (LARS-like): each tensor's step scaled by its trust ratio --
class Trust(torch.optim.Optimizer):
    """p -= lr x trust(p) x (g + wd x p), trust = ||p|| / ||g + wd x p|| per matrix; the 1-D tensors
    (biases) take neither decay nor trust. ``bug`` changes the rule on the ranks."""

    def __init__(self, params, lr: float = 0.05, wd: float = 0.01, bug: str = "") -> None:
        super().__init__(params, dict(lr=lr, wd=wd))
        self.bug = bug

    @torch.no_grad()
    def step(self):
        group = self.param_groups[0]
        ps = [p for p in group["params"] if p.grad is not None]
        total = torch.norm(torch.stack([p.norm() for p in ps])) / torch.norm(torch.stack([p.grad.norm() for p in ps]))
        for p in ps:
            adapt = p.dim() > 1 or self.bug == "decay_1d"
            d = p.grad + group["wd"] * p if adapt else p.grad
            trust = (total if self.bug == "global_trust" else p.norm() / d.norm()) if adapt else 1.0
            p.sub_(group["lr"] * (1.1 if self.bug == "scaled" else 1.0) * trust * d)


def _ema(model: nn.Module, teacher: nn.Module, m: float) -> None:
    with torch.no_grad():
        for t, p in zip(teacher.parameters(), model.parameters()):
            t.mul_(m).add_(p, alpha=1 - m)


class Student(nn.Module):
    """A net and its EMA teacher (no gradient): the teacher's outputs are the targets."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.teacher = _model(), _model()
        self.teacher.requires_grad_(False)

    def forward(self, x):
        return self.net(x), self.teacher(x)


def train_opt(world_size: int, bug: str = "") -> None:
    rank = tdist.get_rank()
    model = Student()
    opt = Trust(model.parameters(), bug=bug)  # the teacher's too, as MoCo's loop builds it: they get no gradient
    n = ROWS // world_size
    for step in range(STEPS):
        x, y = batch(step)
        sl = slice(rank * n, (rank + 1) * n)
        out, target = model(x[sl])
        nn.functional.mse_loss(out, y[sl] + 0.1 * target).backward()
        _mean_grads(model.net, world_size)
        opt.step()
        opt.zero_grad()
        _ema(model.net, model.teacher, 0.1 if bug == "ema_swapped" else 0.9)


def reference_opt(world_size: int) -> None:
    model = Student()
    opt = Trust(model.parameters())
    for step in range(STEPS):
        x, y = batch(step)
        out, target = model(x)
        nn.functional.mse_loss(out, y + 0.1 * target).backward()
        opt.step()
        opt.zero_grad()
        _ema(model.net, model.teacher, 0.9)


# -- experts sharded by hand: every rank the whole batch, its own experts, the gate whole on every rank --
class Experts(nn.Module):
    def __init__(self, weight) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.clone())


class MoE(nn.Module):
    """A soft mixture of 4 linear experts; rank r of W holds experts r x 4/W on, and the outputs are summed
    over the ranks (all_reduce forward, identity backward)."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate = nn.Linear(X, 4)
        full = torch.randn(4, X, 1) * 0.3
        self.per = 4 // world
        self.first = rank * self.per
        self.experts = Experts(full[self.first:self.first + self.per])
        self.group = None

    def forward(self, x):
        probs = torch.softmax(self.gate(x), dim=1)[:, self.first:self.first + self.per]
        out = sum(probs[:, e:e + 1] * (x @ self.experts.weight[e]) for e in range(self.per))
        return _ReduceForward.apply(out, self.group) if self.group is not None else out


def train_moe(world_size: int, bug: str = "") -> None:
    model = MoE(tdist.get_rank(), world_size)
    model.group = tdist.group.WORLD
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(step)  # every rank the whole batch: each computes its experts' part of every row
        nn.functional.mse_loss(model(x), y).backward()
        if bug != "gate_unreduced":
            for p in model.gate.parameters():
                tdist.all_reduce(p.grad)  # each rank's part of the gate's gradient, summed
        opt.step()
        opt.zero_grad()


def reference_moe(world_size: int) -> None:
    model = MoE()
    _one_device(model, torch.optim.SGD(model.parameters(), lr=0.05), lambda m, x, y, s: nn.functional.mse_loss(m(x), y))


# -- per-sample gradients with torch.func (DP-SGD's clipping): the model runs forward inside vmap(grad) --
def _clipped_sum(model: nn.Module, x, y, clip: float = 1.0):
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return nn.functional.mse_loss(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    norms = torch.sqrt(sum((t.reshape(t.shape[0], -1) ** 2).sum(1) for t in g.values()))
    f = (clip / (norms + 1e-6)).clamp(max=1.0)
    return {k: (t * f.view(-1, *[1] * (t.dim() - 1))).sum(0) for k, t in g.items()}


def train_per_sample(world_size: int, bug: str = "") -> None:
    rank = tdist.get_rank()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = ROWS // world_size
    for step in range(STEPS):
        x, y = batch(step)
        sl = slice(rank * n, (rank + 1) * n)
        summed = _clipped_sum(model, x[sl], y[sl], clip=0.5 if bug == "clip" else 1.0)
        for k, p in model.named_parameters():
            tdist.all_reduce(summed[k])
            p.grad = summed[k] / ROWS
        opt.step()
        opt.zero_grad()


def reference_per_sample(world_size: int) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(step)
        summed = _clipped_sum(model, x, y)
        for k, p in model.named_parameters():
            p.grad = summed[k] / ROWS
        opt.step()
        opt.zero_grad()


# -- a model called with the whole batch, as a LightningModule's step is: (x, y) or {"x": x, "y": y} --
class BatchModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, batch):
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        return nn.functional.mse_loss(self.net(x), y)


def train_batch(world_size: int, kind: str, bug: str = "") -> None:
    rank = tdist.get_rank()
    model = BatchModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    n = ROWS // world_size
    for step in range(STEPS):
        x, y = batch(step)
        sl = slice(0, n) if bug == "unsharded" else slice(rank * n, (rank + 1) * n)
        target = y[sl] + 0.1 if bug == "targets" else y[sl]  # targets built otherwise on the ranks
        model({"x": x[sl], "y": target} if kind == "dict" else (x[sl], target)).backward()
        _mean_grads(model, world_size)
        opt.step()
        opt.zero_grad()


def reference_batch(world_size: int, kind: str) -> None:
    model = BatchModel()
    _one_device(model, torch.optim.SGD(model.parameters(), lr=0.05),
                lambda m, x, y, s: m({"x": x, "y": y} if kind == "dict" else (x, y)))


# -- a model with a mask argument (an attention mask's role): the ranks' bug leaves it out --
class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, x, mask=None):
        return self.net(x * mask if mask is not None else x)


def _mask(step: int):
    return (torch.arange(ROWS * X).reshape(ROWS, X) % (3 + step % 2) != 0).float()


def train_masked(world_size: int, bug: str = "") -> None:
    rank = tdist.get_rank()
    torch.manual_seed(0)
    model = Masked()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    n = ROWS // world_size
    for step in range(STEPS):
        x, y = batch(step)
        sl = slice(rank * n, (rank + 1) * n)
        out = model(x[sl]) if bug == "no_mask" else model(x[sl], mask=_mask(step)[sl])
        nn.functional.mse_loss(out, y[sl]).backward()
        _mean_grads(model, world_size)
        opt.step()
        opt.zero_grad()


def reference_masked(world_size: int) -> None:
    model = Masked()
    _one_device(model, torch.optim.SGD(model.parameters(), lr=0.05),
                lambda m, x, y, s: nn.functional.mse_loss(m(x, mask=_mask(s)), y))


# -- two optimizers, one per part (a trunk and a head): each optimizer.step() is a step --
def train_two(world_size: int, bug: str = "") -> None:
    rank = tdist.get_rank()
    model = _model()
    trunk = Trust(model[0].parameters(), bug="scaled" if bug == "trunk_scaled" else "")
    head = torch.optim.SGD(model[2].parameters(), lr=0.05 * (world_size if bug == "head_lr_world" else 1))
    n = ROWS // world_size
    for step in range(STEPS):
        x, y = batch(step)
        sl = slice(rank * n, (rank + 1) * n)
        nn.functional.mse_loss(model(x[sl]), y[sl]).backward()
        _mean_grads(model, world_size)
        trunk.step()
        head.step()
        trunk.zero_grad()
        head.zero_grad()


def reference_two(world_size: int) -> None:
    model = _model()
    trunk, head = Trust(model[0].parameters()), torch.optim.SGD(model[2].parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        trunk.step()
        head.step()
        trunk.zero_grad()
        head.zero_grad()
