"""Ranks started by torchrun or srun: pytest itself runs in every rank, joins the launched group once,
and ``dist.run`` runs the function in this rank and gathers every rank's value.

Split by role, each step using only the ones before it: ``detect`` (which job started this process,
which device this rank uses), ``agree`` (the records the ranks exchange and how they merge),
``session`` (joining the job, agreeing through its store, leaving it), ``launcher`` (``dist.run`` in
the job) and ``plugin`` (the pytest hooks, registered as their own plugin object). Everything but
``plugin`` is plain Python; this package imports only the plain part, so importing it never touches
pytest's hooks.
"""
from .agree import PhaseRecord, Verdict, merge
from .detect import ENV_MODE, MODES, ExternalError, LaunchedWorld, RankDevice, choose_device, detect, first_host
from .launcher import ExternalLauncher
from .session import ExternalSession

__all__ = [
    "ENV_MODE",
    "MODES",
    "ExternalError",
    "ExternalLauncher",
    "ExternalSession",
    "LaunchedWorld",
    "PhaseRecord",
    "RankDevice",
    "Verdict",
    "choose_device",
    "detect",
    "first_host",
    "merge",
]
