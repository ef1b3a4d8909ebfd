"""Resume parity: trainers that checkpoint as their public authors write them, stopped part-way and
resumed, at the same world size and across a reshard (DCP). Each must train like never stopping."""
import pytest

from suites import resume_trainers as T


@pytest.mark.gpu4
def test_ddp_tutorial_snapshot_trainer(dist):
    """DistributedSampler epochs, snapshot.pt saved by rank 0 at the end of every epoch."""
    report = dist.assert_resumes(T.ddp_snapshot, steps=12, stop_after=6)
    assert report.notes[0].startswith("resumed from the state after step 4 ")


@pytest.mark.gpu2
def test_gpt_adamw_cosine_trainer(dist):
    """AdamW, warm-up + cosine schedule, dropout with every rank's random state saved."""
    report = dist.assert_resumes(T.gpt_train, steps=12, stop_after=6)
    assert report.notes[0].startswith("resumed from the state after step 4 ")


@pytest.mark.gpu4
def test_fsdp2_dcp_reshard_4_to_2(dist):
    report = dist.assert_resumes(T.fsdp2_dcp, steps=6, stop_after=3, world_size_after=2)
    assert report.world_size == 2


@pytest.mark.gpu2
def test_fsdp2_dcp_reshard_2_to_4(dist):
    report = dist.assert_resumes(T.fsdp2_dcp, steps=6, stop_after=5, world_size_after=4)
    assert report.notes[0].startswith("resumed from the state after step 4 ")
