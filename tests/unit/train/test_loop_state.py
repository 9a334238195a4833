"""The loop's state through a checkpoint: the same ``state.pt`` keys as the state dict it replaced, so a
checkpoint written before ``LoopState`` resumes, and a round trip through ``weights_only`` loading."""

from __future__ import annotations

import math

import torch

from clsr.train.loop_state import LoopState

# what the loop wrote to state.pt before LoopState (besides model, optimizer, scheduler, rng, grad_scaler)
ALWAYS = {
    "step",
    "best_score",
    "best_step",
    "lowest_loss",
    "stalled_steps",
    "evaluations",
    "checkpoint_wait_s",
}
ONCE_HAPPENED = {"loss_avg", "best_dev", "checkpoint_s", "checkpoint_bytes"}


def test_a_fresh_state_writes_the_keys_the_loop_always_wrote():
    assert set(LoopState().to_checkpoint()) == ALWAYS


def test_a_full_state_writes_the_eleven_keys_of_the_former_state_dict():
    state = LoopState(step=4, evaluations=2, loss_avg=0.5, best_dev={"dev_stsb": 0.7})
    state.add_checkpoint(0.25, 1000)
    assert set(state.to_checkpoint()) == ALWAYS | ONCE_HAPPENED
    assert len(ALWAYS | ONCE_HAPPENED) == 11


def test_round_trip_through_a_weights_only_load(tmp_path):
    state = LoopState(step=7, best_score=0.81, best_step=6, lowest_loss=0.3, stalled_steps=2, evaluations=3)
    state.loss_avg, state.best_dev = 0.4, {"dev_stsb": 0.81, "dev_sickr": 0.7}
    state.add_checkpoint(1.5, 2048)
    state.add_checkpoint(0.5, 1024)
    with state.waiting_for_checkpoints():
        pass
    saved = {"model": {"w": torch.zeros(2)}, "rng": {}, **state.to_checkpoint()}
    torch.save(saved, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    again = LoopState.from_checkpoint(loaded)  # the checkpoint's other parts are not state
    assert again == state
    assert (again.checkpoint_s, again.checkpoint_bytes) == (2.0, 3072)
    assert again.checkpoint_wait_s >= 0


def test_a_checkpoint_written_by_the_former_state_dict_resumes():
    """The first checkpoint of a trial, as the dict-based loop wrote it (no checkpoint cost yet)."""
    former = {
        "step": 2,
        "best_score": -math.inf,
        "best_step": 0,
        "lowest_loss": math.inf,
        "stalled_steps": 0,
        "loss_avg": 1.25,
        "evaluations": 2,
        "checkpoint_wait_s": 0.01,
    }
    state = LoopState.from_checkpoint(former)
    assert (state.step, state.evaluations, state.loss_avg) == (2, 2, 1.25)
    assert state.checkpoint_s is None and state.best_dev is None
    assert state.to_checkpoint() == former


def test_early_stopping_counts_survive_the_round_trip():
    state = LoopState()
    assert [state.loss_stalled(loss, 2) for loss in (3.0, 2.0, 2.5)] == [False, False, False]
    again = LoopState.from_checkpoint(state.to_checkpoint())
    assert again.loss_stalled(2.2, 2) is True
