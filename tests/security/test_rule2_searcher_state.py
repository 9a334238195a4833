"""Rule 2 for the one pickle the platform itself must read back in a later run: Optuna's searcher state,
which Tune pickles into the study's storage (``searcher-state-*.pkl``) and unpickles on resume. A storage
writer or co-tenant can plant that file; the platform signs what it saves with this user's key (an
HMAC-SHA256, ``clsr.runtime_dir.sign``) and refuses, unread, what does not verify: the searcher's restore
raises, and the resume stops before Tune's restore, saying what to do (Optuna cannot continue a search
without the trials it suggested, so no fresh searcher is put in its place)."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import optuna
import pytest

from clsr import runtime_dir
from clsr.study.run.tune_state import UnreadableTuneState, repair_before_restore
from tests.security.test_rule2_no_pickle import Payload
from tests.unit.study.run.test_search import study_of

STATE = "searcher-state-s1.pkl"  # Tune's name for the base searcher's state (session s1)


@pytest.fixture()
def config(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "clsr"


def _generator(tmp_path: Path, seeds=(1, 2)):
    """The study's own search algorithm (``search_alg``), wrapped as Tune's driver wraps it."""
    from ray.tune.search.search_generator import SearchGenerator

    from clsr.study.run.experiment import param_space
    from clsr.study.run.search import search_alg

    study = study_of(tmp_path, seeds=list(seeds), search={"sampler": "random"})
    searcher = search_alg(study, "lr")
    assert searcher.set_search_properties("best_dev_stsb", "max", param_space(study, "lr"))
    return SearchGenerator(searcher)


def _saved(tmp_path: Path) -> tuple[Path, object]:
    """An experiment folder holding the state of a search begun: configuration 0's first seed done."""
    generator, folder = _generator(tmp_path), tmp_path / "runs" / "lr"
    folder.mkdir(parents=True)
    repeater = generator.searcher
    for trial in ("a", "b", "c"):
        repeater.suggest(trial)
    repeater.on_trial_complete("a", {"best_dev_stsb": 70.0})
    generator.save_to_dir(str(folder), "s1")
    return folder, repeater


def test_a_planted_searcher_state_is_refused_and_never_run(config, tmp_path):
    marker = tmp_path / "ran"
    folder, _ = _saved(tmp_path)
    (folder / STATE).write_bytes(pickle.dumps(Payload(marker)))  # a storage writer's replacement
    with pytest.raises(runtime_dir.Unsigned, match="not signed with this user's key"):
        _generator(tmp_path).restore_from_dir(str(folder))
    with pytest.raises(UnreadableTuneState, match="is refused.*search afresh") as err:
        repair_before_restore(str(folder), grid=False, staging_roots=[])
    assert "\n" not in str(err.value) and STATE in str(err.value)
    assert not marker.exists()


def test_a_state_signed_with_another_key_is_refused(config, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    folder, _ = _saved(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "elsewhere"))  # another user's key
    (folder / STATE).write_bytes(runtime_dir.sign(pickle.dumps(Payload(marker))))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config.parent))
    with pytest.raises(runtime_dir.Unsigned):
        _generator(tmp_path).restore_from_dir(str(folder))
    assert not marker.exists()


def test_a_signed_state_cut_short_is_lost_not_forged(config, tmp_path):
    folder, _ = _saved(tmp_path)
    (folder / STATE).write_bytes((folder / STATE).read_bytes()[:-10])  # a driver killed mid-copy
    with pytest.raises(UnreadableTuneState, match="cut short.*most likely because its driver was stopped"):
        repair_before_restore(str(folder), grid=False, staging_roots=[])


def test_a_saved_search_round_trips(config, tmp_path):
    folder, before = _saved(tmp_path)
    assert (folder / STATE).read_bytes().startswith(runtime_dir.SIGNED)
    assert repair_before_restore(str(folder), grid=False, staging_roots=[]) == []
    after = _generator(tmp_path).searcher
    _generator_of(after).restore_from_dir(str(folder))
    assert _groups(after) == _groups(before) and after.seeds == before.seeds == [1, 2]
    assert after.searcher._ot_trials.keys() == before.searcher._ot_trials.keys() == {"a", "c"}
    assert [t.params for t in after.searcher._ot_study.trials] == [
        t.params for t in before.searcher._ot_study.trials
    ]
    after.on_trial_complete("b", {"best_dev_stsb": 75.0})  # configuration 0's second seed, after resume
    assert after.searcher._ot_study.trials[0].value == pytest.approx(72.5)
    assert after.searcher._ot_study.trials[0].state == optuna.trial.TrialState.COMPLETE


def _generator_of(searcher):
    from ray.tune.search.search_generator import SearchGenerator

    return SearchGenerator(searcher)


def _groups(repeater) -> list:
    return [(g.primary_trial_id, g.config, g.scores()) for g in repeater._groups] + [
        sorted(repeater._trial_id_to_group)
    ]


def test_the_key_is_private_and_made_once(config):
    key = runtime_dir.user_key()
    info = os.lstat(config / runtime_dir.KEY_FILE)
    assert len(key) == 32 and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    assert stat.S_IMODE(os.lstat(config).st_mode) == 0o700
    assert runtime_dir.user_key() == key and os.listdir(config) == [runtime_dir.KEY_FILE]


def test_a_key_others_can_read_or_a_link_is_refused(config, tmp_path):
    runtime_dir.user_key()
    path = config / runtime_dir.KEY_FILE
    path.chmod(0o644)
    with pytest.raises(runtime_dir.UnsafeFolder, match="no one else can read"):
        runtime_dir.user_key()
    planted = tmp_path / "planted.key"
    planted.write_text("00" * 32)
    planted.chmod(0o600)
    path.unlink()
    path.symlink_to(planted)
    with pytest.raises(OSError):  # O_NOFOLLOW: a link at the key's name is never read
        runtime_dir.user_key()
