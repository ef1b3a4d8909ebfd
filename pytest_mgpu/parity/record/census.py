"""The module trees a recorder reads around each step (inside ranks), each walked once per window.

A recorded step reads the trained models' trees several times: which forward roots lie inside another
(``Watch.model_roots``), the parameters whose gradients a backward pass left, the models that own the
stepped parameters, their BatchNorm and dropout modules, the state no optimizer steps. Each read was a
walk of ``named_modules()`` (a recursive generator); ten a step were about a fifth of what recording
added to the minGPT-like trainer. A ``Census`` walks each root once and answers the rest from that
walk until it is cleared: at the start and the end of each recorded optimizer step (and each
``log`` call), so a window is one step's forward and backward passes, or one step's recording. A
model whose modules are added or removed inside such a window is read as it was at its start.

Members are read fresh from the walked modules (``_parameters``, ``_buffers``), deduplicated and
named as ``Module.named_parameters()`` / ``named_buffers()`` do; a root whose class overrides those
methods (FSDP1's wrapper) is asked directly.
"""
from __future__ import annotations

from typing import Any, Dict, List, Literal, Tuple

Members = Literal["_parameters", "_buffers"]


class Census:
    """``root.named_modules()`` per root, walked once until ``clear()``; members read from it."""

    def __init__(self) -> None:
        self._trees: Dict[int, Tuple[Any, List[Tuple[str, Any]]]] = {}
        self.derived: Dict[Any, Any] = {}  # what a reader computed from the trees, cleared with them

    def clear(self) -> None:
        self._trees.clear()
        self.derived.clear()

    def named_modules(self, root) -> List[Tuple[str, Any]]:
        got = self._trees.get(id(root))
        if got is None or got[0] is not root:
            got = self._trees[id(root)] = (root, list(root.named_modules()))
        return got[1]

    def modules(self, root) -> List[Any]:
        return [m for _, m in self.named_modules(root)]

    def named_parameters(self, root) -> List[Tuple[str, Any]]:
        return self._named(root, "_parameters")

    def parameters(self, root) -> List[Any]:
        return [p for _, p in self._named(root, "_parameters")]

    def named_buffers(self, root) -> List[Tuple[str, Any]]:
        return self._named(root, "_buffers")

    def _named(self, root, members: Members) -> List[Tuple[str, Any]]:
        """As ``Module._named_members`` yields them: each tensor once, named by its first module."""
        import torch

        method = "named_parameters" if members == "_parameters" else "named_buffers"
        if getattr(type(root), method) is not getattr(torch.nn.Module, method) or \
                (members == "_parameters" and type(root).parameters is not torch.nn.Module.parameters):
            return list(getattr(root, method)())
        memo = set()
        out: List[Tuple[str, Any]] = []
        for prefix, module in self.named_modules(root):
            for key, value in getattr(module, members).items():
                if value is None or id(value) in memo:
                    continue
                memo.add(id(value))
                out.append((prefix + ("." if prefix else "") + key, value))
        return out
