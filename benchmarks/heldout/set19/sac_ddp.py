"""Soft Actor-Critic updates under DDP on a synthetic replay batch: twin Q networks in one module
(``linear1..3`` for Q1, ``linear4..6`` for Q2) and a tanh-squashed Gaussian policy (``fc1``, ``fc2``,
``mean_linear``, ``log_std_linear``: pranz24's ``linear1/2`` renamed so that no name is shared with the
critic), each wrapped in DDP;
a target copy of the critic (``deepcopy`` after the models are built from one seed, before any update),
updated by Polyak averaging ``target <- (1 - tau) target + tau critic`` after every update; the entropy
temperature learned through ``log_alpha`` (a one-parameter module, its gradient all-reduced and divided by
W by hand since it is not in DDP), ``target_entropy = -action_dim``. Per update, in pranz24's order: the
soft TD target under ``no_grad`` (next actions sampled from the policy, ``min(Q1', Q2') - alpha *
next_log_pi``, ``reward + mask * gamma * ...`` with ``mask = 1 - done``); the critic's MSE loss on both
heads and its Adam step; the actor's loss ``(alpha * log_pi - min(Q1, Q2)(s, pi)).mean()`` with the
reparameterised sample ``tanh(mean + std * eps)`` (log-prob with the tanh correction ``- log(1 - tanh(u)^2
+ 1e-6)``) and its Adam step; the temperature's loss ``-(log_alpha * (log_pi + target_entropy).detach())
.mean()`` and its Adam step; ``alpha = log_alpha.exp()`` for the next update; the soft target update.
Every random draw (the replay batch, both reparameterisation noises) is made for the global batch by a
generator seeded per update; each rank keeps its rows.

The one-device reference: the same update on the global replay batch.

Follows pranz24/pytorch-soft-actor-critic ``sac.py`` (``update_parameters``), ``model.py`` (``QNetwork``,
``GaussianPolicy.sample``: ``log_prob -= torch.log(self.action_scale * (1 - y_t.pow(2)) + epsilon)``),
``utils.py`` (``soft_update``: ``target_param.data.copy_(target_param.data * (1.0 - tau) + param.data *
tau)``), DLR-RM/stable-baselines3 ``sac/sac.py`` (``target_entropy = -prod(action_space.shape)``, the
entropy-coefficient loss on ``log_ent_coef``, ``polyak_update``) and the PyTorch distributed tutorial's
``average_gradients`` (a parameter outside DDP: ``all_reduce`` then divide by the world size).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

OBS, ACT, H, GB, SEED = 6, 2, 32, 16, 1903
LR, GAMMA, TAU = 1e-2, 0.9, 0.1
UPDATES = 3
STEPS = 3 * UPDATES   # critic, actor and temperature steps per update
CORRECT = {"default": (2, 4)}
BUGS = {
    "tau_on_wrong_side": "the soft update is written target <- tau * target + (1 - tau) * critic: the target network almost copies the online critic every update",
    "replay_rows_same_on_every_rank": "every rank samples the replay buffer with the same seed: all ranks train on the same rows (rank 0's share of the global batch), the other rows are never used",
    "noise_seeded_per_rank": "the reparameterisation noise is drawn from a generator seeded with seed + rank instead of the rank's rows of the global per-update draw",
    "tanh_correction_missing": "the policy's log-probability omits the tanh change-of-variables term -log(1 - tanh(u)^2 + eps): the entropy estimate ignores the squashing",
    "done_mask_inverted": "the TD target multiplies the bootstrap term by done instead of mask = 1 - done: terminal transitions bootstrap, the others do not",
    "target_copied_per_rank_seed": "each rank seeds torch with seed + rank before building the models and deep-copies the critic into the target before DDP broadcasts rank 0's weights: the ranks' target networks differ",
    "entropy_missing_in_target": "the soft TD target drops the entropy term: min(Q1', Q2') is bootstrapped without - alpha * next_log_pi",
}


class QNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1, self.linear2, self.linear3 = nn.Linear(OBS + ACT, H), nn.Linear(H, H), nn.Linear(H, 1)
        self.linear4, self.linear5, self.linear6 = nn.Linear(OBS + ACT, H), nn.Linear(H, H), nn.Linear(H, 1)

    def forward(self, state, action):
        xu = torch.cat([state, action], 1)
        x1 = self.linear3(F.relu(self.linear2(F.relu(self.linear1(xu)))))
        x2 = self.linear6(F.relu(self.linear5(F.relu(self.linear4(xu)))))
        return x1, x2


class GaussianPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(OBS, H), nn.Linear(H, H)
        self.mean_linear, self.log_std_linear = nn.Linear(H, ACT), nn.Linear(H, ACT)

    def forward(self, state, eps, bug=None):
        """The reparameterised tanh-Gaussian sample with its log-probability (``sample`` in pranz24)."""
        x = F.relu(self.fc2(F.relu(self.fc1(state))))
        mean, log_std = self.mean_linear(x), self.log_std_linear(x).clamp(-20, 2)
        std = log_std.exp()
        x_t = mean + std * eps
        y_t = torch.tanh(x_t)
        log_prob = -((x_t - mean) ** 2) / (2 * std ** 2) - log_std - math.log(math.sqrt(2 * math.pi))
        if bug != "tanh_correction_missing":
            log_prob = log_prob - torch.log(1 - y_t.pow(2) + 1e-6)
        return y_t, log_prob.sum(1, keepdim=True)


class Temperature(nn.Module):
    """log_alpha as a module (run forward to read it)."""

    def __init__(self):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.zeros(1))

    def forward(self):
        return self.log_alpha


def make_models(seed: int = SEED):
    torch.manual_seed(seed)
    critic, policy = QNetwork(), GaussianPolicy()
    return critic, copy.deepcopy(critic), policy, Temperature()


def replay(step: int):
    g = gen(SEED + 100 * step)
    s = torch.randn(GB, OBS, generator=g)
    a = torch.rand(GB, ACT, generator=g) * 2 - 1
    r = (s[:, :ACT] * a).sum(1, keepdim=True) - 0.1 * (a ** 2).sum(1, keepdim=True)
    s2 = 0.8 * s + 0.3 * torch.cat([a, a, a], 1)[:, :OBS] + 0.2 * torch.randn(GB, OBS, generator=g)
    done = (torch.rand(GB, 1, generator=g) < 0.25).float()
    eps_next, eps = torch.randn(GB, ACT, generator=g), torch.randn(GB, ACT, generator=g)
    return s, a, r, s2, done, eps_next, eps


def make_opts(critic, policy, temp):
    return (torch.optim.Adam(critic.parameters(), lr=LR), torch.optim.Adam(policy.parameters(), lr=LR),
            torch.optim.Adam(temp.parameters(), lr=LR))


def soft_update(target, source, bug=None):
    with torch.no_grad():
        for t, s in zip(target.parameters(), source.parameters()):
            if bug == "tau_on_wrong_side":
                t.copy_(t * TAU + s * (1.0 - TAU))
            else:
                t.copy_(t * (1.0 - TAU) + s * TAU)


def sac_update(critic, critic_target, policy, temp, opts, alpha, batch, bug=None, average=None):
    """One SAC update on ``batch``; returns the new alpha. ``average``: the all-reduce of log_alpha's grad."""
    critic_opt, policy_opt, alpha_opt = opts
    s, a, r, s2, done, eps_next, eps = batch
    with torch.no_grad():
        next_action, next_log_pi = policy(s2, eps_next, bug)
        q1_t, q2_t = critic_target(s2, next_action)
        min_q_t = torch.min(q1_t, q2_t)
        if bug != "entropy_missing_in_target":
            min_q_t = min_q_t - alpha * next_log_pi
        mask = done if bug == "done_mask_inverted" else 1 - done
        next_q = r + mask * GAMMA * min_q_t
    q1, q2 = critic(s, a)
    qf_loss = F.mse_loss(q1, next_q) + F.mse_loss(q2, next_q)
    critic_opt.zero_grad()
    qf_loss.backward()
    critic_opt.step()

    pi, log_pi = policy(s, eps, bug)
    q1_pi, q2_pi = critic(s, pi)
    policy_loss = (alpha * log_pi - torch.min(q1_pi, q2_pi)).mean()
    policy_opt.zero_grad()
    policy_loss.backward()
    policy_opt.step()

    target_entropy = -float(ACT)
    alpha_loss = -(temp() * (log_pi + target_entropy).detach()).mean()
    alpha_opt.zero_grad()
    alpha_loss.backward()
    if average is not None:
        average(temp.log_alpha)
    alpha_opt.step()
    return temp.log_alpha.detach().exp()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP critic and policy, its rows of every replay batch and noise draw."""
    r, w = rank(), world_size
    if bug == "target_copied_per_rank_seed":
        critic, critic_target, policy, temp = make_models(SEED + r)
    else:
        critic, critic_target, policy, temp = make_models()
    ddp_critic, ddp_policy = DDP(critic), DDP(policy)
    opts = make_opts(critic, policy, temp)

    def average(p):
        tdist.all_reduce(p.grad)
        p.grad /= w

    alpha = temp.log_alpha.detach().exp()
    lb = GB // w
    for step in range(UPDATES):
        own = 0 if bug == "replay_rows_same_on_every_rank" else r
        batch = [t[own * lb:(own + 1) * lb] for t in replay(step)]
        if bug == "noise_seeded_per_rank":
            g = gen(SEED + 7919 * (step + 1) + r)
            batch[5], batch[6] = torch.randn(lb, ACT, generator=g), torch.randn(lb, ACT, generator=g)
        alpha = sac_update(ddp_critic, critic_target, ddp_policy, temp, opts, alpha, batch, bug, average)
        soft_update(critic_target, critic, bug)


def reference(world_size: int) -> None:
    """One device: the same updates on the global replay batch."""
    critic, critic_target, policy, temp = make_models()
    opts = make_opts(critic, policy, temp)
    alpha = temp.log_alpha.detach().exp()
    for step in range(UPDATES):
        alpha = sac_update(critic, critic_target, policy, temp, opts, alpha, replay(step))
        soft_update(critic_target, critic)
