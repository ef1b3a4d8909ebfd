"""PPO with GAE under DDP (discrete actions): the vector of environments split over the ranks (rank r
steps envs ``[r E/W, (r+1) E/W)``), a rollout of T steps per update with the current policy (a seeded
synthetic environment: observations, done flags and the uniforms that sample the actions drawn for all
envs and sliced), GAE computed backwards per env with ``nextnonterminal`` and the bootstrap value,
returns = advantages + values, K epochs of M minibatches (the same permutation of the local batch on
every rank), advantages normalised per minibatch with the GLOBAL minibatch's mean and std (sums
all-reduced), clipped surrogate, value loss and entropy bonus, ``clip_grad_norm_``, Adam; the
actor-critic under DDP.

The one-device reference steps all envs at once; its minibatch m is the ranks' minibatches m in rank order
(a rank's local row t * E/W + e is the global row t * E + r E/W + e).

Follows vwxyzjn/cleanrl ``cleanrl/ppo.py`` (``Agent.get_action_and_value``; the GAE loop with
``lastgaelam``, ``nextnonterminal = 1.0 - dones[t + 1]``, ``returns = advantages + values``; ``b_inds``
shuffled per epoch; ``norm_adv``; ``pg_loss = torch.max(pg_loss1, pg_loss2)`` with ``logratio =
newlogprob - b_logprobs``) and ``cleanrl/ppo_atari_multigpu.py`` (envs split over the processes, the
gradients averaged over them before ``clip_grad_norm_``); ``docs/rl-algorithms/ppo.md``.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributions.categorical import Categorical
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce, gen, rank

OBS, ACT, E, T, SEED = 4, 3, 8, 6, 41
UPDATES, EPOCHS, MINI = 2, 2, 2
GAMMA, LAM, CLIP, ENT, VF, LR, MAXNORM = 0.99, 0.95, 0.2, 0.01, 0.5, 0.01, 0.5
STEPS = UPDATES * EPOCHS * MINI
CORRECT = {"default": (2, 4)}
BUGS = {
    "adv_local_norm": "advantages normalised with the mean and std of the rank's minibatch rows, not the global minibatch's",
    "gae_ignores_done": "the GAE recursion ignores the done flags (nextnonterminal always 1): values bootstrapped across episode ends",
    "gae_value_offset": "GAE's next value is values[t] instead of values[t + 1] (an off-by-one in the bootstrap)",
    "returns_from_normalized": "the advantages are normalised over the batch before returns = advantages + values: the value targets are wrong",
    "ratio_inverted": "logratio = old logprob - new logprob: the probability ratio is inverted",
    "clip_min": "the clipped objective takes torch.min of the two negated surrogates instead of torch.max",
    "perm_per_rank": "the minibatch permutation is drawn from a generator seeded with seed + rank",
}


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(OBS, 16), nn.Tanh(), nn.Linear(16, 1))
        self.actor = nn.Sequential(nn.Linear(OBS, 16), nn.Tanh(), nn.Linear(16, ACT))

    def forward(self, x):
        return self.actor(x), self.critic(x).squeeze(-1)


def env_draws(update: int):
    """The synthetic environment of one rollout, for all E envs: obs [T+1, E, OBS], dones [T+1, E],
    action uniforms [T, E]."""
    g = gen(SEED + 100 * update)
    obs = torch.randn(T + 1, E, OBS, generator=g)
    dones = (torch.rand(T + 1, E, generator=g) < 0.25).float()
    dones[0] = 0.0
    return obs, dones, torch.rand(T, E, generator=g)


def reward(obs, act):
    return (act == obs[..., :ACT].argmax(-1)).float() + 0.1 * obs[..., ACT]


def rollout(agent, obs, dones, u, bug=None):
    """Actions, log-probs, values, rewards and GAE advantages / returns for the envs of ``obs``."""
    with torch.no_grad():
        logits, values = agent(obs[:T])
        probs = logits.softmax(-1)
        actions = (probs.cumsum(-1) < u.unsqueeze(-1)).sum(-1).clamp(max=ACT - 1)
        logprobs = Categorical(logits=logits).log_prob(actions)
        rewards = reward(obs[:T], actions)
        next_value = agent(obs[T])[1]
        adv = torch.zeros_like(rewards)
        lastgaelam = 0
        for t in reversed(range(T)):
            nextnonterminal = 1.0 if bug == "gae_ignores_done" else 1.0 - dones[t + 1]
            nextvalues = next_value if t == T - 1 else values[t + 1]
            if bug == "gae_value_offset":
                nextvalues = values[t]
            delta = rewards[t] + GAMMA * nextvalues * nextnonterminal - values[t]
            adv[t] = lastgaelam = delta + GAMMA * LAM * nextnonterminal * lastgaelam
        if bug == "returns_from_normalized":
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        returns = adv + values
    flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
    return flat(obs[:T]), flat(actions), flat(logprobs), flat(adv), flat(returns), flat(values)


def ppo_loss(agent, obs, act, oldlogp, adv, ret, bug=None):
    logits, newvalue = agent(obs)
    dist = Categorical(logits=logits)
    newlogp = dist.log_prob(act)
    logratio = oldlogp - newlogp if bug == "ratio_inverted" else newlogp - oldlogp
    ratio = logratio.exp()
    pg1, pg2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)
    pg_loss = (torch.min(pg1, pg2) if bug == "clip_min" else torch.max(pg1, pg2)).mean()
    v_loss = 0.5 * ((newvalue - ret) ** 2).mean()
    return pg_loss - ENT * dist.entropy().mean() + VF * v_loss


def global_norm(a, w, bug=None):
    """Advantages normalised with the global minibatch's mean and (unbiased) std."""
    if bug == "adv_local_norm":
        return (a - a.mean()) / (a.std() + 1e-8)
    s = all_reduce(torch.stack([a.sum(), (a * a).sum(), torch.tensor(float(len(a)))]))
    mean = s[0] / s[2]
    std = ((s[1] - s[2] * mean * mean) / (s[2] - 1)).sqrt()
    return (a - mean) / (std + 1e-8)


def build():
    torch.manual_seed(SEED)
    agent = Agent()
    return agent, torch.optim.Adam(agent.parameters(), lr=LR, eps=1e-5)


def perm(update: int, epoch: int, n: int, r: int = 0) -> torch.Tensor:
    return torch.randperm(n, generator=gen(SEED + 7 + 10 * update + epoch + 1000 * r))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: rollouts of its envs, minibatches of its local batch, the policy under DDP."""
    r, w = rank(), world_size
    agent, opt = build()
    ddp = DDP(agent)
    el = E // w
    for update in range(UPDATES):
        obs, dones, u = env_draws(update)
        sl = slice(r * el, (r + 1) * el)
        b = rollout(ddp, obs[:, sl], dones[:, sl], u[:, sl], bug)
        n = T * el
        for epoch in range(EPOCHS):
            inds = perm(update, epoch, n, r if bug == "perm_per_rank" else 0)
            for m in range(MINI):
                mb = inds[m * n // MINI:(m + 1) * n // MINI]
                o, a, lp, adv, ret, _ = (t[mb] for t in b)
                loss = ppo_loss(ddp, o, a, lp, global_norm(adv, w, bug), ret, bug)
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), MAXNORM)
                opt.step()


def reference(world_size: int) -> None:
    """One device: all envs; minibatch m = the ranks' minibatches m (their envs' rows) in rank order."""
    w = world_size
    agent, opt = build()
    el = E // w
    for update in range(UPDATES):
        obs, dones, u = env_draws(update)
        b = rollout(agent, obs, dones, u)   # all envs: flat row t * E + e
        n = T * el
        for epoch in range(EPOCHS):
            inds = perm(update, epoch, n)
            for m in range(MINI):
                mb = inds[m * n // MINI:(m + 1) * n // MINI]
                rows = torch.cat([(mb // el) * E + r * el + mb % el for r in range(w)])
                o, a, lp, adv, ret, _ = (t[rows] for t in b)
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                loss = ppo_loss(agent, o, a, lp, adv, ret)
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), MAXNORM)
                opt.step()
