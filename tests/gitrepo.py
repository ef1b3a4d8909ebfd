"""Real git repositories for the revision lane's tests: run git, and make a repository with a first commit."""
import subprocess


def git(repo, *args) -> str:
    out = subprocess.run(["git", *args], cwd=str(repo), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def new_repo(path, files: dict):
    """A repository at ``path`` whose first commit ("base") holds ``files`` (relative path -> text)."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    git(path, "config", "user.email", "t@t")
    git(path, "config", "user.name", "t")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", ".")
    git(path, "commit", "-qm", "base")
    return path
