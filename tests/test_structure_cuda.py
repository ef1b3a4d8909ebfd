"""The structure counter's CUDA peak, with the allocator's answers monkeypatched (CPU CI has no GPU).

On a real H200 a warm rank that had run other tests first read 196 MiB for a ResNet50 setup that a
fresh process read as 127 MiB: the absolute peak counts whatever an earlier call left allocated. The
peak is what the piece held at most above what was allocated when it began."""
import torch

from pytest_mgpu.timing.structure.counter import StepRecorder


def test_cuda_peak_is_taken_above_what_was_allocated_when_the_piece_began(monkeypatch):
    state = {"allocated": 300, "max": 300}

    def reset(i=None):
        state["max"] = state["allocated"]

    def allocate(n):
        state["allocated"] += n
        state["max"] = max(state["max"], state["allocated"])

    from pytest_mgpu.timing.structure import counter

    monkeypatch.setattr(counter, "warm_cublas", lambda i: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i=None: state["max"])

    def work():
        allocate(120)  # a temporary ...
        allocate(-120)
        allocate(50)  # ... and what stays

    rec = StepRecorder(cuda=[0])
    rec.run("setup", work)
    rec.run("step 0", lambda: (allocate(10), allocate(-10)))
    assert [s.peak_bytes for s in rec.steps] == [120, 10]  # not 420 and 360: the 300 held before


def test_cublas_takes_its_workspace_before_the_first_piece(monkeypatch):
    from pytest_mgpu.timing.structure import counter

    order = []
    monkeypatch.setattr(counter, "warm_cublas", lambda i: order.append(("warm", i)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda i=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda i=None: order.append(("reset", i)))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i=None: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i=None: 0)
    rec = StepRecorder(cuda=[0, 1])
    rec.run("setup", lambda: None)
    rec.run("step 0", lambda: None)
    assert order == [("warm", 0), ("warm", 1), ("reset", 0), ("reset", 1), ("reset", 0), ("reset", 1)]
