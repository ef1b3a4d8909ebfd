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
    for where, source in reversed(user_lines(text)):
        for pattern, what in CUDA_ONLY:
            if re.search(pattern, source):
                return (f"a CUDA-only call on an emulated CPU rank: {what} at {where} (`{source}`) needs a GPU, and "
                        f"these ranks run on the CPU. Write the device portably: {PORTABLE}.")
    return None


def add_cuda_hint(failure, emulated: bool) -> None:
    """Add the hint to a RankFailure from emulated ranks whose cause is a CUDA-only call."""
    if not emulated:
        return
    hint = cuda_only_call(failure.format())
    if hint and hint not in (failure.hint or ""):
        failure.hint = (failure.hint + "\n" if failure.hint else "") + hint
