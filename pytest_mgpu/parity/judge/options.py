"""The optimizer's options, judged exactly: every rank's param-group options (the learning rate,
weight decay, momentum, betas, eps, dampening: every number a group holds) are recorded at every
``optimizer.step()`` (``record="optimizer"``), on both sides. They are numbers the loop sets, not
numbers it computes: one that differs from the reference's beyond float rounding is a setting that
differs, whatever the parameters show (a weight decay 1% off moves AdamW's weights by less than the
line in 20 steps). So a difference fails the check on its own, and the learning rate is compared at
every step (the schedule).

What may legitimately differ is left alone: the size and number of param groups (FSDP1's flat
parameters, ZeRO, a pipeline stage's or an expert's part; where the counts differ, each option's
values on the ranks must be among the reference's), and options one side has and the other not
(another optimizer class: its effect is judged on the tensors). A user who means an option to differ
(an lr scaled by the world size on purpose) passes ``optimizer_options="ignore"``, or the names to
leave out: ``optimizer_options=["lr"]``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

OptionsRule = Union[Literal["same", "ignore"], Sequence[str]]
SAME_OPTION = 1e-6  # relative: float rounding (an lr kept in a float32 tensor), never a setting
NOT_OPTIONS = ("parameters",)  # recorded beside the options: a group's size, not a setting
Groups = List[Dict[str, float]]


@dataclass(frozen=True)
class OptionDifference:
    """The first step at which an option of the ranks' optimizer differs from the reference's."""

    step: int
    option: str  # "lr", "weight_decay", "betas0" ...
    ranks: Tuple[int, ...]  # the ranks whose value differs (all of them: "the ranks")
    world: int
    mine: float
    theirs: float
    group: Optional[int]  # the param group (None: compared as sets of values, the groups split otherwise)

    def words(self, brief: bool = False) -> str:
        """``the optimizer's weight_decay differs: 0.0505 on the ranks, 0.05 in the reference (param group 0,
        from step 3)`` (``brief``: without the parenthesis)."""
        who = "the ranks" if len(self.ranks) == self.world else \
            f"rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
        said = f"the optimizer's {shown(self.option)} differs: {self.mine:.6g} on {who}, {self.theirs:.6g} in the reference"
        if brief:
            return said
        where = f"param group {self.group}, " if self.group is not None else ""
        return f"{said} ({where}from step {self.step})"


def shown(option: str) -> str:
    """``betas0`` -> ``betas[0]``: an option as the user wrote it."""
    if option[-1:].isdigit() and option.rstrip("0123456789") in ("betas", "etas", "step_sizes"):
        base = option.rstrip("0123456789")
        return f"{base}[{option[len(base):]}]"
    return option


def check_rule(rule: Any) -> OptionsRule:
    """``rule`` as given, or a TypeError that says what it takes."""
    if rule in ("same", "ignore"):
        return rule
    if isinstance(rule, (list, tuple, set, frozenset)) and all(isinstance(n, str) for n in rule):
        return tuple(rule)
    raise TypeError(f"optimizer_options must be 'same' (judge every option exactly), 'ignore', or a list of the "
                    f"option names to leave out (e.g. ['lr']), got {rule!r}")


def _differs(a: float, b: float) -> bool:
    return a != b and abs(a - b) > SAME_OPTION * max(abs(a), abs(b), 1e-30)


def _groups(hyper: Groups, lrs: List[float]) -> Groups:
    """Each group's options with its lr, without its size."""
    out = []
    for i, group in enumerate(hyper):
        got = {k: v for k, v in group.items() if k not in NOT_OPTIONS}
        if i < len(lrs):
            got["lr"] = lrs[i]
        out.append(got)
    if not hyper:
        out = [{"lr": lr} for lr in lrs]
    return out


def _first(mine: Groups, theirs: Groups, skip: Sequence[str]) -> Optional[Tuple[str, float, float, Optional[int]]]:
    """(option, mine, theirs, group) of the first option that differs; group by group where the
    counts agree, else as sets of values (each of mine must be among the reference's)."""
    if len(mine) == len(theirs):
        for g, (a, b) in enumerate(zip(mine, theirs)):
            for k in a:
                if k in b and k not in skip and _differs(a[k], b[k]):
                    return k, a[k], b[k], g
        return None
    keys = [k for k in dict.fromkeys(k for a in mine for k in a) if k not in skip]
    for k in keys:
        want = [b[k] for b in theirs if k in b]
        for a in mine:
            if k in a and want and all(_differs(a[k], w) for w in want):
                return k, a[k], want[0], None
    return None


def differences(facts: Any, rule: OptionsRule = "same") -> List[OptionDifference]:
    """Per option, the first step at which some rank's value differs from the reference's."""
    if rule == "ignore":
        return []
    skip = tuple(rule) if not isinstance(rule, str) else ()
    ref_hyper, ref_lrs = getattr(facts, "ref_hyper", []), getattr(facts, "ref_lrs", [])
    rank_hyper, rank_lrs = getattr(facts, "rank_hyper", []), getattr(facts, "rank_lrs", [])
    found: Dict[str, OptionDifference] = {}
    for step in range(min(len(ref_hyper), len(rank_hyper), len(ref_lrs), len(rank_lrs))):
        theirs = _groups(ref_hyper[step], ref_lrs[step])
        per_rank = [_groups(h, lr) for h, lr in zip(rank_hyper[step], rank_lrs[step])]
        if not theirs or not any(per_rank):
            continue
        seen: Dict[str, Tuple[List[int], float, float, Optional[int]]] = {}
        for r, mine in enumerate(per_rank):
            got = _first(mine, theirs, skip) if mine else None
            if got is not None and got[0] not in found:
                k, a, b, g = got
                seen.setdefault(k, ([], a, b, g))[0].append(r)
        for k, (ranks, a, b, g) in seen.items():
            found[k] = OptionDifference(step, k, tuple(ranks), len(per_rank), a, b, g)
    return sorted(found.values(), key=lambda d: (d.step, d.option != "lr"))

