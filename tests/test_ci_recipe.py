"""The timing guide's recipe for gating from the first pull request, run as written: its shell step,
in a clone of a repository whose main branch has one commit, on a pull request branch on top of it.
It passes when the pull request leaves the step alone and fails when the step does 30% more work."""
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import UNUSED_PLUGINS
from tests.gitrepo import git, new_repo

ROOT = Path(__file__).resolve().parent.parent

TRAIN = '''
import torch

WORK = {work}  # matrix products per step


def step_factory(n):
    x = torch.randn(n, n)

    def step():
        for _ in range(WORK):
            x @ x
    return step
'''
TEST = '''
import pytest
import train


@pytest.mark.gpu1
def test_step_speed(dist):
    dist.benchmark(train.step_factory, 96, min_run_time=0.25)
'''


def recipe_script() -> str:
    """The ``run: |`` step of the recipe in docs/guides/timing.md that computes the merge base."""
    page = (ROOT / "docs" / "guides" / "timing.md").read_text(encoding="utf-8")
    block = page.split("### Gating from the first pull request", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if "git merge-base" in line)
    indent = len(lines[start]) - len(lines[start].lstrip())
    script = [line[indent:] for line in lines[start:] if line.strip() and len(line) - len(line.lstrip()) >= indent]
    return "\n".join(script)


def _pull_request(tmp_path: Path, work: int) -> Path:
    """origin: main with one commit; the clone: a pull request branch whose commit sets WORK."""
    origin = new_repo(tmp_path / "origin", {"train.py": TRAIN.format(work=10), "tests/test_speed.py": TEST,
                                            "README.md": "a project\n"})
    git(origin, "branch", "-M", "main")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    git(clone, "config", "user.email", "t@t")
    git(clone, "config", "user.name", "t")
    git(clone, "checkout", "-q", "-b", "pr")
    (clone / "train.py").write_text(TRAIN.format(work=work))
    (clone / "README.md").write_text("a project, better said\n")
    git(clone, "commit", "-qam", "the pull request")
    return clone


def _run_recipe(clone: Path):
    script = recipe_script().replace("${{ github.base_ref }}", "main")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_CORE_"))}
    env.update(GITHUB_STEP_SUMMARY=str(clone.parent / "summary.md"), PYTHONPATH=str(ROOT),
               PYTEST_ADDOPTS=" ".join(UNUSED_PLUGINS),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    done = subprocess.run(["bash", "-ec", script], cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_the_recipe_reads_as_a_merge_base_gate():
    script = recipe_script()
    assert script.startswith("BASE=$(git merge-base origin/${{ github.base_ref }} HEAD)")
    assert "--mgpu-against=$BASE" in script and "fetch-depth: 0" in (ROOT / "docs/guides/timing.md").read_text()


def test_the_recipe_passes_an_unchanged_step(tmp_path):
    clone = _pull_request(tmp_path, work=10)  # the pull request only rewords the README
    code, out = _run_recipe(clone)
    assert code == 0, out
    assert re.search(r"unchanged: the \d+ file\(s\) of the repository its ranks imported are the same", out), out


def test_the_recipe_fails_a_step_30_percent_slower(tmp_path):
    clone = _pull_request(tmp_path, work=13)
    base = git(clone, "merge-base", "origin/main", "HEAD")[:7]
    code, out = _run_recipe(clone)
    assert code == 1, out
    assert f"slower than {base}" in out and "beyond the threshold (the revision lane)" in out, out
    assert "1 distributed test(s), 1 call(s)" in out, out  # the lane's measurement is the test's call
