"""The plugin with torch alone: no numpy (torch's wheel does not install it) and no torchvision.
``assert_resumes`` digests parameters by their bytes; that must not need numpy. The run is a real
pytest session in a subprocess whose every process (the test process, the forkserver, the ranks)
cannot import numpy or torchvision: a ``sitecustomize`` on its PYTHONPATH refuses them, as an
environment without them would (``torch.Tensor.numpy()`` then raises "Numpy is not available")."""
import os
import textwrap

import pytest

from tests.ahead import ahead
from tests.conftest import Subpytest, base_env, one_session

BLOCK = textwrap.dedent('''
    import sys

    # numpy and torchvision are not installed here: import fails, importlib.util.find_spec says None
    sys.modules.update(numpy=None, torchvision=None)
''')

TRAINER = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pytest_mgpu
    from pytest_mgpu import world_sizes


    def absent():
        for name in ("numpy", "torchvision"):
            try:
                __import__(name)
            except ImportError:
                continue
            raise AssertionError(f"{name} is importable here: the test would prove nothing")


    def train(total_steps=6, global_batch=8):
        absent()
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, step = DDP(model), 0
        path = pytest_mgpu.checkpoint_dir() / "last.pt"
        if path.exists():
            state = torch.load(path)
            model.module.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            step = state["step"]
        while step < total_steps:
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(global_batch, 4, generator=g), torch.randn(global_batch, 2, generator=g)
            share = slice(rank * global_batch // world, (rank + 1) * global_batch // world)
            opt.zero_grad()
            F.mse_loss(model(x[share]), y[share]).backward()
            opt.step()
            step += 1
            if step % 2 == 0 and rank == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, path)
            dist.barrier()


    @world_sizes(2)
    def test_resumes_with_torch_alone(dist):
        absent()
        report = dist.assert_resumes(train, steps=6, stop_after=3)
        assert report.passed
''')


@ahead("alone")
def alone_session(tmp_path_factory):
    """The session of TRAINER where numpy and torchvision cannot be imported (run ahead of the test)."""
    sp = Subpytest(path=tmp_path_factory.mktemp("alone"))
    site = sp.path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK)
    (sp.path / "test_alone.py").write_text(TRAINER)
    (sp.path / "pytest.ini").write_text("[pytest]\nmgpu_fallback = cpu\n")
    path = base_env().get("PYTHONPATH", "")
    env_path = os.pathsep.join([str(site)] + ([path] if path else []))
    return one_session(sp, ("-q",), timeout=600, PYTHONPATH=env_path)[0]


@pytest.fixture(scope="module")
def alone(lane):
    yield from lane.take(alone_session)


def test_assert_resumes_runs_without_numpy_or_torchvision(alone):
    assert alone.rc == 0 and "1 passed" in alone.out, alone.out
