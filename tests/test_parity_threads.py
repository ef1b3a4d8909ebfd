"""The test process judges a parity check in one thread (its intra-op threads only wait for each
other on a loaded machine), and gives the user's thread count back, on success and on failure."""
import pytest
import torch

from pytest_mgpu.parity.threads import one_thread


def test_one_thread_inside_and_the_callers_count_after():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError), one_thread():
            raise ValueError("a failed check")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
