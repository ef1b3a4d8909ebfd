"""assert_same_training's structure: every rank's collectives per training step of the user's own loop,
recorded and judged like assert_parity's, the recording's own gathers left out. Real pytest sessions
on gloo ranks."""
import json
import re

MODULE = """
import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from pytest_mgpu import world_sizes

CAP, RESHARD = {cap}, {reshard}

def model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(32, 32) for _ in range(4)])

def batches(world, steps, shard=True):
    rank, n = (tdist.get_rank(), 8) if shard else (0, 8 * world)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8 * world, 32, generator=g), torch.randint(0, 32, (8 * world,), generator=g)
        yield x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]

def train(log, net, data):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in data:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        if log is not None:
            log(net, loss)
        opt.step()

def one_device(log, world, steps=3):
    train(log, model(), batches(world, steps, shard=False))

def ddp_loop(log, world, steps=3):
    train(log, DDP(model(), bucket_cap_mb=CAP), batches(world, steps))

def fsdp_loop(log, world, steps=3):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net, mesh = model(), init_device_mesh("cpu", (world,))
    for layer in net:
        fully_shard(layer, mesh=mesh, reshard_after_forward=RESHARD)
    fully_shard(net, mesh=mesh, reshard_after_forward=RESHARD)
    train(log, net, batches(world, steps))

def ddp_optimizer(world):  # record="optimizer": no log, more batches than steps (the record stops it)
    ddp_loop(None, world, steps=5)

def fsdp_optimizer(world):
    fsdp_loop(None, world, steps=5)

def one_device_optimizer(world):
    one_device(None, world, steps=5)

def sgd_by_hand(log, world, steps=3, ddp=True):
    net = DDP(model()) if ddp else model()
    for x, y in batches(world, steps, shard=ddp):
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        log(net, loss)
        with torch.no_grad():
            for p in net.parameters():
                p -= 0.1 * p.grad
                p.grad = None

@world_sizes(2)
def test_ddp(dist):
    dist.assert_same_training(ddp_loop, one_device, 2, steps=3)
    dist.assert_same_training(ddp_optimizer, one_device_optimizer, 2, steps=3, record="optimizer")

@world_sizes(2)
def test_fsdp(dist):
    dist.assert_same_training(fsdp_loop, one_device, 2, steps=3)
    dist.assert_same_training(fsdp_optimizer, one_device_optimizer, 2, steps=3, record="optimizer")
"""

NO_OPTIMIZER = """

@world_sizes(2)
def test_no_optimizer(dist):
    dist.assert_same_training(sgd_by_hand, sgd_by_hand, 2, steps=3, ddp=False)
"""


def write(pytester, cap=25, reshard=True, extra=""):
    pytester.makepyfile(test_it=MODULE.format(cap=cap, reshard=reshard) + extra)


def run(pytester, *args):
    return pytester.runpytest("--mgpu-fallback=cpu", "-p", "no:cacheprovider", *args)


def counts(call):
    """{rank: [(piece, counts)]} of a saved call."""
    return {r: [(s["step"], s["counts"]) for s in steps] for r, steps in call["ranks"].items()}


def test_each_step_counts_the_loops_collectives_and_not_the_recording(pytester):
    write(pytester, extra=NO_OPTIMIZER)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(passed=3)
    section = next(iter(json.loads((pytester.path / "baselines" / "structure.json").read_text())["torch"].values()))
    ddp = section["test_it.py::test_ddp[gpu2]"]
    log, by_optimizer = ddp["same_training#0 ddp_loop"], ddp["same_training#1 ddp_optimizer"]
    assert log["kind"] == "training" and log["device"] == "cpu" and sorted(log["ranks"]) == ["0", "1"]
    print(json.dumps(log["ranks"]["0"]))
    # DDP's constructor checks the parameters' shapes (all_gather) and broadcasts rank 0's weights
    # (before the first forward: setup); one bucket (25 MB holds the 17 KB model): one all_reduce a
    # step; after the first step DDP rebuilds its buckets in gradient order and broadcasts that order
    want = [("setup", {"all_gather": 1, "broadcast": 2}), ("step 0", {"all_reduce": 1}),
            ("step 1", {"all_reduce": 1, "broadcast": 2}), ("step 2", {"all_reduce": 1})]
    for r in "01":
        assert counts(log)[r] == want, counts(log)
        assert counts(by_optimizer)[r] == want, counts(by_optimizer)
        assert [s["sent"] for s in by_optimizer["ranks"][r]] == [s["sent"] for s in log["ranks"][r]]
    fsdp = section["test_it.py::test_fsdp[gpu2]"]
    log, by_optimizer = fsdp["same_training#0 fsdp_loop"], fsdp["same_training#1 fsdp_optimizer"]
    print(json.dumps(log["ranks"]["0"]))
    # 4 blocks: gathered in forward and again in backward, gradients reduce-scattered; recording the
    # gradients and parameters (16 full_tensor gathers a step) is not counted
    for r in "01":
        assert counts(log)[r][1:] == [(f"step {k}", {"all_gather_into_tensor": 8, "reduce_scatter_tensor": 4})
                                      for k in range(3)], counts(log)
        assert counts(by_optimizer)[r] == counts(log)[r], (counts(by_optimizer), counts(log))
    # a loop that never calls optimizer.step() has no step to end: no structure, so nothing is judged
    assert "test_it.py::test_no_optimizer[gpu2]" not in section


def test_an_unchanged_loop_is_same_and_a_changed_plan_fails(pytester):
    write(pytester)
    run(pytester, "--mgpu-save-baselines").assert_outcomes(passed=2)
    checked = run(pytester)
    checked.assert_outcomes(passed=2)
    for call in ("test_ddp[gpu2]  same_training#0 ddp_loop", "test_ddp[gpu2]  same_training#1 ddp_optimizer",
                 "test_fsdp[gpu2]  same_training#0 fsdp_loop", "test_fsdp[gpu2]  same_training#1 fsdp_optimizer"):
        assert f"test_it.py::{call}  same" in checked.stdout.str(), checked.stdout.str()
    write(pytester, cap=0.001, reshard=False)  # a bucket per parameter; blocks kept gathered after forward
    changed = run(pytester)
    changed.assert_outcomes(failed=2)
    text = "\n".join(line for line in changed.outlines if line.startswith("structure changed"))
    print(text)
    line = re.search(r"^structure changed in step 1: all_reduce (\d+) -> (\d+) .*\[same_training#0 ddp_loop, "
                     r"ranks 0-1 of 2\]$", text, re.M)
    assert line and int(line.group(2)) > int(line.group(1)), text
    assert re.search(r"^structure changed in step 0: all_gather_into_tensor 8 -> 4 \(-4\).*"
                     r"\[same_training#0 fsdp_loop, ranks 0-1 of 2\]$", text, re.M), text


def test_goldens_of_every_kind_load():
    """A golden file written before the 'training' kind still reads; the new kind round-trips."""
    from pytest_mgpu.timing.structure.figures import CallStructure

    raw = {"world_size": 2, "ranks": {"0": [{"step": "step 0", "counts": {"all_reduce": 1}, "sent": {}}]}}
    for kind in ("simulate", "benchmark", "parity", "training"):
        call = CallStructure.from_dict("c", {**raw, "kind": kind})
        assert call.kind == kind and call.to_dict()["kind"] == kind
    assert CallStructure.from_dict("c", raw).kind == "benchmark"


MODES_SEEN = """
import os, torch
from pytest_mgpu import world_sizes

def loop(log, steps=2, out=None):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        loss = net(torch.ones(3, 4) * (step + 1)).square().mean()
        loss.backward()
        log(net, loss)
        opt.step()
    if out is not None:  # how many dispatch modes sat on the stack while the loop ran
        with open(os.path.join(out, f"modes-{os.getpid()}"), "w") as f:
            f.write(str(torch._C._len_torch_dispatch_stack()))

@world_sizes(2)
def test_it(dist):
    dist.assert_same_training(loop, loop, fn_kwargs={"out": OUT})
"""


def test_the_ranks_count_collectives_only_where_a_golden_reads_them(pytester):
    """A counter sends every op of the loop through Python: without a goldens file (nothing judged,
    nothing recorded) the ranks run the loop with no dispatch mode on; recording, with one."""
    seen = pytester.mkdir("seen")

    def modes(*args):
        for f in seen.iterdir():
            f.unlink()
        pytester.makepyfile(test_modes=f"OUT = {str(seen)!r}\n" + MODES_SEEN)
        run(pytester, *args).assert_outcomes(passed=1)
        return sorted(int(f.read_text()) for f in seen.iterdir())

    assert modes() == [0, 0]
    assert modes("--mgpu-save-structure") == [1, 1]
