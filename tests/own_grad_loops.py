"""Loops whose optimizer does not step with ``.grad`` as the loop left it, as mixed-precision and ZeRO
code written by hand does (``tests/test_own_gradients.py``): Megatron's ``main_grad`` (a post-accumulate
hook moves each gradient into an fp32 buffer and clears ``.grad``), and a reference that zeroes its
gradients between the blocks it backpropagates and steps with their sum kept in its own buffer. Module
level, so they travel to the ranks by name."""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn

ROWS, D, STEPS, LR = 8, 6, 3, 0.1


def batch(step: int):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randn(ROWS, D, generator=g), torch.randn(ROWS, 1, generator=g)


def regression_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, 1))


class MainGradSGD(torch.optim.Optimizer):
    """SGD over ``p.main_grad`` (Megatron's fp32 gradient buffer), or over a sum the loop hands it."""

    def __init__(self, params) -> None:
        super().__init__(params, {"lr": LR})
        self.summed = None

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        grads = self.summed if self.summed is not None else [getattr(p, "main_grad", p.grad) for p in params]
        for p, g in zip(params, grads):
            p.sub_(LR * g)
        return None


def _main_grads(model: nn.Module) -> None:
    for p in model.parameters():
        p.main_grad = torch.zeros_like(p)

        def move(param):
            param.main_grad.add_(param.grad)
            param.grad = None
        p.register_post_accumulate_grad_hook(move)


def main_grad_train(world_size: int, bug: str = "") -> None:
    rank, n = tdist.get_rank(), ROWS // world_size
    model = regression_model()
    _main_grads(model)
    opt = MainGradSGD(model.parameters())
    for step in range(STEPS):
        x, y = batch(step)
        for p in model.parameters():
            p.main_grad.zero_()
        nn.functional.mse_loss(model(x[rank * n:(rank + 1) * n]), y[rank * n:(rank + 1) * n]).backward()
        for p in model.parameters():
            tdist.all_reduce(p.main_grad)
            if bug != "sum_not_mean":
                p.main_grad /= world_size
        opt.step()


def main_grad_reference(world_size: int) -> None:
    model = regression_model()
    _main_grads(model)
    opt = MainGradSGD(model.parameters())
    for step in range(STEPS):
        x, y = batch(step)
        for p in model.parameters():
            p.main_grad.zero_()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def plain_train(world_size: int, bug: str = "") -> None:
    """Hand-written data parallel with ``.grad``: the ranks' side for the summing reference."""
    rank, n = tdist.get_rank(), ROWS // world_size
    model = regression_model()
    opt = MainGradSGD(model.parameters())
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x[rank * n:(rank + 1) * n]), y[rank * n:(rank + 1) * n]).backward()
        for p in model.parameters():
            tdist.all_reduce(p.grad)
            p.grad /= world_size if bug != "sum_not_mean" else 1
        opt.step()


def summing_reference(world_size: int) -> None:
    """The ranks' blocks one after another, gradients zeroed between them and summed in a buffer of its own."""
    model = regression_model()
    opt = MainGradSGD(model.parameters())
    n = ROWS // world_size
    for step in range(STEPS):
        x, y = batch(step)
        total = None
        for r in range(world_size):
            opt.zero_grad()
            nn.functional.mse_loss(model(x[r * n:(r + 1) * n]), y[r * n:(r + 1) * n]).backward()
            grads = [p.grad.clone() / world_size for p in model.parameters()]
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        opt.summed = total
        opt.step()
