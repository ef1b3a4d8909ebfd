"""The recorder's shortcuts give what the long way gives: the module census (each tree walked once a
step) names the members as torch does, shared and missing ones included, and asks a root that names
them its own way; the gradient norm is ``get_total_norm``'s to the bit; a spawned call's redirect
finds a name bound to ``init_process_group`` after an earlier call read the modules. In process."""
import sys
import types
import warnings

import torch
import torch.distributed as tdist
from torch import nn

from pytest_mgpu.parity.record.census import Census
from pytest_mgpu.parity.record.watch import total_norm
from pytest_mgpu.spawn_mode import bound_to


def shared_model():
    torch.manual_seed(0)
    inner = nn.Linear(3, 3)
    net = nn.Sequential(nn.Linear(4, 3), inner, nn.Sequential(inner, nn.BatchNorm1d(3)), nn.Linear(3, 2, bias=False))
    net[0].register_buffer("none_yet", None)
    net.register_buffer("shared", net[2][1].running_mean)  # one buffer under two names: named once
    return net


class OwnNames(nn.Module):
    """A wrapper that names its members its own way (as FSDP1's does)."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def named_parameters(self, *args, **kwargs):
        for name, p in super().named_parameters(*args, **kwargs):
            yield name.replace("inner.", ""), p


def test_the_census_names_members_as_torch_does():
    net, census = shared_model(), Census()
    names = lambda pairs: [(n, id(t)) for n, t in pairs]  # noqa: E731
    assert names(census.named_parameters(net)) == names(net.named_parameters())
    assert names(census.named_buffers(net)) == names(net.named_buffers())
    assert [id(p) for p in census.parameters(net)] == [id(p) for p in net.parameters()]
    assert [id(m) for m in census.modules(net)] == [id(m) for m in net.modules()]
    own = OwnNames()
    assert [n for n, _ in census.named_parameters(own)] == ["weight", "bias"]
    net.add_module("late", nn.Linear(2, 2))  # within a window the tree is read as it was; cleared, as it is
    assert len(census.named_parameters(net)) == 7 and len(list(net.parameters())) == 9
    census.clear()
    assert names(census.named_parameters(net)) == names(net.named_parameters())


def test_the_gradient_norm_is_torchs_to_the_bit():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for trial in range(20):
            grads = [(torch.randn(int(torch.randint(1, 200, (1,), generator=g)), generator=g)
                      * 10.0 ** int(torch.randint(-20, 20, (1,), generator=g))).to(dtype) for _ in range(12)]
            if trial == 1:
                grads[3][0] = float("nan")
            want, got = float(torch.nn.utils.get_total_norm(grads)), total_norm(grads)
            assert got == want or (got != got and want != want), (dtype, trial, got, want)
    mixed = [torch.randn(5), torch.randn(5, dtype=torch.float64)]  # torch's own path
    assert total_norm(mixed) == float(torch.nn.utils.get_total_norm(mixed))


def test_a_name_bound_after_an_earlier_read_is_redirected():
    original = tdist.init_process_group
    mod = types.ModuleType("late_binder")
    sys.modules["late_binder"] = mod
    try:
        assert not [k for names, k in bound_to(original) if names is mod.__dict__]
        mod.init_process_group = original  # bound after the modules were read
        assert [k for names, k in bound_to(original) if names is mod.__dict__] == ["init_process_group"]
        assert any(names is vars(tdist) for names, _ in bound_to(original))
    finally:
        del sys.modules["late_binder"]


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class SelfCalling(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, depth=0):
        return self.lin(x) if depth == 2 else self.lin(self(x, depth + 1))  # a submodule after itself


def test_only_the_outermost_calls_are_a_steps_forwards():
    """A module called outermost ends through its own hook (a ScriptModule through a global one): the
    calls nested in it, in itself or in another, are not the step's; the hooks are gone after."""
    from torch.nn.modules import module as M

    from pytest_mgpu.parity.record.watch import Watch

    first, again, selfish = Inner(), Inner(), SelfCalling()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated, and still met
        script = torch.jit.script(nn.Sequential(nn.Linear(4, 4)))
    for scripted in (False, True):
        watch = Watch()
        with watch.installed():
            x = torch.randn(3, 4)
            y = first(x)
            selfish(x)
            nn.MSELoss()(y, again(x))
            if scripted:
                script(x)
                first(x)
            seen = watch.take_inputs()
        assert [type(m).__name__ for m in watch.roots.values()] == ["Inner", "SelfCalling", "Inner"] + \
            (["RecursiveScriptModule"] if scripted else [])
        assert seen.calls == (5 if scripted else 3) and len(seen.rows) == 3 * seen.calls
    assert not first._forward_hooks and not selfish._forward_hooks and not M._global_forward_hooks
