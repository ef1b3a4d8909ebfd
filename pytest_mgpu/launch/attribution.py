"""Cause or consequence: which failed ranks to blame, decided by evidence, never by arrival order.

When one rank of a group dies, its peers fail too: gloo says "Connection closed by peer" within
0.02-1.2 s (docs/design/failures.md), often before the launcher has read the dead rank's exit status. Blaming the
first failure that arrived blamed a peer in 20 of 36 runs. So the launchers first wait (bounded) for
every rank's outcome, then call ``attribute`` once with all of them:

- a rank that died (a signal, or an exit code without a result) is a cause;
- a rank that raised anything but a communication error is a cause;
- a rank that hung outside a collective (its stack is in user code), or is still computing or still
  starting at the limit (``unfinished.py``), is a cause;
- a rank that returned while the others failed or hung in a collective never entered it: a cause,
  when nothing else explains their failure;
- a communication error, or a rank waiting inside a collective, is a consequence when a cause exists.

Plain Python, shared by the fresh, warm and external (torchrun) launchers.
"""
from __future__ import annotations

import re
from typing import Iterable, List, Sequence

from .errors import RankProblem

# What torch.distributed raises in a rank whose peer vanished (gloo, NCCL, the store).
_COMM_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError")
_COMM_MESSAGE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|EPIPE|"
    r"gloo/transport|Gloo connectFullMesh failed|NCCL (?:error|communicator was aborted)|ncclRemoteError|"
    r"ncclSystemError|ProcessGroupNCCL|Socket Timeout|recvBytes|sendBytes|Read error|"
    r"Application timeout caused pair closure",
    re.I,
)
# The frames a rank stuck in a collective is in (the innermost frame of its stack).
_COLLECTIVE_FRAME = re.compile(r"torch[\\/]distributed[\\/]")


def is_communication_error(exc_type: str, message: str) -> bool:
    """A failure that a vanished peer explains (it says nothing about this rank's own code)."""
    return exc_type.rsplit(".", 1)[-1] in _COMM_TYPES or bool(_COMM_MESSAGE.search(message or ""))


def in_collective(stack: str) -> bool:
    """Is a hung rank's innermost Python frame inside torch.distributed (waiting for its peers)?

    faulthandler writes the most recent call first; the first frame of the main thread decides."""
    for line in stack.splitlines():
        if line.strip().startswith("File "):
            return bool(_COLLECTIVE_FRAME.search(line))
    return False


def is_consequence_kind(p: RankProblem) -> bool:
    """Could this failure be explained by another rank's?"""
    if p.kind == "raised":
        return p.communication
    if p.kind == "stopped":  # still running when another rank failed: there only because of it
        return True
    if p.kind == "hung":
        return p.waiting or in_collective(p.detail)
    return False


def attribute(problems: Iterable[RankProblem], returned: Sequence[int] = (),
              returned_problem=None) -> List[RankProblem]:
    """Mark each problem cause or consequence; return them in rank order.

    ``returned``: ranks that returned a value while the others failed; ``returned_problem(rank,
    waiting_ranks)`` builds the problem that names such a rank when nothing else explains the failure.
    """
    problems = sorted(problems, key=lambda p: p.rank)
    causes = [p for p in problems if not is_consequence_kind(p)]
    if not causes and returned and returned_problem is not None:
        waiting = [p.rank for p in problems]
        causes = [returned_problem(r, waiting) for r in sorted(returned)]
        problems = sorted(problems + causes, key=lambda p: p.rank)
    for p in problems:
        p.secondary = bool(causes) and all(p is not c for c in causes)
    return problems


def returned_early(rank: int, waiting: Sequence[int]) -> RankProblem:
    names = ", ".join(map(str, waiting))
    return RankProblem(
        rank, "returned",
        f"returned while rank(s) {names} were still inside a collective: it never entered the "
        f"collective they were waiting in, or left it early (a rank-dependent branch, uneven data, other "
        f"sizes?)",
    )
