"""Loops whose ranks hold what the reference holds otherwise (``tests/test_tied_and_sparse.py``): a 2-stage
pipeline by hand whose last stage keeps its own copy of the word embedding as its output layer (Megatron's
tied embeddings: started equal, their gradients summed over the two stages), against one model that
uses the embedding itself; and a DDP loop with a sparse embedding (``nn.EmbeddingBag(sparse=True)``,
``SparseAdam``). ``bug`` changes the ranks' loop only."""
import torch
import torch.distributed as tdist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

V, D, T, ROWS, STEPS = 12, 8, 4, 8, 3


def tokens(step: int):
    g = torch.Generator().manual_seed(90 + step)
    return torch.randint(0, V, (ROWS, T), generator=g), torch.randint(0, V, (ROWS, T), generator=g)


class Stage(nn.Module):
    """``first``: the embedding and layer 0; ``last``: layer 1 and the output layer (the embedding
    itself where one stage is both, else a copy started at zero and filled from the first stage)."""

    def __init__(self, first: bool, last: bool):
        super().__init__()
        torch.manual_seed(0)
        emb, layers = nn.Embedding(V, D), [nn.Linear(D, D), nn.Linear(D, D)]
        self.first, self.last = first, last
        if first:
            self.embedding, self.layer0 = emb, layers[0]
        if last:
            self.layer1 = layers[1]
        if last and not first:
            self.output = nn.Linear(D, V, bias=False)
            with torch.no_grad():
                self.output.weight.normal_()

    def tied(self) -> torch.Tensor:
        return self.embedding.weight if self.first else self.output.weight

    def forward(self, x):
        h = torch.tanh(self.layer0(self.embedding(x))) if self.first else x
        return torch.tanh(self.layer1(h)) @ self.tied().T if self.last else h


def pipeline(world_size: int, bug=None) -> None:
    """Rank 0 the first stage, rank 1 the last: activations sent forward, their gradient back, then
    the tied copies' gradients summed over both stages."""
    rank = tdist.get_rank()
    stage = Stage(first=rank == 0, last=rank == 1)
    if bug != "copy_not_synced":  # the copy keeps its own initialisation otherwise
        with torch.no_grad():
            if rank == 1:
                stage.tied().zero_()
            tdist.all_reduce(stage.tied())
    opt = torch.optim.SGD(stage.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = tokens(step)
        if rank == 0:
            h = stage(x)
            tdist.send(h.detach(), 1)
            grad = torch.empty_like(h)
            tdist.recv(grad, 1)
            h.backward(grad)
        else:
            h = torch.empty(ROWS, T, D)
            tdist.recv(h, 0)
            h.requires_grad_()
            F.cross_entropy(stage(h).reshape(-1, V), y.reshape(-1)).backward()
            tdist.send(h.grad, 0)
        tdist.all_reduce(stage.tied().grad)
        opt.step()
        opt.zero_grad()


class TiedModel(Stage):
    """One device, GPT-2 style: an output layer whose weight is the embedding's (one tensor, two names)."""

    def __init__(self):
        super().__init__(first=True, last=True)
        self.output = nn.Linear(D, V, bias=False)
        self.output.weight = self.embedding.weight

    def tied(self) -> torch.Tensor:
        return self.output.weight


def pipeline_reference(world_size: int, tied_modules: bool = False) -> None:
    model = TiedModel() if tied_modules else Stage(first=True, last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = tokens(step)
        F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.EmbeddingBag(V, D, mode="mean", sparse=True)
        self.head = nn.Linear(D, 1)

    def forward(self, x):
        return self.head(self.table(x)).squeeze(-1)


def _bag_loop(model, run, rows) -> None:
    sparse = torch.optim.SparseAdam(list(model.table.parameters()), lr=0.05)
    dense = torch.optim.Adam(model.head.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = tokens(step)
        x, y = rows(x), rows(y.float().mean(-1))
        F.mse_loss(run(x), y).backward()
        sparse.step()
        dense.step()
        sparse.zero_grad()
        dense.zero_grad()


def sparse_ddp(world_size: int) -> None:
    r, n = tdist.get_rank(), ROWS // world_size
    model = Bag()
    _bag_loop(model, DDP(model), lambda t: t[r * n:(r + 1) * n])


def sparse_reference(world_size: int) -> None:
    model = Bag()
    _bag_loop(model, model, lambda t: t)
