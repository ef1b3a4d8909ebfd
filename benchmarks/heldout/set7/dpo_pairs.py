"""DPO under DDP, as TRL's ``DPOTrainer`` computes it, with the reference log-probs precomputed. Each
step, B preference pairs (prompt, chosen, rejected; synthetic token ids of uneven lengths, right-padded,
labels ``-100`` on the prompt and the padding); each rank takes a contiguous block of PAIRS. Before
training every rank runs its shards of all steps through the initial policy under ``no_grad`` and keeps
the summed log-probs (``precompute_ref_log_probs``). The ``concatenated_forward`` stacks chosen over
rejected, one forward, log-probs from the logits one position earlier summed over the labelled tokens
(``loss_type="sigmoid"``: ``-logsigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r)))``, mean over the
rank's pairs); DDP averages the gradients.

Follows huggingface/trl ``trl/trainer/dpo_trainer.py`` (``concatenated_inputs``, ``concatenated_forward``,
``get_batch_logps`` / the ``loss_mask`` from ``labels != label_pad_token_id``, ``dpo_loss`` with
``logits = pi_logratios - ref_logratios``, ``precompute_ref_log_probs`` /
``compute_ref_log_probs``) and the DPO reference implementation eric-mitchell/direct-preference-optimization
``trainers.py`` (``_get_batch_logps``, ``preference_loss``). The one-device reference takes all B pairs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

V, D, PROMPT, RESP, B, PAD = 12, 16, 3, 5, 4, 0
LR, MOMENTUM, BETA, SEED = 0.5, 0.9, 0.5, 61
STEPS = 4
CORRECT = {"default": (2, 4)}
BUGS = {
    "pairs_split_across_ranks": "the stacked [chosen; rejected] global batch split across ranks, not the pairs: each rank's halves are no pairs",
    "logps_mean": "per-sequence log-prob averaged over its tokens instead of summed",
    "pad_in_labels": "padding tokens not set to -100 in the labels: they enter the summed log-probs",
    "ref_logps_unsliced": "precomputed reference log-probs of the global batch read from position 0, not the rank's offset",
    "loss_sum": "the per-pair DPO losses summed over the rank's pairs instead of averaged",
    "ref_from_current_policy": "reference log-probs computed each step from the CURRENT policy under no_grad, not the initial one",
}


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(PROMPT + RESP, D)
        self.mlp = nn.Sequential(nn.Linear(D, D), nn.Tanh())
        self.head = nn.Linear(D, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.tok(ids) + self.pos(torch.arange(ids.shape[1]))))


def pairs(step: int, bug=None):
    """Input ids [2B, PROMPT+RESP] (chosen rows then rejected rows) and labels."""
    g = gen(400 + step)
    prompt = torch.randint(1, V, (B, PROMPT), generator=g)
    rows, labels = [], []
    for _ in range(2):
        resp = torch.randint(1, V, (B, RESP), generator=g)
        n = torch.randint(2, RESP + 1, (B,), generator=g)
        pad = torch.arange(RESP)[None] >= n[:, None]
        resp[pad] = PAD
        ids = torch.cat([prompt, resp], 1)
        lab = ids.clone()
        lab[:, :PROMPT] = -100
        if bug != "pad_in_labels":
            lab[:, PROMPT:][pad] = -100
        rows.append(ids)
        labels.append(lab)
    return rows, labels  # [chosen, rejected] each [B, L]


def block(rows, labels, r: int, w: int, bug=None):
    """The rank's pairs, stacked chosen over rejected."""
    ids, lab = torch.cat(rows), torch.cat(labels)
    if bug == "pairs_split_across_ranks":
        n = 2 * B // w
        return ids[r * n:(r + 1) * n], lab[r * n:(r + 1) * n]
    n = B // w
    return (torch.cat([x[r * n:(r + 1) * n] for x in rows]), torch.cat([x[r * n:(r + 1) * n] for x in labels]))


def batch_logps(model, ids, lab, bug=None) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(ids)[:, :-1]
    lab = lab[:, 1:]
    mask = lab != -100
    per_tok = torch.log_softmax(logits, -1).gather(2, lab.clamp(min=0)[..., None]).squeeze(2) * mask
    logps = per_tok.sum(1) / (mask.sum(1) if bug == "logps_mean" else 1)
    half = ids.shape[0] // 2
    return logps[:half], logps[half:]


def dpo_loss(pc, pr, rc, rr, bug=None) -> torch.Tensor:
    losses = -F.logsigmoid(BETA * ((pc - pr) - (rc - rr)))
    return losses.sum() if bug == "loss_sum" else losses.mean()


def build():
    torch.manual_seed(SEED)
    return Policy()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of pairs, reference log-probs precomputed, DDP."""
    r, w = rank(), world_size
    model = DDP(build())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    refs = []
    with torch.no_grad():
        for step in range(STEPS):
            rows, labels = pairs(step, bug)
            if bug == "ref_logps_unsliced":
                rc, rr = batch_logps(model, torch.cat(rows), torch.cat(labels))
                n = B // w
                refs.append((rc[:n], rr[:n]))
            else:
                refs.append(batch_logps(model, *block(rows, labels, r, w, bug), bug))
    for step in range(STEPS):
        rows, labels = pairs(step, bug)
        if bug == "ref_from_current_policy":
            with torch.no_grad():
                refs[step] = batch_logps(model, *block(rows, labels, r, w))
        pc, pr = batch_logps(model, *block(rows, labels, r, w, bug), bug)
        opt.zero_grad()
        dpo_loss(pc, pr, *refs[step], bug).backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: all B pairs."""
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    with torch.no_grad():
        refs = [batch_logps(model, torch.cat(p[0]), torch.cat(p[1])) for p in map(pairs, range(STEPS))]
    for step in range(STEPS):
        rows, labels = pairs(step)
        pc, pr = batch_logps(model, torch.cat(rows), torch.cat(labels))
        opt.zero_grad()
        dpo_loss(pc, pr, *refs[step]).backward()
        opt.step()
