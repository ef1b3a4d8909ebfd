"""dist.spawn: the user's mp.spawn entry point runs unchanged in this test's ranks; its own
init_process_group (hard-coded MASTER_PORT, tcp:// init_method, explicit rank/world_size, "nccl")
joins this test's rendezvous, so fixed ports never collide, also under pytest-xdist."""

import pytest

from pytest_mgpu import world_sizes
from tests import xdist_together as together

BODY = '''
import os, pytest, warnings, torch, torch.distributed as tdist
from torch.distributed import init_process_group, destroy_process_group
from pytest_mgpu import world_sizes

def seed_style(rank, world_size, offset):      # as seed 001 writes it: fixed port, explicit rank
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    assert not tdist.is_initialized(), "dist.spawn must start the user's fn with no group up"
    init_process_group(backend="nccl", rank=rank, world_size=world_size)
    t = torch.tensor([float(rank + offset)])
    tdist.all_reduce(t)
    destroy_process_group()
    return t.item(), os.getpid()

def tcp_style(rank, world_size):               # init_method tcp://, and the group left up
    tdist.init_process_group("gloo", init_method="tcp://127.0.0.1:23456", rank=rank,
                             world_size=world_size)
    t = torch.ones(1)
    tdist.all_reduce(t)
    return t.item()

def env_style(rank):                            # env:// from the environment only
    os.environ["MASTER_PORT"] = "12355"
    tdist.init_process_group("gloo")
    return tdist.get_rank(), tdist.get_world_size()

def wrong_size(rank):
    init_process_group("gloo", rank=rank, world_size=3)

def pid():
    return os.getpid(), tdist.get_world_size()

@world_sizes(2, 4)
@pytest.mark.parametrize("k", range(3))
def test_fixed_port(dist, k):
    n = dist.world_size
    with pytest.warns(RuntimeWarning, match="backend 'nccl' cannot run on these cpu ranks; ran as 'gloo'"):
        got = dist.spawn(seed_style, n, offset=k)
    assert [v for v, _ in got] == [n * (n - 1) / 2 + n * k] * n
    assert dist.spawn(tcp_style, n) == [float(n)] * n
    assert dist.spawn(env_style) == [(r, n) for r in range(n)]
    after = dist.run(pid)                       # the ranks are usable, and still the same processes
    assert [p for p, _ in after] == [p for _, p in got] and {w for _, w in after} == {n}

@world_sizes(2)
def test_wrong_world_size(dist):
    dist.spawn(wrong_size)
'''


FILE = together.register("test_spawn.py", BODY)  # run in the session shared with the other xdist tests


def test_spawn_fixed_ports_under_xdist_and_warm_ranks(xdist_together):
    run = xdist_together
    assert run.outcomes(FILE) == {**{f"test_fixed_port[{k}-gpu{w}]": "passed" for w in (2, 4) for k in range(3)},
                                  "test_wrong_world_size[gpu2]": "failed"}, run.out
    assert ("init_process_group(world_size=3) inside dist.spawn, but this test runs 2 rank(s)"
            in run.case(FILE, "test_wrong_world_size[gpu2]").text), run.out
    assert run.left == []


def device_id_style(rank):
    import torch
    import torch.distributed as tdist

    tdist.init_process_group("gloo", device_id=torch.device("cpu"))
    return tdist.get_rank()


@world_sizes(2)
def test_a_dropped_device_id_is_said(dist):
    with pytest.warns(RuntimeWarning, match=r"init_process_group\(device_id=device\(type='cpu'\)\) was dropped"):
        assert dist.spawn(device_id_style) == [0, 1]
