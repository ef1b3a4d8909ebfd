"""Device planning and disjoint device leases (real flock'ed files, real processes)."""
import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

from pytest_mgpu.devices import DeviceLeaser, Hardware, plan_for

GPUS4 = Hardware(("0", "1", "2", "3"), ("H100",) * 4, 16)
NONE = Hardware((), (), 2)


def test_plan_uses_gpus_when_there_are_enough():
    plan = plan_for(4, GPUS4, "skip")
    assert (plan.device_type, plan.backend, plan.emulated, plan.skip_reason) == ("cuda", "nccl", False, None)


def test_plan_skips_or_emulates_when_short():
    skip = plan_for(8, GPUS4, "skip")
    assert skip.skip_reason and "needs 8 GPU(s), found 4" in skip.skip_reason
    emu = plan_for(2, NONE, "cpu")
    assert (emu.device_type, emu.backend, emu.emulated) == ("cpu", "gloo", True)
    assert plan_for(16, NONE, "cpu", max_cpu_ranks=8).skip_reason


def test_share_puts_more_ranks_than_gpus_on_the_gpus_with_gloo():
    """--mgpu-fallback=share: NCCL refuses two ranks on one GPU (seen on a 1-GPU H200: "Duplicate GPU
    detected"), so the ranks share it over gloo; without a GPU share is cpu."""
    one = Hardware(("0",), ("NVIDIA H200",), 16)
    plan = plan_for(4, one, "share")
    assert (plan.device_type, plan.backend, plan.emulated, plan.shared_gpus, plan.gpus_to_lease) == \
        ("cuda", "gloo", True, 1, 1)
    assert plan.describe() == "4 x cuda sharing 1 GPU(s) (gloo, emulated)"
    assert plan_for(1, one, "share") == plan_for(1, one, "skip")  # enough GPUs: its own, on NCCL
    assert plan_for(2, NONE, "share") == plan_for(2, NONE, "cpu")
    assert plan_for(16, one, "share", max_cpu_ranks=8).skip_reason


def test_ranks_sharing_gpus_take_turns_and_one_process_sees_each_gpu_it_stands_in_for():
    from pytest_mgpu.launch.base import LaunchSpec
    from pytest_mgpu.launch.spawn import rank_devices

    shared = LaunchSpec(nprocs=4, backend="gloo", device_type="cuda", device_ids=("3",), test_devices=4, emulated=True)
    assert [rank_devices(shared, r) for r in range(4)] == [((0,), 0)] * 4
    two = LaunchSpec(nprocs=4, backend="gloo", device_type="cuda", device_ids=("0", "1"), test_devices=4, emulated=True)
    assert [rank_devices(two, r)[1] for r in range(4)] == [0, 1, 0, 1]
    single = LaunchSpec(nprocs=1, backend="gloo", device_type="cuda", device_ids=("3",), test_devices=2, emulated=True)
    assert rank_devices(single, 0) == ((0, 0), 0)
    own = LaunchSpec(nprocs=2, backend="nccl", device_type="cuda", device_ids=("0", "1"), test_devices=2)
    assert [rank_devices(own, r) for r in range(2)] == [((0,), 0), ((1,), 1)]


def test_cuda_ranks_start_with_cublas_deterministic_workspace_unless_the_user_set_one(monkeypatch):
    """Bitwise mode needs cuBLAS's workspace config before cuBLAS's first use: a rank sets it at start."""
    from pytest_mgpu.launch.base import LaunchSpec
    from pytest_mgpu.launch.rendezvous import Rendezvous
    from pytest_mgpu.launch.spawn import make_task

    rdv = Rendezvous("127.0.0.1", 1, "p")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    cuda = LaunchSpec(nprocs=1, backend="nccl", device_type="cuda", device_ids=("0",), test_devices=1)
    cpu = LaunchSpec(nprocs=1, backend="gloo", device_type="cpu")
    assert make_task(cuda, 0, None, b"", rdv, "log").env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in make_task(cpu, 0, None, b"", rdv, "log").env
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own choice stands
    assert "CUBLAS_WORKSPACE_CONFIG" not in make_task(cuda, 0, None, b"", rdv, "log").env


def _hold(lock_dir, ids, n, hold_s, q):
    leaser = DeviceLeaser(ids, lock_dir)
    lease = leaser.acquire(n, timeout_s=60)
    t0 = time.monotonic()
    q.put((os.getpid(), lease.ids, t0))
    time.sleep(hold_s)  # holding the devices is the point of this process
    q.put((os.getpid(), "released", time.monotonic()))
    lease.release()


def test_concurrent_processes_get_disjoint_devices(tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ids = ("2", "5", "6", "7")  # as an outer CUDA_VISIBLE_DEVICES would name them
    procs = [ctx.Process(target=_hold, args=(str(tmp_path), ids, 2, 1.5, q)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [q.get(timeout=60) for _ in range(4)]
    for p in procs:
        p.join(30)
    leases = [g[1] for g in got if g[1] != "released"]
    assert len(leases) == 2
    assert set(leases[0]).isdisjoint(leases[1])
    assert set(leases[0]) | set(leases[1]) == set(ids)


def test_a_request_waits_instead_of_oversubscribing(tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ids = ("0", "1")
    first = ctx.Process(target=_hold, args=(str(tmp_path), ids, 2, 2.0, q))
    first.start()
    pid1, lease1, _ = q.get(timeout=60)
    second = ctx.Process(target=_hold, args=(str(tmp_path), ids, 1, 0.0, q))
    second.start()
    events = [q.get(timeout=60) for _ in range(3)]
    first.join(30)
    second.join(30)
    released_at = next(t for pid, what, t in events if pid == pid1 and what == "released")
    granted_at = next(t for pid, what, t in events if pid != pid1 and what != "released")
    assert granted_at >= released_at  # the second got a device only once the first let go


def test_lease_freed_when_holder_dies(tmp_path):
    code = (
        "import sys, os; from pytest_mgpu.devices import DeviceLeaser;"
        f"l = DeviceLeaser(('0',), {str(tmp_path)!r}).acquire(1); print('held', flush=True); os._exit(0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "held" in out.stdout
    lease = DeviceLeaser(("0",), str(tmp_path)).acquire(1, timeout_s=2)
    assert lease.ids == ("0",)
    lease.release()


def test_timeout_message_says_what_to_do(tmp_path):
    a = DeviceLeaser(("0",), str(tmp_path)).acquire(1)
    try:
        with pytest.raises(TimeoutError, match="other pytest processes hold them.*-n"):
            DeviceLeaser(("0",), str(tmp_path), poll_s=0.01).acquire(1, timeout_s=0.2)
    finally:
        a.release()
    with pytest.raises(ValueError, match="asked for 3 devices, only 1 exist"):
        DeviceLeaser(("0",), str(tmp_path)).acquire(3)


def test_environment_report_command():
    out = subprocess.run(
        [sys.executable, "-m", "pytest_mgpu"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for word in ("torch", "CUDA devices", "NCCL", "gloo", "fingerprint"):
        assert word in out.stdout


def test_environment_report_follows_the_project_ini(tmp_path):
    """Started below a project whose pyproject.toml sets the CPU fallback and a baselines folder: the
    report names that file, and says gpuN tests run on CPU ranks, not that they skip."""
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmgpu_fallback = "cpu"\n'
                                             'mgpu_baselines = "perf/baselines"\n')
    (tmp_path / "tests").mkdir()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_MGPU")}
    env["PYTHONPATH"] = repo
    out = subprocess.run([sys.executable, "-m", "pytest_mgpu"], cwd=str(tmp_path / "tests"), env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"project ini     {tmp_path / 'pyproject.toml'} ([tool.pytest.ini_options])" in out.stdout
    assert "run here on N gloo CPU ranks (ini mgpu_fallback = cpu)" in out.stdout
    assert "skip here" not in out.stdout
    assert f"baselines       {tmp_path / 'perf' / 'baselines'}" in out.stdout


def test_the_project_ini_is_found_as_pytest_finds_it(tmp_path):
    from pytest_mgpu.project_ini import find_ini

    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")  # no [tool:pytest]: not pytest's file
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # no pytest table: neither
    (tmp_path / "sub").mkdir()
    assert find_ini(tmp_path / "sub") is None or find_ini(tmp_path / "sub").rootdir != tmp_path
    (tmp_path / "tox.ini").write_text("[pytest]\nmgpu_fallback = share\n")
    found = find_ini(tmp_path / "sub")
    assert (found.path, found.section, found.get("mgpu_fallback")) == (tmp_path / "tox.ini", "[pytest]", "share")
    (tmp_path / "pytest.ini").write_text("")  # pytest.ini wins in its folder, even empty
    assert find_ini(tmp_path / "sub").path == tmp_path / "pytest.ini"
    (tmp_path / "sub" / "setup.cfg").write_text("[tool:pytest]\nmgpu_seed = 3\n")  # nearer wins
    assert find_ini(tmp_path / "sub").get("mgpu_seed") == "3"


NO_FCNTL = '''\
import sys


class NoFcntl:
    """As on Windows: there is no fcntl module."""

    def find_spec(self, name, path=None, target=None):
        if name == "fcntl":
            raise ImportError("No module named 'fcntl' (made unimportable by the test)")
        return None


sys.modules.pop("fcntl", None)
sys.meta_path.insert(0, NoFcntl())
'''


def test_the_plugin_imports_where_there_is_no_fcntl(tmp_path):
    """pytest loads the plugin in every run (the pytest11 entry point): a platform without fcntl
    must still run pytest; only GPU leases need the lock."""
    (tmp_path / "sitecustomize.py").write_text(NO_FCNTL)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), repo]))
    code = ("import pytest_mgpu.plugin\n"
            "try:\n    import fcntl\nexcept ImportError:\n    print('imported without fcntl')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "imported without fcntl" in out.stdout, "the sitecustomize did not hide fcntl:\n" + out.stdout


def test_a_rank_asking_for_its_own_gpu_index_among_shared_gpus_is_told_why():
    from pytest_mgpu.cuda_only import add_cuda_hint

    class Failure:
        hint = ""

        def format(self):
            return ("rank 1 raised torch.AcceleratorError: CUDA error: invalid device ordinal\n"
                    '  File "/work/train.py", line 12, in main\n    torch.cuda.set_device(rank)\n')

    shared = Failure()
    add_cuda_hint(shared, emulated=False, shared_gpus=1)
    assert shared.hint.startswith("these ranks share 1 GPU(s) (--mgpu-fallback=share): each sees cuda:0..cuda:0")
    assert "pytest_mgpu.rank_device()" in shared.hint
    own = Failure()
    add_cuda_hint(own, emulated=False)  # ranks on GPUs of their own: nothing to add
    assert own.hint == ""
