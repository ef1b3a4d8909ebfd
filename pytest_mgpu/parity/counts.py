"""Step counts: every side of ``assert_same_training`` must take the ``steps`` asked for. A side that did
not is a ``StepCountError`` whose first line says who took how many, whose second line is the likely
cause where the run's own facts show one (every rank iterating the whole data set, a new GradScaler
made at each iteration, gradients clipped while still scaled, a schedule that runs at another rate, a
step taken on some ranks only), and whose rest says what each short side did instead (steps a
GradScaler skipped, steps that changed nothing). Where no fact explains it, no cause is claimed."""
from __future__ import annotations

from typing import List, Optional, Tuple

from .evidence.schedule import schedule_rate
from .record.recorder import SideLog

Sides = List[Tuple[str, SideLog]]  # (who, what it logged); the reference first


class StepCountError(AssertionError):
    """A side took a different number of steps than asked for."""


def check_counts(sides: Sides, steps: int, record: str, world: int) -> None:
    """Raise ``StepCountError`` unless every side took ``steps`` steps."""
    counts = {who: len(side.steps) for who, side in sides}
    wrong = [f"{who} {'logged' if record == 'log' else 'took'} {n}" for who, n in counts.items() if n != steps]
    if not wrong:
        return
    unit = "step(s)" if record == "log" else "optimizer step(s)"
    text = f"assert_same_training(steps={steps}, record={record!r}): {'; '.join(wrong)} {unit}."
    cause = _cause(sides, world)
    detail = _not_steps(sides, steps)
    if cause:
        text += "\nlikely cause: " + cause
    if detail:
        text += "\n" + detail
    elif not cause and record == "log":
        text += ("\nEach loop must call log(model, loss) once per step, after backward and before "
                 "optimizer.step(), for exactly `steps` steps (it receives steps= as a keyword).")
    elif not cause:
        text += ("\nA side that ends before `steps` optimizer steps ran out of data or epochs: give it more, "
                 "or ask for fewer steps.")
    raise StepCountError(text)


def _cause(sides: Sides, world: int) -> str:
    """The first cause the run's facts show, with its fix; "" where none does."""
    for rule in (_whole_data, _global_batch, _scalers, _scaled_clips, _schedule, _some_ranks):
        said = rule(sides, world)
        if said:
            return said
    return ""


def _whole_data(sides: Sides, world: int) -> str:
    ref, ranks = len(sides[0][1].steps), [len(side.steps) for _, side in sides[1:]]
    if world > 1 and ref and ranks and len(set(ranks)) == 1 and ranks[0] == world * ref:
        return (f"each rank iterates over the whole data set, as if there were no DistributedSampler (every rank "
                f"took {world} x the reference's steps: {ranks[0]} = {world} x {ref}). Fix: give the DataLoader "
                "sampler=DistributedSampler(dataset) (and call sampler.set_epoch(epoch) every epoch), so that each "
                "rank gets 1/world_size of the data.")
    return ""


def _global_batch(sides: Sides, world: int) -> str:
    ref, ranks = len(sides[0][1].steps), [len(side.steps) for _, side in sides[1:]]
    if world > 1 and ranks and ref == world * max(ranks):
        return (f"the reference's batch is 1/{world} of the ranks' global batch (it took {world} x the ranks' "
                f"steps). Fix: give the one-device loop the global batch (the ranks' batch size x {world}).")
    return ""


def _who(sides: Sides, picked: List[str]) -> str:
    ranks = [who for who, _ in sides[1:]]
    return "the ranks" if len(ranks) > 1 and set(ranks) <= set(picked) else ", ".join(picked)


def _scalers(sides: Sides, world: int) -> str:
    """A side that made a GradScaler per iteration where another made one."""
    many = [(who, side) for who, side in sides if side.scalers_made > 1]
    if not many or all(side.scalers_made > 1 for _, side in sides):
        return ""
    who, side = many[0]
    return (f"a new GradScaler is made at every iteration on {_who(sides, [w for w, _ in many])} ({who} made "
            f"{side.scalers_made}; its GradScaler skipped {side.scaler_skips} of its steps): each starts over at "
            "its initial scale and never backs off, so steps overflow and are skipped. Fix: make one GradScaler "
            "before the loop and keep it for the whole run.")


def _scaled_clips(sides: Sides, world: int) -> str:
    """A side that clipped between ``scaler.scale(loss)`` and ``scaler.unscale_`` where another did not."""
    scaled = [(who, side) for who, side in sides if side.scaled_clips]
    if not scaled or all(side.scaled_clips for _, side in sides):
        return ""
    who, side = scaled[0]
    return (f"gradients clipped while still multiplied by the GradScaler's scale on "
            f"{_who(sides, [w for w, _ in scaled])} ({who}: clip_grad_norm_ before scaler.unscale_ "
            f"{side.scaled_clips} time(s); its GradScaler skipped {side.scaler_skips} step(s)). Fix: call "
            "scaler.unscale_(optimizer) before clip_grad_norm_, then scaler.step(optimizer).")


def _lrs(side: SideLog) -> List[Optional[float]]:
    return [step.lrs[0] if step.lrs else None for step in side.steps]


def _schedule(sides: Sides, world: int) -> str:
    """The ranks' lr at their steps is the reference's at other steps of its schedule."""
    (_, ref), (who, rank) = sides[0], sides[1] if len(sides) > 1 else sides[0]
    if rank is ref:
        return ""
    rate = schedule_rate(_lrs(rank), _lrs(ref))
    if not rate:
        return ""
    zeros = f"; {who} took {rank.uncounted} step(s) at lr 0, the reference {ref.uncounted}" \
        if rank.uncounted != ref.uncounted else ""
    return (f"the learning-rate schedule runs {rate.replace('the other', 'the reference')} on the ranks{zeros}. "
            "Fix: build the schedule from the number of optimizer steps both sides take, and call scheduler.step() "
            "once per optimizer step (accelerate's prepared scheduler steps once per process at each call: give it "
            "lengths counted that way).")


def _some_ranks(sides: Sides, world: int) -> str:
    counts = [(who, len(side.steps)) for who, side in sides[1:]]
    if world < 2 or len({n for _, n in counts}) < 2:
        return ""
    took = ", ".join(f"{who.replace('fn on ', '')}: {n}" for who, n in counts)
    return (f"an optimizer.step() taken on some ranks only (the ranks took different numbers of optimizer steps: "
            f"{took}), under a rank condition, or skipped on some (a GradScaler that found inf/NaN in one rank's "
            "gradients only). Fix: step the optimizer on every rank at every step, after the gradients are "
            "synchronised.")


def _not_steps(sides: Sides, steps: int) -> str:
    """What the short sides did instead of stepping: GradScaler steps skipped (inf/NaN found in the scaled
    gradients), optimizer steps that changed nothing (lr 0, no gradient); "" where neither."""
    said: List[str] = []
    if all(len(side.steps) >= steps or not (side.scaler_skips or side.uncounted) for _, side in sides):
        return ""
    for who, side in sides:
        if side.scaler_skips:
            every = "every step, " if not side.steps else ""
            said.append(f"{who}'s GradScaler skipped {every}{side.scaler_skips} step(s) (inf/NaN in the scaled "
                        "gradients)")
        if side.uncounted:
            said.append(f"{who} took {side.uncounted} optimizer.step() that changed nothing (every lr 0, or no "
                        "gradient), not counted")
    return ("; ".join(said) + ". A step skipped or empty there and taken by the other side is the divergence: "
            "the scale must back off as the other side's does (one GradScaler for the whole run, scaler.unscale_ "
            "before clipping), and the schedule must not reach lr 0 earlier (its length from the steps the ranks "
            "take).")
