"""Pipeline parallel by hand with tied input and output embeddings (2 stages), and data parallel across
pipeline replicas when the world is 4. Ranks are laid out as Megatron-LM does with no tensor parallel:
stage ``rank // dp``, replica ``rank % dp``; the pipeline groups (and the embedding groups: the first and
last stage of a pipeline) are ``{i, i + dp}``, the data-parallel groups the ranks of one stage. Stage 0 holds
the word embedding and layer 0, stage 1 layer 1, a final norm and ``output_layer.weight``: its own copy of
the word embedding, zeroed at start and all-reduced over the embedding group so both copies start equal.
Every replica runs its block of the global batch as 4 micro-batches, all forwards then all backwards
(GPipe), the activations and their gradients sent by hand (``send``/``recv``); each micro-batch loss is its
token mean divided by the micro-batch count. After the backward passes the gradients are averaged over the
data-parallel group, then the two copies' gradients are summed over the embedding group (they stay equal).
SGD with momentum.

The one-device reference: one model whose output layer is the word embedding itself, on the global batch.

Follows NVIDIA/Megatron-LM ``megatron/core/distributed/finalize_model_grads.py`` (``finalize_model_grads``:
the data-parallel sync first, then ``_allreduce_word_embedding_grads``: ``torch.distributed.all_reduce(grad,
group=parallel_state.get_embedding_group())`` of ``shared_embedding_or_output_weight()``),
``megatron/core/models/common/language_module/language_module.py`` (``setup_embeddings_and_output_layer``:
the last stage's ``output_layer.weight`` zero-filled, then all-reduced over the embedding group) and
``megatron/core/pipeline_parallel/p2p_communication.py`` (activations forward, their gradients backward).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import gen, rank

V, D, T, GB, M, SEED = 12, 8, 4, 8, 4, 146
STEPS = 6
CORRECT = {"default": (2, 4)}
BUG_WORLD = 4   # two pipeline replicas: the data-parallel and embedding groups differ
BUGS = {
    "tied_grad_not_allreduced": "the word-embedding / output-layer gradients are not all-reduced over the embedding group: the tied copies drift apart",
    "tied_allreduce_wrong_group": "the tied weights' gradients are all-reduced over the data-parallel group instead of the embedding group (first and last stage)",
    "tied_grad_averaged": "the tied weights' gradients are averaged (divided by 2) over the embedding group instead of summed",
    "output_init_not_synced": "the last stage's output_layer.weight keeps its own random init: not zeroed and all-reduced from the first stage's embedding",
    "microbatch_not_scaled": "each micro-batch loss is its token mean, not divided by the number of micro-batches",
    "dp_average_missing": "the data-parallel all-reduce sums the replicas' gradients without dividing by the replica count",
}


class GPTStage(nn.Module):
    """The layers of one stage (global names ``layers.<i>``); ``pre``: the word embedding, ``post``: the
    final norm and the output layer (the embedding itself where one stage holds both)."""

    def __init__(self, pre: bool, post: bool, bug=None):
        super().__init__()
        torch.manual_seed(SEED)
        self.pre, self.post = pre, post
        emb = nn.Embedding(V, D)
        layers = nn.ModuleDict({str(i): nn.Linear(D, D) for i in range(2)})
        if pre:
            self.embedding = emb
        self.layers = nn.ModuleDict({k: m for k, m in layers.items() if (pre and k == "0") or (post and k == "1")})
        if post and not pre:
            g = gen(SEED + 1000)
            self.output_layer = nn.Linear(D, V, bias=False)
            with torch.no_grad():
                self.output_layer.weight.copy_(torch.randn(V, D, generator=g))
                if bug != "output_init_not_synced":
                    self.output_layer.weight.zero_()

    def shared_weight(self) -> torch.Tensor:
        return self.embedding.weight if self.pre else self.output_layer.weight

    def forward(self, x):
        h = self.embedding(x) if self.pre else x
        for layer in self.layers.values():
            h = h + torch.tanh(layer(h))
        return F.layer_norm(h, (D,)) @ self.shared_weight().T if self.post else h


def batch(step: int):
    g = gen(SEED + step)
    tokens = torch.randint(0, V, (GB, T), generator=g)
    return tokens, (3 * tokens + 1 + torch.arange(T)) % V


class Layout:
    """This rank's stage, replica and groups (every rank creates every group, in the same order)."""

    def __init__(self, world_size: int):
        self.dp = world_size // 2
        r = rank()
        self.stage, self.replica = r // self.dp, r % self.dp
        self.peer = r + self.dp if self.stage == 0 else r - self.dp
        emb = [tdist.new_group([i, i + self.dp]) for i in range(self.dp)]
        dps = [tdist.new_group([s * self.dp + i for i in range(self.dp)]) for s in range(2)] if self.dp > 1 else None
        self.emb_group = emb[self.replica]
        self.dp_group = dps[self.stage] if dps else None


def finalize(stage: GPTStage, lay: Layout, bug=None) -> None:
    """Data-parallel average, then the tied weights' gradients summed over the embedding group."""
    if lay.dp > 1:
        for p in stage.parameters():
            tdist.all_reduce(p.grad, group=lay.dp_group)
            if bug != "dp_average_missing":
                p.grad /= lay.dp
    if bug == "tied_grad_not_allreduced":
        return
    grad = stage.shared_weight().grad
    group = lay.dp_group if bug == "tied_allreduce_wrong_group" else lay.emb_group
    if group is not None:
        tdist.all_reduce(grad, group=group)
    if bug == "tied_grad_averaged":
        grad /= 2


def pipeline_step(stage: GPTStage, lay: Layout, tokens, target, bug=None) -> None:
    """GPipe: every micro-batch forward, then every backward, activations and gradients sent by hand."""
    scale = 1 if bug == "microbatch_not_scaled" else M
    outs = []
    for x, y in zip(tokens.chunk(M), target.chunk(M)):
        if lay.stage == 0:
            h = stage(x)
            tdist.send(h.detach().contiguous(), lay.peer)
            outs.append(h)
        else:
            h = torch.empty(x.shape[0], T, D)
            tdist.recv(h, lay.peer)
            h.requires_grad_()
            loss = F.cross_entropy(stage(h).reshape(-1, V), y.reshape(-1)) / scale
            outs.append((h, loss))
    for out in outs:
        if lay.stage == 0:
            g = torch.empty_like(out)
            tdist.recv(g, lay.peer)
            out.backward(g)
        else:
            h, loss = out
            loss.backward()
            tdist.send(h.grad.contiguous(), lay.peer)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its stage, its replica's block of rows in M micro-batches, then the gradient sync."""
    lay = Layout(world_size)
    stage = GPTStage(pre=lay.stage == 0, post=lay.stage == 1, bug=bug)
    if bug != "output_init_not_synced":
        with torch.no_grad():
            tdist.all_reduce(stage.shared_weight(), group=lay.emb_group)
    opt = torch.optim.SGD(stage.parameters(), lr=0.1, momentum=0.9)
    rows = GB // lay.dp
    for step in range(STEPS):
        tokens, target = (t[lay.replica * rows:(lay.replica + 1) * rows] for t in batch(step))
        opt.zero_grad()
        pipeline_step(stage, lay, tokens, target, bug)
        finalize(stage, lay, bug)
        opt.step()


def reference(world_size: int) -> None:
    """One device: both stages in one model, the output layer the embedding itself, the global batch."""
    model = GPTStage(pre=True, post=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        tokens, target = batch(step)
        loss = F.cross_entropy(model(tokens).reshape(-1, V), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
