"""The docs say what the code does: the options page lists every declared option, and product text
(the package, the docs, README) cites nothing a user cannot see."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from pytest_mgpu.settings import ALL_OPTIONS

ROOT = Path(__file__).resolve().parent.parent
OPTIONS_PAGE = ROOT / "docs" / "reference" / "options.md"
# The pattern of /work/shared/hooks/before-stop: issue numbers, internal notes, seed files, "the day".
LEAK = re.compile(r"[Ii]ssue ?#?[0-9]+|MEASURED\.md|[Ss]eed ?0[0-9]{2}|reference documents|of the day\b")


def _page_generator():
    spec = importlib.util.spec_from_file_location("options_page", ROOT / "tools" / "options_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_declared_option_is_on_the_options_page():
    page = OPTIONS_PAGE.read_text(encoding="utf-8")
    sections = {part.split("`", 1)[0]: part for part in page.split("\n### `")[1:]}
    missing = [opt.flag for opt in ALL_OPTIONS if opt.flag not in sections]
    assert not missing, (f"{OPTIONS_PAGE.relative_to(ROOT)} lacks {', '.join(missing)}: "
                         "run `python tools/options_page.py` (mkdocs build does it too)")
    for opt in ALL_OPTIONS:
        section = sections[opt.flag]
        assert (f"ini `{opt.dest}`" in section) == (opt.ini is not None), f"{opt.flag}: ini name wrong on the page"
        assert (f"`{opt.env}`" in section) if opt.env else True, f"{opt.flag}: environment variable missing"


def test_no_option_name_is_broken_on_the_options_page():
    """Each flag is a heading of its own: never a table cell, where browsers break it at its hyphens."""
    page = OPTIONS_PAGE.read_text(encoding="utf-8")
    assert "| `--" not in page
    assert all(f"### `{opt.flag}`" in page.splitlines() for opt in ALL_OPTIONS)


def test_the_options_page_is_what_the_generator_writes():
    assert OPTIONS_PAGE.read_text(encoding="utf-8") == _page_generator().render(), (
        "docs/reference/options.md is out of date with pytest_mgpu/settings.py: run `python tools/options_page.py`")


def _product_files():
    yield ROOT / "README.md"
    for folder, suffixes in (("pytest_mgpu", {".py", ".md", ".txt"}), ("docs", {".md", ".py"})):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in suffixes:
                yield path


def test_product_text_cites_nothing_users_cannot_see():
    leaks = []
    for path in _product_files():
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if LEAK.search(line):
                leaks.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not leaks, "say it for users, or move it to a docs/design page:\n" + "\n".join(leaks)
