"""The simulated tier (issue 20): one rank of a 1,024-rank job on this CPU, under the fake process group.

What a CI machine cannot run: FSDP2 per block of a transformer at 1,024 ranks, and 8-way tensor parallel
x 128-way FSDP2, one training step each, each rank materializing only its shards. Checked: every
parameter is sharded as the plan says (its bytes on this rank), the collectives a step issues, and, at
2 and 4 ranks where the real tier runs, that the simulated rank's counts and bytes equal the real ranks'
(gloo on CPU here, NCCL on GPUs). Collectives move no data under the fake group: numbers are the real
tier's job (suites/test_fsdp.py)."""
import math

import pytest
import torch

from pytest_mgpu import simulate, world_sizes
from suites import sim_models as S

pytestmark = pytest.mark.simulate

WORLD = 1024
TP = 8
LAYERS = 2


def meta_params(layers: int = LAYERS):
    with torch.device("meta"):
        return dict(S.Transformer(layers=layers).named_parameters())


def fsdp_shard_bytes(shape, dp: int, itemsize: int = 4) -> int:
    """FSDP2's shard of one parameter on each rank: dim 0 padded to a multiple of the ranks."""
    rows = math.ceil(shape[0] / dp) if shape else 1
    return rows * math.prod(shape[1:]) * itemsize


def tp_local_shape(name: str, shape, tp: int):
    """The plan in ``S.block_plan``: column-wise layers split their output dim (weight dim 0 and
    bias), row-wise layers their input dim (weight dim 1; the bias is replicated)."""
    layer = name.rsplit(".", 2)[-2] if name.startswith("blocks.") else ""
    kind = name.rsplit(".", 1)[-1]
    if layer in ("q", "k", "v", "up"):
        return (shape[0] // tp,) + tuple(shape[1:])
    if layer in ("o", "down") and kind == "weight":
        return (shape[0], shape[1] // tp)
    return tuple(shape)


def test_fsdp2_per_block_at_1024_ranks():
    sim = simulate(S.fsdp_step, world_size=WORLD, rank=0, layers=LAYERS)
    print(sim.format())
    params = meta_params()
    full = sum(p.numel() * 4 for p in params.values())
    # FSDP2's own rule, parameter by parameter: this rank holds one padded shard of each, never more
    assert sim.memory.params == sum(fsdp_shard_bytes(p.shape, WORLD) for p in params.values())
    assert sim.memory.params == sim.value["params"], "the tracker and the model disagree on parameter bytes"
    assert sim.memory.params < full // 50  # FSDP2 pads each parameter's dim 0 to 1,024 rows, hence not 1/1024
    assert all(pl == ("shard",) for pl in sim.value["placements"].values()), sim.value["placements"]
    # forward: one all-gather per FSDP unit (blocks + root); backward: each block re-gathered (the
    # root stays unsharded until backward ends); one reduce-scatter of gradients per unit
    assert sim.collectives == {"all_gather_into_tensor": 2 * LAYERS + 1, "reduce_scatter_tensor": LAYERS + 1}
    # the all-gather buffers count: the root unit (embedding, final norm, head) is held unsharded, padded
    root = [p for n, p in params.items() if not n.startswith("blocks.")]
    assert sim.peak_bytes > WORLD * sum(fsdp_shard_bytes(p.shape, WORLD) for p in root)


def test_tensor_parallel_8_by_fsdp2_128():
    sim = simulate(S.tp_fsdp_step, TP, world_size=WORLD, rank=517, layers=LAYERS)
    print(sim.format())
    params = meta_params()
    dp = WORLD // TP
    expected = sum(fsdp_shard_bytes(tp_local_shape(n, p.shape, TP), dp) for n, p in params.items())
    assert sim.memory.params == expected
    for name, placements in sim.value["placements"].items():
        assert placements[0] == "shard", f"{name} is not sharded across the data-parallel dim: {placements}"
        if tp_local_shape(name, params[name].shape, TP) != tuple(params[name].shape):
            assert placements == ("shard", "shard"), f"{name} is not split across the tensor-parallel dim"
    # FSDP2 on the data-parallel dim as above; tensor parallel adds all-reduces across the 8 ranks
    assert sim.collectives["all_gather_into_tensor"] == 2 * LAYERS + 1
    assert sim.collectives["reduce_scatter_tensor"] == LAYERS + 1
    assert sim.collectives["all_reduce"] > 0


def test_resnet50_under_fsdp2():
    world = 64
    sim = simulate(S.resnet50_fsdp_step, world_size=world, rank=0)
    print(sim.format())
    bottlenecks = 3 + 4 + 6 + 3
    assert sim.collectives == {"all_gather_into_tensor": 2 * bottlenecks + 1,
                               "reduce_scatter_tensor": bottlenecks + 1}
    assert sim.memory.params == sim.value["params"]
    assert sim.memory.grads == sim.value["grads"] and sim.memory.optimizer == sim.value["optimizer"]


@world_sizes(2, 4)
def test_simulated_rank_matches_the_real_tier(dist):
    """The same step on real ranks (gloo here) and on a simulated rank of as many: the collectives a
    step issues, the bytes a rank holds after it and its peak are the same; only the data differ."""
    n = dist.world_size
    tp = 2
    real = dist.run(S.counted_plans, tp)
    rows = []
    for plan, fn, args in (("fsdp", S.fsdp_step, ()), ("tp_fsdp", S.tp_fsdp_step, (tp,))):
        sim = simulate(fn, *args, world_size=n, rank=n - 1)
        counts, figures = real[n - 1][plan]
        assert all(r[plan][0] == counts for r in real), "real ranks disagree on the collectives"
        # DTensor syncs its RNG state with one broadcast when a process makes its RNG tracker (CUDA
        # meshes only; the first plan a rank runs, not the second): a collective the simulated rank,
        # which makes no tracker, never issues. The real ranks said whether this plan made it.
        counts = dict(counts)
        assert counts.pop("broadcast", 0) == figures["rng_sync"], \
            f"{plan}: real ranks' broadcasts {real[n - 1][plan][0]}, RNG trackers made {figures['rng_sync']}"
        figures = dict(figures, sent={k: v for k, v in figures["sent"].items() if k != "broadcast"})
        rows.append((plan, counts, sim.collectives, figures, dict(sim.memory, peak=sim.peak_bytes)))
        assert sim.collectives == counts, f"{plan}: simulated {sim.collectives}, real {counts}"
        assert sim.comm_bytes_by_op == figures["sent"], \
            f"{plan} bytes per op: simulated {sim.comm_bytes_by_op}, real {figures['sent']}"
        for key in ("params", "grads", "optimizer"):
            assert sim.memory[key] == figures[key], f"{plan} {key}: simulated {sim.memory[key]}, real {figures[key]}"
        if dist.device_type == "cpu":  # the same allocations in the same order (GPUs: streams defer frees)
            # ... but gloo frees a collective's buffers from its own thread: on a loaded machine a real
            # rank's peak once held one all-gather's buffer more (1,226,344 B against 1,143,016 at W=4)
            assert sim.peak_bytes <= figures["peak"] <= 1.15 * sim.peak_bytes, \
                f"{plan} peak: simulated {sim.peak_bytes}, real {figures['peak']}"
    for plan, counts, sim_counts, figures, memory in rows:
        print(f"W={n} {plan}: real {counts} {figures['params']}/{figures['grads']}/{figures['optimizer']} B "
              f"peak {figures['peak']} | simulated {sim_counts} {memory['params']}/{memory['grads']}/"
              f"{memory['optimizer']} B peak {memory['peak']}")
