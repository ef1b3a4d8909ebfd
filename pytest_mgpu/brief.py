"""One line for the top of a long failure message: CI pages show only its first characters (pytest 9
keeps 500 of a junit ``message``), so the cause and its fix come first and the tables after."""
from __future__ import annotations

import re
from typing import List

JUNIT_MESSAGE = 500  # characters of a failure's message that a junit report's attribute keeps
# pytest keeps whole lines of it; the first starts with the exception's qualified name
# ("pytest_mgpu.parity.report.ParityError: "), so the head lines get what is left
HEAD_BUDGET = JUNIT_MESSAGE - 60


def brief(hint: str, limit: int = 300) -> str:
    """``"<what>. Fix: <first sentence of the fix>"`` from a hint written as ``"<what>: <evidence>.
    ... Fix: <fix>."``; the hint itself where it names no fix; cut at ``limit``."""
    text = " ".join(hint.split())
    if text.lower().startswith("hint: "):
        text = text[len("hint: "):]
    fix = text.split("Fix: ", 1)[1] if "Fix: " in text else ""
    what = text.split(": ", 1)[0] if ": " in text[:160] else sentence(text)
    line = f"{what}. Fix: {sentence(fix)}" if fix else text
    return line if len(line) <= limit else line[:limit - 3].rstrip() + "..."


def cited(hint: str, limit: int = 300) -> str:
    """``"<what> (<evidence>). Fix: <first sentence of the fix>"``: ``brief`` with the first sentence
    of the evidence the hint gives after ``"<what>: "``, cut to fit ``limit`` (left out where less
    than 40 characters of it would fit)."""
    text = " ".join(hint.split())
    head = brief(hint, limit)
    if ": " not in text[:160] or "Fix: " not in text:
        return head
    rest = text.split(": ", 1)[1].split("Fix: ", 1)[0]
    evidence = sentence(rest.strip()).strip()
    what, fix = head.split(". Fix: ", 1) if ". Fix: " in head else (head, "")
    room = limit - len(what) - len(fix) - len(" (). Fix: ")
    if not evidence or room < 40 or "(" in what:  # a what that carries its evidence already
        return head
    if len(evidence) > room:
        evidence = evidence[:room - 3].rstrip() + "..."
    return f"{what} ({evidence}). Fix: {fix}"


def fit(lines: List[str], budget: int = HEAD_BUDGET) -> List[str]:
    """The head lines of a message, each later one cut so that all fit in ``budget`` characters with
    their newlines (a line with less than 40 characters of room is left out)."""
    out: List[str] = []
    used = 0
    for line in lines:
        room = budget - used - 1
        if out and room < 40:
            break
        if out and len(line) > room:
            line = line[:room - 3].rstrip() + "..."
        out.append(line)
        used += len(line) + 1
    return out


def sentence(text: str) -> str:
    """Up to the end of the first sentence (a period followed by a space and a capital letter, or the end)."""
    m = re.search(r"\.(?=\s+[A-Z(`])", text)
    return (text[:m.start()] if m else text).rstrip(".")
