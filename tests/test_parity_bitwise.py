"""Bitwise mode (``deterministic=True``): torch's deterministic algorithms without warn-only, so that
fused attention's backward takes its deterministic branch; an op with no deterministic version is
named, and the check falls back to the line. The attention model's bitwise run is a GPU check: on
CPU ranks it runs too (the math kernel), on CUDA it goes through flash attention."""

BITWISE = """
import functools, pytest, torch
from torch import nn
import torch.nn.functional as F

class Attention(nn.Module):
    def __init__(self, d=32, heads=4, vocab=16):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        return self.out(y)

class Scatters(nn.Module):  # put_ has no deterministic implementation, on CPU as on CUDA
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)

    def forward(self, x):
        mask = torch.zeros(x.shape[0] * 6, device=x.device).put_(torch.arange(0, 6, device=x.device),
                                                                  torch.ones(6, device=x.device))
        return self.lin(x * (1 + mask.view(x.shape)))

def attention(dtype):
    return Attention().to(dtype)

def tokens(step, n=4, t=8, vocab=16):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, vocab, (n, t), generator=g)
    return x, torch.randint(0, vocab, (n, t), generator=g)

def lm_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1).float(), y.flatten())

def rows(step, n=4):
    g = torch.Generator().manual_seed(step)
    return torch.randn(n, 6, generator=g), torch.randint(0, 4, (n,), generator=g)

def adam(params):
    return torch.optim.AdamW(params, lr=1e-2)

@pytest.mark.gpu1
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention_trains_twice_bitwise_equal(dist, dtype):
    report = dist.assert_parity("ddp", functools.partial(attention, dtype), tokens, loss_fn=lm_loss,
                                optimizer_fn=adam, steps=3,
                                deterministic=True)
    print(dist.device_type, str(dtype), "bitwise:", report.bitwise, "rule:", report.tolerance.rule,
          "notes:", report.notes)
    if report.exact:  # every kernel had a deterministic version: two runs are bitwise equal
        assert report.bitwise
    else:  # the op without one is named, and the line judged
        assert "has no deterministic implementation" in report.notes[0], report.notes

@pytest.mark.gpu1
def test_an_op_without_a_deterministic_version_is_named(dist):
    report = dist.assert_parity("ddp", Scatters, rows, steps=2, deterministic=True)
    print("NOTE:", report.notes[0])
    assert not report.exact and report.passed
    assert report.notes[0].startswith("deterministic=True, but put_ has no deterministic implementation")
    assert torch.are_deterministic_algorithms_enabled() is False  # put back in this process too
"""


def test_bitwise_mode_names_the_op_without_a_deterministic_version(pytester):
    import torch

    pytester.makepyfile(test_bitwise=BITWISE)
    result = pytester.runpytest("--mgpu-fallback=cpu", "-s", "-p", "no:cacheprovider")
    out = result.stdout.str()
    print("\n".join(line for line in out.splitlines() if "bitwise:" in line or line.startswith("NOTE")))
    result.assert_outcomes(passed=3)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # a GPU machine runs gpu1 on its GPU
    assert f"NOTE: deterministic=True, but put_ has no deterministic implementation on {device}" in out
    # CPU's math attention kernel is deterministic; on CUDA bf16 goes through flash attention, whose
    # backward is deterministic once warn-only is off (float32 may name the kernel that is not)
    assert f"{device} torch.bfloat16 bitwise: True rule: bitwise" in out, out
    if device == "cpu":
        assert "cpu torch.float32 bitwise: True rule: bitwise" in out, out
