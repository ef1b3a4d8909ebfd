"""A GPU-written script on emulated CPU ranks: name the CUDA-only call, and the portable line.

Code written for GPUs (``torch.cuda.set_device(rank)``, ``model.to(rank)``, ``DDP(model,
device_ids=[rank])``, ``"cuda"`` literals) dies on CPU ranks with torch's own words, "Found no
NVIDIA driver on your system" or DDP's "device_ids ... only work with ... GPU modules", which say
nothing about what to change. The failing line is in the rank's traceback; this reads it and, where
it is one of those calls, says so and gives the line that runs on both.
"""
from __future__ import annotations

import re
from typing import List, Optional, Tuple

# (pattern over the failing source line, what it is)
CUDA_ONLY: List[Tuple[str, str]] = [
    (r"torch\.cuda\.set_device\(", "torch.cuda.set_device(...)"),
    (r"device_ids\s*=\s*\[", "DDP(..., device_ids=[...])"),
    (r"\.cuda\(", ".cuda()"),
    (r"\.to\(\s*(?:self\.)?(?:gpu_id|rank|local_rank|device_id|gpu|\d+)\s*[,)]", ".to(<int>)"),
    (r"['\"]cuda(?::\d+)?['\"]", 'a "cuda" device literal'),
    (r"torch\.device\(\s*(?:self\.)?(?:gpu_id|rank|local_rank|\d+)\s*\)", "torch.device(<int>)"),
    (r"accelerator\.set_device_index\(", "torch.accelerator.set_device_index(...)"),
]
# Calls that take a device variable: CUDA-only only if the variable holds one, so a line that chose the
# device (below) is the better name for the cause.
AMBIGUOUS = frozenset({".to(<int>)", "torch.device(<int>)"})
# Lines anywhere in the failing files that chose the device: current_accelerator() names the build's
# accelerator ("cuda" on a CUDA build) even where no GPU is present, unless check_available=True.
CHOOSERS: List[Tuple[str, str]] = [
    (r"current_accelerator\((?![^)]*check_available\s*=\s*True)", "torch.accelerator.current_accelerator()"),
    (r"accelerator\.set_device_index\(", "torch.accelerator.set_device_index(...)"),
]
SYMPTOMS = ("Found no NVIDIA driver", "Torch not compiled with CUDA", "only work with single-device/multiple-device GPU",
            "CUDA driver", "no CUDA GPUs are available", "CUDA error", "cuda")
PORTABLE = ("device = pytest_mgpu.rank_device() (cuda:<rank> on GPUs, cpu on emulated ranks); outside pytest, "
            "acc = torch.accelerator.current_accelerator(check_available=True); device = torch.device(acc.type, "
            "rank) if acc else torch.device('cpu'). Then model.to(device), data.to(device), "
            "torch.cuda.set_device(device) only if device.type == 'cuda', and DDP(model, device_ids=[device.index] "
            "if device.type == 'cuda' else None)")


def user_lines(text: str) -> List[Tuple[str, str]]:
    """(location, source) of every traceback frame in ``text`` that is not torch's or ours,
    innermost last."""
    out = []
    for match in re.finditer(r'File "([^"]+)", line (\d+), in \S+\n(?:[ |]*)(.+)', text):
        path, line, source = match.groups()
        if "/torch/" in path or "/pytest_mgpu/" in path:
            continue
        out.append((f"{path.rsplit('/', 1)[-1]}:{line}", source.strip()))
    return out


def cuda_only_call(text: str) -> Optional[str]:
    """The hint for a failure's text, or None where it shows no CUDA-only call."""
    if not any(s in text for s in SYMPTOMS):
        return None
    frames = user_lines(text)
    chosen = device_choices(text)
    for where, source in reversed(frames):
        for pattern, what in CUDA_ONLY:
            if re.search(pattern, source) and not (chosen and what in AMBIGUOUS):
                return (f"a CUDA-only call on an emulated CPU rank: {what} at {where} (`{source}`) needs a GPU, and "
                        f"these ranks run on the CPU. Write the device portably: {PORTABLE}.")
    if chosen:
        where, source, what = chosen[0]
        return (f"a CUDA device chosen on an emulated CPU rank: {what} at {where} (`{source}`) names the build's "
                "accelerator (cuda on a CUDA build) even where no GPU is present, and these ranks run on the CPU. "
                f"Write the device portably: {PORTABLE}.")
    return None


def device_choices(text: str) -> List[Tuple[str, str, str]]:
    """(location, source, what) of the lines that chose the device, in the functions of the failing
    traceback up to the line each was at (the choice is usually made lines before the failing call)."""
    import linecache

    out = []
    for match in re.finditer(r'File "([^"]+)", line (\d+), in \S+', text):
        path, stop = match.group(1), int(match.group(2))
        if "/torch/" in path or "/pytest_mgpu/" in path:
            continue
        lines = linecache.getlines(path)
        for number in range(_function_start(lines, stop), min(stop, len(lines)) + 1):
            line = lines[number - 1]
            what = next((w for pattern, w in CHOOSERS if re.search(pattern, line)), None)
            if what and not line.lstrip().startswith("#"):
                out.append((f"{path.rsplit('/', 1)[-1]}:{number}", line.strip(), what))
    return out


def _function_start(lines: List[str], stop: int) -> int:
    """The line number of the ``def`` enclosing line ``stop`` (1 where none is found)."""
    if not 0 < stop <= len(lines):
        return 1
    indent = len(lines[stop - 1]) - len(lines[stop - 1].lstrip())
    for number in range(stop, 0, -1):
        line = lines[number - 1]
        if line.lstrip().startswith(("def ", "async def ")) and len(line) - len(line.lstrip()) < indent:
            return number
    return 1


def shared_gpu_call(text: str, shared_gpus: int) -> Optional[str]:
    """The hint for ranks sharing GPUs (``--mgpu-fallback=share``) that asked for one past them."""
    if "invalid device ordinal" not in text:
        return None
    return (f"these ranks share {shared_gpus} GPU(s) (--mgpu-fallback=share): each sees cuda:0..cuda:{shared_gpus - 1}, "
            "and code that takes cuda:<rank> (torch.cuda.set_device(rank), .to(rank), DDP(device_ids=[rank])) asks "
            f"for a GPU that is not there. Write the device portably: {PORTABLE}.")


def add_cuda_hint(failure, emulated: bool, shared_gpus: int = 0) -> None:
    """Add the hint to a RankFailure whose cause is a CUDA-only call on emulated CPU ranks
    (``emulated``), or a GPU index past the ones ranks sharing ``shared_gpus`` GPUs see."""
    if not emulated and not shared_gpus:
        return
    text = failure.format()
    hint = shared_gpu_call(text, shared_gpus) if shared_gpus else cuda_only_call(text)
    if hint and hint not in (failure.hint or ""):
        failure.hint = (failure.hint + "\n" if failure.hint else "") + hint
