"""One line for the top of a long failure message: CI pages show only its first characters (pytest 9
keeps 500 of a junit ``message``), so the cause and its fix come first and the tables after."""
from __future__ import annotations

import re

JUNIT_MESSAGE = 500  # characters of a failure's message that a junit report's attribute keeps


def brief(hint: str, limit: int = 300) -> str:
    """``"<what>. Fix: <first sentence of the fix>"`` from a hint written as ``"<what>: <evidence>.
    ... Fix: <fix>."``; the hint itself where it names no fix; cut at ``limit``."""
    text = " ".join(hint.split())
    if text.lower().startswith("hint: "):
        text = text[len("hint: "):]
    fix = text.split("Fix: ", 1)[1] if "Fix: " in text else ""
    what = text.split(": ", 1)[0] if ": " in text[:160] else _sentence(text)
    line = f"{what}. Fix: {_sentence(fix)}" if fix else text
    return line if len(line) <= limit else line[:limit - 3].rstrip() + "..."


def _sentence(text: str) -> str:
    """Up to the end of the first sentence (a period followed by a space and a capital letter, or the end)."""
    m = re.search(r"\.(?=\s+[A-Z(`])", text)
    return (text[:m.start()] if m else text).rstrip(".")
