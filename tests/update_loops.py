"""A loop whose optimizer is written in the loop's file and treats matrices by their shape
(``tests/test_step_passes.py``): SGD whose matrix steps are scaled by ``max(1, rows / cols) ** 0.5``, as
Muon scales its orthogonalised update. ``bug`` changes the ranks' rule only: the scale inverted (columns
over rows), each row's step normalised (another direction for the matrices, the vectors untouched), or two
results of one shape written back into each other's places, or a weight decay given to the matrices."""
import torch
import torch.distributed as tdist
from torch import nn

from tests.pass_loops import ROWS, STEPS, X, batch

LR = 0.05


class ShapeScaled(torch.optim.Optimizer):
    def __init__(self, params, lr: float = LR, bug: str = "") -> None:
        super().__init__(params, dict(lr=lr))
        self.bug = bug

    @torch.no_grad()
    def step(self):
        stepped = []
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            d = p.grad
            if p.dim() > 1:
                rows, cols = p.shape
                d = d * max(1.0, cols / rows if self.bug == "inverted" else rows / cols) ** 0.5
                if self.bug == "row_normalised":
                    d = d / d.norm(dim=1, keepdim=True) * d.norm() / rows ** 0.5
                if self.bug == "decay_matrices":
                    d = d + 0.1 * p
            stepped.append((p, p - self.param_groups[0]["lr"] * d))
        if self.bug == "placed":  # the two 16x8 results written back in the other order (an owner map's slip)
            slots = [i for i, (p, _) in enumerate(stepped) if p.shape == (16, 8)]
            results = [stepped[j][1] for j in reversed(slots)]
            for i, new in zip(slots, results):
                stepped[i] = (stepped[i][0], new)
        for p, new in stepped:
            p.copy_(new)


def _model() -> nn.Module:
    """Matrices of four shapes, two of them held by two layers each."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(X, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 16), nn.Tanh(),
                         nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def train(world_size: int, bug: str = "") -> None:
    rank, n = tdist.get_rank(), ROWS // world_size
    model = _model()
    opt = ShapeScaled(model.parameters(), bug=bug)
    for step in range(STEPS):
        x, y = batch(step)
        nn.functional.mse_loss(model(x[rank * n:(rank + 1) * n]), y[rank * n:(rank + 1) * n]).backward()
        for p in model.parameters():
            tdist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
        opt.zero_grad()


def reference(world_size: int) -> None:
    model = _model()
    opt = ShapeScaled(model.parameters())
    for step in range(STEPS):
        x, y = batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
