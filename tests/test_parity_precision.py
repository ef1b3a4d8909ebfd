"""Parity checks run float32 as IEEE float32 (TF32 off) on GPUs, and put the user's settings back.

On a real H200, with cuDNN's default TF32 convolutions, a pipeline cutting a BatchNorm CNN's batch into 4
micro-batches (outputs 15% off) passed as "matches one device": TF32 widened the measured line to 12%.
CPU CI cannot run TF32, so these tests check the switch itself, where the user's code runs."""
import torch

from pytest_mgpu import world_sizes
from pytest_mgpu.parity.precision import ieee_float32
from suites import models as M


def tf32_state():
    return (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32)


def test_tf32_is_off_inside_and_restored_after():
    before = tf32_state()
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    set_by_user = tf32_state()
    try:
        with ieee_float32():
            assert tf32_state() == ("highest", False, False)
        assert tf32_state() == set_by_user and set_by_user[0] == "high" and set_by_user[2]
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[2]


def mlp_checking_tf32():
    assert tf32_state() == ("highest", False, False), f"TF32 on during a parity check: {tf32_state()}"
    return M.mlp()


def loop_checking_tf32(steps=4):
    assert tf32_state() == ("highest", False, False), f"TF32 on during a parity check: {tf32_state()}"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        opt.step()


def _flags_after():
    return tf32_state()


@world_sizes(2)
def test_our_wrappers_and_the_users_loop_run_without_tf32_and_ranks_keep_their_settings(dist):
    before = dist.run(_flags_after)
    dist.assert_parity("ddp", mlp_checking_tf32, M.mnist_batch, steps=1)
    dist.assert_same_training(loop_checking_tf32, loop_checking_tf32, steps=2, record="optimizer")
    assert dist.run(_flags_after) == before  # the warm ranks' own settings are back
