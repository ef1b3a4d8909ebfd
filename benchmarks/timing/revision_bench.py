"""The revision lane's side of ``gate_power.py``: real git revisions of a compute-bound step, and the
lane's own machinery (``pytest_mgpu.timing.revision.run_duet``, ``pairing.judge_pairs``) run on them.

A temporary repository holds ``work.py`` (the same DDP MLP step as gate_power's history lane, with
its micro-batch count as a module constant). Commits: the base (MICRO = 16); an unchanged revision
(a comment changes: a real commit, the same work); and +10/+25/+50% more micro-batches (18, 20, 24:
the slowed revision does more work, as a real regression would; no sleep). Each head revision is a
worktree; the base is a worktree too. Two sets of warm ranks take turns, swapping roles between blocks
as pytest's lane does. Prints nothing; gate_power.py drives and reports.
"""
from __future__ import annotations

import os
import random
import subprocess
import tempfile
from typing import Dict, List, Optional

MICRO = 16
WORK = '''"""A compute-bound DDP step: MICRO forward/backward passes of an MLP, gradients synced on the last."""
import contextlib

import torch
import torch.distributed as tdist
from torch import nn

from pytest_mgpu import rank_device

MICRO = {micro}  # {comment}


def mlp_step(width=512, batch=64):
    dev = rank_device()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, 10)).to(dev)
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        for i in range(MICRO):
            sync = i == MICRO - 1 or not hasattr(model, "no_sync")
            with (contextlib.nullcontext() if sync else model.no_sync()):
                nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step
'''


def _git(repo: str, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {out.stderr}")
    return out.stdout.strip()


def make_repo(slowdowns) -> Dict[str, object]:
    """The repository and its commits: {"repo", "base", "heads": {slowdown: commit}}."""
    repo = tempfile.mkdtemp(prefix="gate-power-repo-")
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "bench@example.com")
    _git(repo, "config", "user.name", "bench")

    def commit(micro: int, comment: str, message: str) -> str:
        with open(os.path.join(repo, "work.py"), "w") as f:
            f.write(WORK.format(micro=micro, comment=comment))
        _git(repo, "add", "work.py")
        _git(repo, "commit", "-qm", message)
        return _git(repo, "rev-parse", "HEAD")

    base = commit(MICRO, "the base", "base")
    heads = {0.0: commit(MICRO, "unchanged work, another commit", "unchanged")}
    for c in slowdowns:
        heads[c] = commit(int(round(MICRO * (1 + c))), f"+{c:.0%} micro-batches", f"+{c:.0%}")
    return {"repo": repo, "base": base, "heads": heads}


class RevisionBench:
    """Worktrees of the base and of every head revision, and two sets of warm ranks that take turns
    (they swap roles from block to block, as in pytest). ``new_sets`` starts new ones: gate_power
    does so every round, so that a set's own speed varies between trials as it does between CI jobs."""

    def __init__(self, slowdowns, budget_s: Optional[float], threshold: float = 0.10, min_run_time: float = 0.5):
        from pytest_mgpu.devices import detect_hardware, plan_for
        from pytest_mgpu.launch.base import LaunchSpec
        from pytest_mgpu.launch.protocol import FnRef
        from pytest_mgpu.launch.rendezvous import StoreServer
        from pytest_mgpu.timing import worktree
        from pytest_mgpu.timing.revision import Version

        self.budget_s, self.threshold, self.min_run_time = budget_s, threshold, min_run_time
        self.git = make_repo(slowdowns)
        repo = self.git["repo"]
        plan = plan_for(2, detect_hardware(), "cpu")
        self.spec = LaunchSpec(nprocs=2, backend=plan.backend, device_type=plan.device_type, emulated=plan.emulated,
                               device_ids=("0", "1") if plan.device_type == "cuda" else (), label="gate_power revision")
        self.trees: List[str] = []
        self.store = StoreServer()
        self.sets: list = []

        def version(name: str, commit: str) -> "Version":
            tree = worktree.add(repo, commit)
            self.trees.append(tree)
            return Version(name, FnRef("work", "mlp_step", os.path.join(tree, "work.py")), (tree,))

        self.base = version("base", self.git["base"])
        self.heads = {c: version("head", commit) for c, commit in self.git["heads"].items()}
        self.new_sets()

    def new_sets(self) -> None:
        from pytest_mgpu.launch.pool import PoolLauncher

        for launcher in self.sets:
            launcher.close()
        self.sets = [PoolLauncher(), PoolLauncher()]

    def duet(self, slowdown: float, rng: random.Random) -> dict:
        """One trial as pytest's lane runs it: the budget from ``min_run_time`` (each block holding
        at least its share of PAIRS_GOAL pairs), unless a fixed one was given."""
        import pickle

        from pytest_mgpu.timing.inrank import LoopConfig
        from pytest_mgpu.timing.pairing import judge_pairs
        from pytest_mgpu.timing.revision import lane_budget, run_duet

        budget = self.budget_s or lane_budget(self.min_run_time)
        d = run_duet(self.heads[slowdown], self.base, self.sets, self.spec, pickle.dumps(((), {})),
                     LoopConfig(None, None, 0.25), budget, self.store, rng, self.threshold, forget=tuple(self.trees))
        v = judge_pairs(d.head, d.base, self.threshold, d.blocks)
        return {"slowdown": slowdown, "pairs_head": d.head, "pairs_base": d.base, "pairs_block": d.blocks,
                "iterations": d.iterations, "head_first": d.head_first, "wall_s": d.wall_s, "budget_s": budget,
                "verdict": v.to_dict()}

    def close(self) -> None:
        from pytest_mgpu.timing import worktree

        for launcher in self.sets:
            launcher.close()
        for tree in self.trees:
            worktree.remove(self.git["repo"], tree)
        subprocess.run(["rm", "-rf", self.git["repo"]], timeout=60)
