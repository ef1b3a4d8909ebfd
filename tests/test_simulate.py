"""The simulated tier (issue 20): simulate() runs one rank of a fake process group in a fresh process;
what it counts (collectives, bytes, memory, steps) and what it reports."""
import pickle
import threading

import pytest
import torch
import torch.distributed as tdist
from torch import nn

from pytest_mgpu import RankFailure, Simulation, rank_context, simulate
from pytest_mgpu.launch.protocol import BadCallError
from pytest_mgpu.settings import SettingsError
from pytest_mgpu.simulate import MemoryFigures, SimulateError, step
from pytest_mgpu.simulate.wire import public_name

pytestmark = pytest.mark.simulate


# -- functions the simulated rank runs (module-level: they travel by name) ----------------------------
def collectives(n_reduce: int = 1000, n_shard: int = 100):
    w = tdist.get_world_size()
    tdist.all_reduce(torch.ones(n_reduce))
    tdist.all_gather_into_tensor(torch.empty(w * n_shard), torch.ones(n_shard))
    tdist.reduce_scatter_tensor(torch.empty(n_shard), torch.ones(w * n_shard))
    tdist.broadcast(torch.ones(10), src=0)
    tdist.barrier()
    ctx = rank_context()
    return {"rank": tdist.get_rank(), "world": w, "backend": tdist.get_backend(), "ctx": (ctx.rank, ctx.world_size),
            "randn": torch.randn(3)}


def meshes(tp: int):
    from torch.distributed.device_mesh import init_device_mesh

    flat = init_device_mesh("cpu", (tdist.get_world_size(),))
    grid = init_device_mesh("cpu", (tdist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))
    return flat.size(), grid.shape, grid.get_coordinate(), grid["tp"].size(), grid["dp"].size()


def sub_meshes(tp: int, n: int = 1000):
    """A raw c10d all_reduce over the tp sub-group and an all-gather over the dp one of a 2-D mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    grid = init_device_mesh("cpu", (tdist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))
    tdist.all_reduce(torch.ones(n), group=grid.get_group("tp"))
    dp = grid["dp"].size()
    tdist.all_gather_into_tensor(torch.empty(dp * n), torch.ones(n), group=grid.get_group("dp"))


def train(steps: int = 2, marked: bool = False):
    """A Linear(1000, 100) under SGD with momentum: params, grads and momentum of 100,100 floats."""
    model = nn.Linear(1000, 100)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for i in range(steps):
        with step(f"train {i}") if marked else _nothing():
            model(torch.randn(4, 1000)).sum().backward()
            tdist.all_reduce(model.weight.grad)
            optimizer.step()
    if marked:
        with step("eval"):
            model(torch.randn(4, 1000))
    return "done"


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def raise_on(bad: int):
    if tdist.get_rank() == bad:
        raise ValueError(f"bad value on rank {bad}")
    return tdist.get_rank()


def return_unpicklable():
    return lambda: None


def fsdp_reinit():
    """FSDP2 over a CPU mesh, its parameters initialized again as DTensors (a random op on the mesh)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(nn.Linear(16, 4), mesh=init_device_mesh("cpu", (tdist.get_world_size(),)))
    model.reset_parameters()
    return "done"


def ddp_step():
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 8))
    model(torch.randn(2, 8)).sum().backward()


# -- what a simulation counts ---------------------------------------------------------------------------
def test_counts_collectives_and_the_bytes_this_rank_sends():
    sim = simulate(collectives, world_size=8, rank=3)
    assert isinstance(sim, Simulation) and (sim.world_size, sim.rank) == (8, 3)
    assert sim.value["rank"] == 3 and sim.value["world"] == 8 and sim.value["backend"] == "fake"
    assert sim.value["ctx"] == (3, 8), "rank_context() is the simulated rank's"
    assert sim.collectives == {"all_reduce": 1, "all_gather_into_tensor": 1, "reduce_scatter_tensor": 1,
                               "broadcast": 1, "barrier": 1}
    n, f = 8, 4  # ring algorithms: all-reduce 2(n-1)/n of the buffer, all-gather (n-1) shards,
    expected = 2 * (n - 1) * 1000 * f // n + (n - 1) * 100 * f + (n - 1) * (n * 100 * f) // n + 10 * f
    assert sim.comm_bytes == expected  # reduce-scatter (n-1)/n of its input, broadcast the buffer


def test_seeded_as_a_real_rank_is():
    sim = simulate(collectives, world_size=4, rank=2)
    assert torch.equal(sim.value["randn"], torch.randn(3, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("world, tp, rank", [(8, 2, 5), (1024, 8, 517)])
def test_one_and_two_dimensional_cpu_meshes(world, tp, rank):
    flat, shape, coordinate, tp_size, dp_size = simulate(meshes, tp, world_size=world, rank=rank).value
    assert flat == world and tuple(shape) == (world // tp, tp) and (tp_size, dp_size) == (tp, world // tp)
    assert list(coordinate) == list(divmod(rank, tp))


def test_memory_at_the_end_of_the_last_step_and_per_step_figures():
    sim = simulate(train, world_size=4, rank=1)
    floats = 1000 * 100 + 100
    assert sim.memory == MemoryFigures(params=4 * floats, grads=4 * floats, optimizer=4 * floats, buffers=0,
                                       live=sim.memory.live)
    assert sim.memory["params"] == sim.memory.params and set(dict(sim.memory)) >= {"params", "grads", "optimizer"}
    assert sim.peak_bytes >= 3 * 4 * floats
    assert [s.name for s in sim.steps] == ["step 0", "step 1"]  # one per optimizer.step()
    assert all(s.collectives == {"all_reduce": 1} for s in sim.steps)
    assert sim.steps[0].memory.optimizer == 4 * floats  # the momentum exists from the first step on
    assert sim.collectives == {"all_reduce": 2}
    assert sim.comm_bytes == sum(s.comm_bytes for s in sim.steps) == 2 * 2 * 3 * 4 * 1000 * 100 // 4


def test_an_op_never_issued_counts_zero_and_the_maps_stay_plain_dicts():
    sim = simulate(train, world_size=4, rank=1)
    assert sim.collectives["all_gather_into_tensor"] == 0 and sim.comm_bytes_by_op["broadcast"] == 0
    assert all(s.collectives["reduce_scatter_tensor"] == 0 for s in sim.steps)
    assert sim.collectives == {"all_reduce": 2} and "all_gather_into_tensor" not in sim.collectives  # nothing added
    assert repr(sim.collectives) == "{'all_reduce': 2}" and isinstance(sim.collectives, dict)
    assert pickle.loads(pickle.dumps(sim)).collectives["broadcast"] == 0


def test_marked_steps_replace_optimizer_steps():
    sim = simulate(train, marked=True, world_size=4, rank=0)
    assert [s.name for s in sim.steps] == ["train 0", "train 1", "eval"]
    assert [s.collectives for s in sim.steps] == [{"all_reduce": 1}, {"all_reduce": 1}, {}]
    text = sim.format()
    for word in ("train 0", "eval", "whole call", "all_reduce", "rank 0 of 4", "params", "optimizer"):
        assert word in text, text


def test_steps_do_nothing_outside_a_measured_call():
    import pytest_mgpu

    assert pytest_mgpu.simulate.step is step  # reachable from the function users import, too
    with step("outside"):
        pass


def test_public_names_of_raw_and_functional_collectives():
    assert public_name("c10d._allgather_base_") == "all_gather_into_tensor"
    assert public_name("c10d_functional.reduce_scatter_tensor") == "reduce_scatter_tensor"
    assert public_name("c10d.allreduce_") == "all_reduce"


def test_memory_figures_pickle_and_read_both_ways():
    m = pickle.loads(pickle.dumps(MemoryFigures(params=1, grads=2, optimizer=3)))
    assert (m.params, m["grads"], dict(m)["optimizer"]) == (1, 2, 3)
    with pytest.raises(KeyError, match="memory figures are params"):
        m["weights"]


def test_fsdp2_storage_resizes_are_tracked():
    """FSDP2 frees and re-allocates unsharded parameters with UntypedStorage.resize_, which no dispatch
    mode sees: the peak must still count them."""
    from pytest_mgpu.simulate.instruments import Instruments

    with Instruments() as ins:
        t = torch.empty(1000)
        base = ins.live_bytes
        t.untyped_storage().resize_(0)
        assert ins.live_bytes == base - 4000
        t.untyped_storage().resize_(8000)
        assert ins.live_bytes == base + 4000
        assert ins.whole.peak >= base + 4000
        del t
    assert ins.live_bytes == base - 4000


def test_torch_warning_about_random_ops_on_a_cpu_mesh_is_not_shown(capfd):
    """Every simulated mesh is a CPU mesh: the warning would follow every FSDP2 simulation."""
    assert simulate(fsdp_reinit, world_size=64, rank=5).value == "done"
    out, err = capfd.readouterr()
    assert "DTensor random operators" not in out + err


# -- failures, limits, arguments ---------------------------------------------------------------------
def test_a_failure_names_the_simulated_rank_with_its_traceback():
    with pytest.raises(RankFailure) as info:
        simulate(raise_on, 5, world_size=16, rank=5)
    text = str(info.value)
    assert info.value.ranks == [5]
    assert "simulated rank 5 of 16, fake process group on cpu" in text
    assert "rank 5 raised ValueError: bad value on rank 5" in text
    assert 'in raise_on\n' in text and "raise ValueError" in text
    assert "inrank.py" not in text and "rank.py" not in text, "the plugin's own frames lead the traceback"
    assert simulate(raise_on, 5, world_size=16, rank=4).value == 4


def test_ddp_is_told_to_run_on_real_ranks_in_the_head_of_the_message():
    """torch's fake process group completes DDP's all-reduce without a result and DDP's reducer asserts:
    the message says so in words, with what to do, where a CI page shows it (its first 500 characters)."""
    with pytest.raises(RankFailure) as info:
        simulate(ddp_step, world_size=1024, rank=3)
    head = str(info.value)[:500]
    assert "DistributedDataParallel's all-reduce returned no result on the fake process group" in head
    assert "fix: DistributedDataParallel cannot run on the simulated tier; simulate FSDP2" in head
    assert "INTERNAL ASSERT FAILED" in str(info.value)  # torch's own words stay in the full story


def test_a_value_that_cannot_come_back_is_named():
    with pytest.raises(RankFailure, match="return_unpicklable returned a function that cannot be sent back"):
        simulate(return_unpicklable, world_size=2)


@pytest.mark.parametrize("kwargs, match", [
    ({"world_size": 0}, r"world_size=\.\.\.\) takes a whole number of ranks >= 1, got 0"),
    ({"world_size": 4, "rank": 4}, r"rank=\.\.\.\) takes a rank from 0 to world_size - 1 = 3, got 4"),
    ({"world_size": 4.0}, "got 4.0"),
])
def test_a_world_it_cannot_play_is_refused(kwargs, match):
    with pytest.raises(SimulateError, match=match):
        simulate(collectives, **kwargs)


def test_what_cannot_travel_is_refused_naming_simulate():
    lock = threading.Lock()
    with pytest.raises(BadCallError, match="simulate cannot send '.*<lambda>' .* captures `lock`"):
        simulate(lambda: lock, world_size=2)
    with pytest.raises(SettingsError, match=r"simulate\(timeout=\.\.\.\) must be a positive"):
        simulate(collectives, world_size=2, timeout=0)


@pytest.mark.parametrize("world,tp", [(8, 2), (1024, 8)])
def test_bytes_on_a_sub_mesh_are_counted_by_its_group_size(world, tp):
    sim = simulate(sub_meshes, tp, world_size=world, rank=world - 1)
    dp, n = world // tp, 1000 * 4
    assert sim.comm_bytes_by_op == {"all_reduce": 2 * (tp - 1) * n // tp, "all_gather_into_tensor": (dp - 1) * n}
    assert sim.comm_bytes == sum(sim.comm_bytes_by_op.values())


def test_a_group_of_one_sends_nothing():
    sim = simulate(collectives, world_size=1)
    assert sim.value["world"] == 1 and sim.collectives["broadcast"] == 1
    assert sim.comm_bytes == 0
