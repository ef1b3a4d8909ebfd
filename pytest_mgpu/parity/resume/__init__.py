"""Resume parity: the user's trainer, stopped and resumed (at the same or another world size),
trains exactly like it does without the stop. ``dist.assert_resumes`` (``api.py``); the rank side in
``phases.py``; the judgement in ``verdict.py`` and ``hints.py``; ``checkpoint_dir()`` in ``folder.py``.
"""
from .api import ResumeSetupError, assert_resumes
from .folder import checkpoint_dir

__all__ = ["ResumeSetupError", "assert_resumes", "checkpoint_dir"]
