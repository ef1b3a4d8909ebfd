"""GRPO by hand under DDP, as TRL's ``GRPOTrainer`` computes it. Each step, P prompts with G sampled
completions each (synthetic, seeded: the sampling is not what is tested); the global batch of P*G
completions is spread over the ranks in contiguous blocks, so a prompt's group can straddle two
ranks. Every rank scores its completions, all-gathers the rewards, computes the group means on the
gathered rewards (``view(-1, G)``, ``repeat_interleave``), scales by the std of the whole gathered
batch (``scale_rewards="batch"``) and keeps its own slice of the advantages (``process_index *
len(local)``). The completion mask runs up to and including the first EOS; per-token log-probs come
from the logits one position earlier; the loss is TRL's ``"grpo"`` type (per-sequence mean over the
completion's tokens, then the mean over the rank's sequences), ``beta = 0`` (no reference model),
one iteration per generation (ratio ``exp(logp - logp.detach())``); DDP averages the gradients.

Follows huggingface/trl ``trl/trainer/grpo_trainer.py`` (``_generate_and_score_completions``:
``gather(rewards_per_func)``, ``mean_grouped_rewards``, ``repeat_interleave(self.num_generations)``,
``scale_rewards``, ``process_slice``; ``is_eos`` / ``eos_idx`` / ``completion_mask``;
``_get_per_token_logps`` with ``logits[:, :-1]``; ``_compute_loss`` for ``loss_type="grpo"``) and
``RepeatSampler``. The one-device reference takes all P*G completions at once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather, gen, rank

V, D, PROMPT, COMP, P, G, EOS = 12, 16, 3, 6, 3, 4, 0
LR, MOMENTUM, SEED = 0.5, 0.9, 53
STEPS = 4
CORRECT = {"default": (2, 4)}
BUGS = {
    "slice_by_generations": "the rank's slice of the gathered advantages starts at rank * num_generations, not rank * len(local)",
    "batch_std_local": "the batch std of scale_rewards='batch' taken over the rank's own rewards, not the gathered ones",
    "group_mean_repeat": "group means expanded with .repeat(G) instead of .repeat_interleave(G)",
    "token_mean_local": "loss summed over the rank's completion tokens / the rank's token count (not per-sequence means)",
    "mask_excludes_eos": "completion mask built with < eos_idx: the EOS token is left out of the loss",
    "logits_not_shifted": "per-token log-probs read from the logits at the completion positions (not one position earlier)",
    "no_ddp": "the policy is not wrapped in DDP: each rank steps on its own gradients",
}


class Policy(nn.Module):
    """A position-aware bigram LM: the next token's logits from the current token and position."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(PROMPT + COMP, D)
        self.mlp = nn.Sequential(nn.Linear(D, D), nn.Tanh())
        self.head = nn.Linear(D, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.tok(ids) + self.pos(torch.arange(ids.shape[1]))))


def rollout(step: int):
    """P*G sequences (prompt repeated G times, then a completion), their completion mask and rewards."""
    g = gen(500 + step)
    prompts = torch.randint(1, V, (P, PROMPT), generator=g).repeat_interleave(G, 0)
    comp = torch.randint(1, V, (P * G, COMP), generator=g)
    stop = torch.randint(1, COMP + 2, (P * G,), generator=g)  # COMP and above: no EOS
    for i, s in enumerate(stop.tolist()):
        if s < COMP:
            comp[i, s] = EOS
    rewards = torch.randn(P * G, generator=g)
    return torch.cat([prompts, comp], 1), comp, rewards


def completion_mask(comp: torch.Tensor, bug=None) -> torch.Tensor:
    is_eos = comp == EOS
    eos_idx = torch.full((comp.shape[0],), COMP, dtype=torch.long)
    has = is_eos.any(1)
    eos_idx[has] = is_eos.int().argmax(1)[has]
    idx = torch.arange(COMP).expand(comp.shape[0], -1)
    return (idx < eos_idx[:, None] if bug == "mask_excludes_eos" else idx <= eos_idx[:, None]).float()


def advantages(rewards: torch.Tensor, bug=None, local: torch.Tensor | None = None) -> torch.Tensor:
    """Group-relative advantages of the gathered rewards, scaled by the batch std."""
    mean = rewards.view(-1, G).mean(1)
    mean = mean.repeat(G) if bug == "group_mean_repeat" else mean.repeat_interleave(G)
    std = (local if bug == "batch_std_local" else rewards).std()
    return (rewards - mean) / (std + 1e-4)


def grpo_loss(model, ids, comp, adv, bug=None) -> torch.Tensor:
    logits = model(ids)
    start = PROMPT if bug == "logits_not_shifted" else PROMPT - 1
    logps = torch.log_softmax(logits[:, start:start + COMP], -1).gather(2, comp[..., None]).squeeze(2)
    mask = completion_mask(comp, bug)
    per_token = -torch.exp(logps - logps.detach()) * adv[:, None]
    if bug == "token_mean_local":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)).mean()


def build():
    torch.manual_seed(SEED)
    return Policy()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of completions, advantages from the gathered rewards, DDP."""
    r, w = rank(), world_size
    policy = build()
    model = policy if bug == "no_ddp" else DDP(policy)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    n = P * G // w
    for step in range(STEPS):
        ids, comp, rewards = rollout(step)
        ids, comp, local = ids[r * n:(r + 1) * n], comp[r * n:(r + 1) * n], rewards[r * n:(r + 1) * n]
        gathered = all_gather(local)
        first = r * G if bug == "slice_by_generations" else r * n
        adv = advantages(gathered, bug, local)[first:first + n]
        opt.zero_grad()
        grpo_loss(model, ids, comp, adv, bug).backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: all P*G completions."""
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        ids, comp, rewards = rollout(step)
        opt.zero_grad()
        grpo_loss(model, ids, comp, advantages(rewards)).backward()
        opt.step()
