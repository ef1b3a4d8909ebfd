"""What travels to the ranks by value, and what is refused naming the captured variable (no ranks)."""
import functools
import pickle
import threading

import pytest
import torch

from pytest_mgpu.launch.byvalue import BadCallError, importable
from pytest_mgpu.launch.protocol import FnRef


def module_level(x):
    return x + 1


class OnCuda(torch.Tensor):
    """A CPU tensor that says it lives on a GPU, as one made in the test process on a GPU machine does."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_module_level_functions_travel_by_name_and_closures_by_value():
    assert FnRef.of(module_level).blob is None and importable(module_level)
    k = 2
    ref = FnRef.of(lambda x: module_level(x) * k)
    assert ref.blob is not None and ref.module == __name__
    assert pickle.loads(pickle.dumps(ref)).resolve()(1) == 4
    part = FnRef.of(functools.partial(module_level, 4))
    assert part.blob is not None and part.resolve()() == 5


def test_what_cannot_travel_is_named_however_deep():
    lock = threading.Lock()

    def inner():
        return lock

    def outer():
        return inner()

    with pytest.raises(BadCallError, match=r"captures `inner\.lock` \(_thread\.lock\)"):
        FnRef.of(outer)
    with pytest.raises(BadCallError, match=r"functools\.partial\(.*\) to the ranks: it captures `argument 0`"):
        FnRef.of(functools.partial(module_level, lock))


def test_a_gpu_tensor_made_in_the_test_process_is_refused():
    w = torch.Tensor._make_subclass(OnCuda, torch.zeros(2))
    with pytest.raises(BadCallError, match=r"captures `w`, a cuda tensor made in the test process.*rank_device"):
        FnRef.of(lambda: w.sum())
