"""dist.assert_resumes on trainers written as their public authors write them (resume_trainers.py):
correct resumes pass (same and another world size, spawn=True), each resume bug fails with its cause
in the message's first lines, nothing resumed is refused, bad arguments are refused before anything
runs, and a checkpoint that cannot load at another world size names its files and the phase."""
from __future__ import annotations

import os

import pytest

import pytest_mgpu
from pytest_mgpu import ParityError, RankFailure

from suites.resume_trainers import ddp_snapshot, ddp_snapshot_spawn, fsdp2_dcp, gpt_train
from .test_junit_messages import junit_head


@pytest.mark.gpu2
def test_ddp_snapshot_trainer_resumes(dist):
    report = dist.assert_resumes(ddp_snapshot, steps=24, stop_after=14)
    assert report.notes[0] == "resumed from the state after step 8 (the last checkpoint before the stop at step 14)"
    assert [r.step for r in report.records] == list(range(9, 25))
    assert "matches the uninterrupted run over 16 step(s)" in report.format()
    assert report.tolerance.rule == "bitwise"  # same world size, CPU kernels: reproduced bit for bit


@pytest.mark.gpu2
def test_spawn_entry_resumes(dist):
    report = dist.assert_resumes(ddp_snapshot_spawn, 2, steps=24, stop_after=10, spawn=True)
    assert report.notes[0].startswith("resumed from the state after step 8 ")


@pytest.mark.gpu2
def test_nothing_resumed_is_refused(dist):
    with pytest.raises(ParityError) as info:
        dist.assert_resumes(ddp_snapshot, bug="not_found", steps=24, stop_after=14)
    text = str(info.value)
    assert text.startswith("nothing was resumed: the resumed run started from the initial parameters (no checkpoint "
                           "found in ")
    assert "snapshot.pt" in text  # what the folder holds


@pytest.mark.gpu2
@pytest.mark.parametrize("bug, cause, evidence", [
    ("no_optimizer", "the optimizer's state was not restored", "optimizer held state for 0 parameter(s)"),
    ("epoch_early", "data repeated after the resume", "trained on the rows of step 1 again"),
    ("epoch_late", "data skipped after the resume", "the rows of step(s) 9-16 were skipped"),
    ("sampler_epoch", "data repeated after the resume", "trained on the rows of step 1 again"),
])
def test_ddp_snapshot_bugs_named(dist, bug, cause, evidence):
    with pytest.raises(ParityError) as info:
        dist.assert_resumes(ddp_snapshot, bug=bug, steps=24, stop_after=14)
    head = junit_head(str(info.value))
    assert f"likely cause: {cause}" in head and evidence in head, head


@pytest.mark.gpu2
def test_gpt_trainer_resumes(dist):
    report = dist.assert_resumes(gpt_train, steps=12, stop_after=6)
    assert report.notes[0].startswith("resumed from the state after step 4 ")


@pytest.mark.gpu2
@pytest.mark.parametrize("bug, cause, evidence", [
    ("no_scheduler", "the learning rate was not restored", "at step 6 (the second resumed step)"),
    ("no_rng", "the random state was not restored", "rows of step 5 match the uninterrupted run's; dropout (drop)"),
    ("saved_before_step", "data skipped after the resume", "rows of step 5: the rows of step(s) 4 were skipped"),
    ("step_late", "data skipped after the resume", "the rows of step(s) 5 were skipped"),
])
def test_gpt_trainer_bugs_named(dist, bug, cause, evidence):
    with pytest.raises(ParityError) as info:
        dist.assert_resumes(gpt_train, bug=bug, steps=12, stop_after=6)
    head = junit_head(str(info.value))
    assert f"likely cause: {cause}" in head and evidence in head, head


@pytest.mark.gpu4
def test_fsdp2_dcp_reshards_4_to_2(dist):
    report = dist.assert_resumes(fsdp2_dcp, steps=6, stop_after=3, world_size_after=2)
    assert report.notes[0].startswith("resumed from the state after step 2 ")
    assert report.world_size == 2
    assert report.tolerance.rule == "measured"  # another world size sums in another order: the line is measured


@pytest.mark.gpu2
def test_fsdp2_dcp_reshards_2_to_4(dist):
    report = dist.assert_resumes(fsdp2_dcp, steps=6, stop_after=5, world_size_after=4)
    assert report.notes[0].startswith("resumed from the state after step 4 ")


@pytest.mark.gpu4
def test_local_shards_at_another_world_size_name_the_files(dist):
    with pytest.raises(RankFailure) as info:
        dist.assert_resumes(fsdp2_dcp, bug="local_shards", steps=6, stop_after=3, world_size_after=2)
    head = junit_head(str(info.value))
    assert "in the resumed phase" in head and "shard_0.pt" in head, head
    assert "did not load at 2" in str(info.value) and "torch.distributed.checkpoint" in str(info.value)


@pytest.mark.gpu2
def test_fsdp2_optimizer_not_loaded(dist):
    with pytest.raises(ParityError) as info:
        dist.assert_resumes(fsdp2_dcp, bug="no_optimizer", steps=6, stop_after=3)
    assert "likely cause: the optimizer's state was not restored" in junit_head(str(info.value))


@pytest.mark.gpu2
@pytest.mark.parametrize("kwargs, words", [
    ({"steps": 6, "stop_after": 6}, "stop_after=...) must be an integer from 1 to steps - 1 = 5"),
    ({"steps": 1, "stop_after": 1}, "steps=...) must be an integer of at least 2"),
    ({"steps": 6, "stop_after": 2, "world_size_after": 0}, "world_size_after=...) must be a positive integer"),
])
def test_bad_arguments_refused(dist, kwargs, words):
    with pytest.raises(ValueError, match=r"assert_resumes\(") as info:
        dist.assert_resumes(ddp_snapshot, **kwargs)
    assert words in str(info.value)


def test_checkpoint_dir_outside_a_phase_says_what_to_do(tmp_path):
    with pytest.raises(RuntimeError, match="only inside the ranks of dist.assert_resumes"):
        pytest_mgpu.checkpoint_dir()
    from pytest_mgpu.parity.resume.folder import in_folder

    with in_folder(str(tmp_path)):
        assert pytest_mgpu.checkpoint_dir() == str(tmp_path) and os.getcwd() == str(tmp_path)
        assert pytest_mgpu.checkpoint_dir() / "x.pt" == tmp_path / "x.pt"


@pytest.mark.gpu2
def test_too_few_steps_says_so(dist):
    from pytest_mgpu.parity.resume import ResumeSetupError

    with pytest.raises(ResumeSetupError, match="the uninterrupted run took 24 optimizer step"):
        dist.assert_resumes(ddp_snapshot, steps=30, stop_after=14)


FAILING = """
import pytest
from suites.resume_trainers import ddp_snapshot

@pytest.mark.gpu2
def test_resume_bug(dist):
    dist.assert_resumes(ddp_snapshot, bug="no_optimizer", steps=24, stop_after=14)
"""


def test_a_failure_shows_the_test_line_then_the_message_not_the_plugin_source(pytester):
    """As assert_same_training's: the test's line and the E lines, no plugin frame, source or arguments."""
    pytester.makepyfile(test_failing=FAILING)
    result = pytester.runpytest("-p", "no:cacheprovider", "--mgpu-fallback=cpu")
    result.assert_outcomes(failed=1)
    out = result.stdout.lines
    first_e = next(i for i, line in enumerate(out) if line.startswith("E "))
    assert out[first_e - 1].startswith(">       dist.assert_resumes(ddp_snapshot"), "\n".join(out[:first_e + 1])
    shown = "\n".join(out)
    for plugin_text in ("judge_resume", "PhaseResult(", "verdict.py", "pytest_mgpu/parity"):
        assert plugin_text not in shown, plugin_text
