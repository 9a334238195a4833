"""The one retry policy (``clsr.tracking.retry``): every MLflow error code classified as the policy says,
the errors below MLflow's client (connections, HTTP statuses, a locked SQLite file as MLflow wraps it),
a refused write raised at once by the driver's client and dropped at once by the spool (the two used to
disagree), and a transient error retried until it answers or patience runs out, on a fake clock."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import pytest
import requests
import sqlalchemy
import sqlalchemy.orm
from mlflow.entities import Param
from mlflow.exceptions import MlflowException, RestException
from mlflow.protos.databricks_pb2 import ErrorCode
from mlflow.tracking import MlflowClient

import clsr.tracking.spool as spool_module
from clsr.tracking import retry
from clsr.tracking.journal import Refused
from clsr.tracking.patient import PatientClient
from clsr.tracking.retry import FINAL, TRANSIENT_CODES, call_with_retry, is_transient
from clsr.tracking.spool import Spool, hand_over, pending_runs, replay_pending
from tests.support.stores import sqlite_uri

# the two the driver and the spool disagreed on, and the rest of the brief's examples
REFUSALS = ["PERMISSION_DENIED", "RESOURCE_ALREADY_EXISTS", "UNAUTHENTICATED", "INVALID_PARAMETER_VALUE"]


class Clock:
    """A monotonic clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory) -> tuple[str, MlflowClient, str]:
    """One SQLite store for the module (making one costs seconds): (tracking URI, client, experiment)."""
    folder = tmp_path_factory.mktemp("mlflow")
    uri = sqlite_uri(folder / "mlflow.db")
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("retry", artifact_location=(folder / "artifacts").as_uri())


@pytest.fixture
def store(shared_store) -> tuple[str, MlflowClient, str]:
    """A RUNNING run of its own: (tracking URI, client, run id)."""
    uri, client, experiment = shared_store
    return uri, client, client.create_run(experiment).info.run_id


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(retry, "_now", lambda: fake.now)
    monkeypatch.setattr(retry, "_sleep", fake.sleep)
    return fake


def refusal(code: str) -> RestException:
    """What MLflow's REST client raises for a server's answer with ``code``."""
    return RestException({"error_code": code, "message": "refused by the test"})


# --- the classification ----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ErrorCode.keys())
def test_every_mlflow_error_code_is_classified(code):
    """Transient exactly when listed as such; a code not listed (however MLflow maps it) is final."""
    raised = MlflowException("x", error_code=ErrorCode.Value(code))
    assert raised.error_code == code
    assert is_transient(raised) is (code in TRANSIENT_CODES)
    assert is_transient(RestException({"error_code": code, "message": "x"})) is (code in TRANSIENT_CODES)


def test_the_named_codes_are_on_their_side():
    assert set(ErrorCode.keys()) >= FINAL | TRANSIENT_CODES and not FINAL & TRANSIENT_CODES
    for code in [*REFUSALS, "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST", "ENDPOINT_NOT_FOUND"]:
        assert code in FINAL and not is_transient(MlflowException("x", error_code=ErrorCode.Value(code)))
    for code in ["TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "REQUEST_LIMIT_EXCEEDED", "DEADLINE_EXCEEDED"]:
        assert is_transient(MlflowException("x", error_code=ErrorCode.Value(code)))


@pytest.mark.parametrize(
    ("status", "transient"), [("503", True), ("500", True), ("429", True), ("403", False), ("400", False)]
)
def test_an_http_status_in_place_of_a_code_is_classified_by_the_code_mlflow_maps_it_to(status, transient):
    """A proxy's answer: MLflow's RestException turns a numeric error code into its own code."""
    assert is_transient(RestException({"error_code": status, "message": "from a proxy"})) is transient


def http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status}", response=response)


@pytest.mark.parametrize(
    ("err", "transient"),
    [
        (requests.ConnectionError("connection refused"), True),
        (ConnectionRefusedError(111, "Connection refused"), True),
        (TimeoutError("timed out"), True),
        (http_error(503), True),
        (http_error(429), True),
        (http_error(403), False),  # an artifact store's refusal is an OSError too: its status decides
        (http_error(404), False),
        (FileNotFoundError("a spooled file is gone"), False),
        (PermissionError("not ours"), False),
        (sqlite3.OperationalError("database is locked"), True),
        (sqlalchemy.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked")), True),
        (Refused("a journal entry refused: malformed tags"), False),
        (ValueError("a bug"), False),
    ],
)
def test_errors_below_mlflow_are_classified(err, transient):
    assert is_transient(err) is transient


def test_a_locked_sqlite_file_as_mlflow_wraps_it_is_transient(tmp_path):
    """MLflow's SQLAlchemy store turns the OperationalError of a locked SQLite file into
    TEMPORARILY_UNAVAILABLE: met here through MLflow's own session wrapper, on a real lock (sqlite3's busy
    timeout set to 0 so that it answers at once; MLflow's own is 20 s)."""
    from mlflow.store.db.utils import _get_managed_session_maker

    database = tmp_path / "locked.db"
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.execute("BEGIN EXCLUSIVE")
    engine = sqlalchemy.create_engine(f"sqlite:///{database}", connect_args={"timeout": 0})
    managed = _get_managed_session_maker(sqlalchemy.orm.sessionmaker(bind=engine), "not sqlite: no pragmas")
    try:
        with pytest.raises(MlflowException) as caught, managed(read_only=False) as session:
            session.execute(sqlalchemy.text("INSERT INTO t VALUES (1)"))
    finally:
        holder.close()
        engine.dispose()
    assert caught.value.error_code == "TEMPORARILY_UNAVAILABLE" and "database is locked" in str(caught.value)
    assert is_transient(caught.value)


# --- retrying --------------------------------------------------------------------------------------------


def failing(errors: list[Exception], answer: str = "answered"):
    """A call that raises ``errors`` in turn, then answers; it counts its tries."""

    def call() -> str:
        call.tries += 1  # type: ignore[attr-defined]
        if errors:
            raise errors.pop(0)
        return answer

    call.tries = 0  # type: ignore[attr-defined]
    return call


def test_a_transient_error_is_retried_until_the_call_answers(clock, capsys):
    call = failing(
        [
            requests.ConnectionError("refused"),
            MlflowException("locked", error_code=ErrorCode.Value("TEMPORARILY_UNAVAILABLE")),
        ]
    )
    assert call_with_retry(call, patience_s=60, what="testing") == "answered"
    assert call.tries == 3 and clock.sleeps == [1, 2]  # BACKOFF_S
    assert capsys.readouterr().out.startswith("MLflow unreachable while testing (ConnectionError: refused)")


def test_past_its_patience_the_last_transient_error_is_raised(clock):
    endless = [requests.ConnectionError(f"refused {n}") for n in range(100)]
    call = failing(endless)
    with pytest.raises(requests.ConnectionError, match="refused 5"):
        call_with_retry(call, patience_s=20, what="testing")
    assert clock.sleeps == [1, 2, 5, 10, 2]  # the last wait ends at the patience: one more try, then up
    assert call.tries == 6 and clock.now == 20


def test_without_a_limit_the_waits_stop_growing_and_it_goes_on(clock):
    call = failing([requests.ConnectionError("down")] * 30)
    assert call_with_retry(call, patience_s=None, what="testing") == "answered"
    assert call.tries == 31 and max(clock.sleeps) == 30 and clock.sleeps[-1] == 30


def test_no_patience_means_one_try(clock):
    with pytest.raises(requests.ConnectionError):
        call_with_retry(failing([requests.ConnectionError("down")]), patience_s=0, what="testing")
    assert clock.sleeps == []


@pytest.mark.parametrize("code", REFUSALS)
def test_a_final_error_is_raised_at_once(clock, code):
    call = failing([refusal(code)])
    with pytest.raises(RestException, match=code):
        call_with_retry(call, patience_s=600, what="testing")
    assert call.tries == 1 and clock.sleeps == []


# --- one answer in the driver and in the spool -----------------------------------------------------------


def test_the_patient_client_is_an_mlflow_client(store):
    uri, _, run_id = store
    client = PatientClient(uri)
    assert isinstance(client, MlflowClient) and client.patience_s == retry.DRIVER_PATIENCE_S
    assert client.get_run(run_id).info.run_id == run_id


@pytest.mark.parametrize("code", REFUSALS)
def test_a_refused_write_fails_at_once_in_the_driver(store, clock, monkeypatch, code):
    uri, _, run_id = store
    client = PatientClient(uri)

    def refuse(*args, **kwargs):
        raise refusal(code)

    monkeypatch.setattr(client._tracking_client, "set_tag", refuse)  # the server's answer, below the client
    with pytest.raises(RestException, match=code):
        client.set_tag(run_id, "clsr.status", "running")
    assert clock.sleeps == []


def test_a_changed_param_is_refused_at_once_by_a_real_store(store, clock):
    uri, client, run_id = store
    client.log_param(run_id, "p", "1")
    with pytest.raises(MlflowException) as caught:
        PatientClient(uri).log_param(run_id, "p", "2")
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE" and clock.sleeps == []


def test_the_driver_waits_out_a_busy_store(store, clock, monkeypatch):
    uri, client, run_id = store
    patient = PatientClient(uri)
    real = patient._tracking_client.set_tag
    busy = [MlflowException("database is locked", error_code=ErrorCode.Value("TEMPORARILY_UNAVAILABLE"))] * 2

    def set_tag(*args, **kwargs):
        if busy:
            raise busy.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(patient._tracking_client, "set_tag", set_tag)
    patient.set_tag(run_id, "clsr.status", "running")
    assert client.get_run(run_id).data.tags["clsr.status"] == "running" and clock.sleeps == [1, 2]


@pytest.mark.parametrize("code", REFUSALS)
def test_a_refused_write_is_dropped_at_once_by_the_spool(store, tmp_path, monkeypatch, code):
    """The spool's thread used to retry PERMISSION_DENIED and RESOURCE_ALREADY_EXISTS until the trial
    ended (then hand them to the study's storage, replayed at every resume): now the same answer as
    the driver's, a warning and the next write."""
    uri, client, run_id = store
    real_send = spool_module.send

    def send(uri, run_id, entry, folder):
        if entry["op"] == "tags":
            raise refusal(code)
        real_send(uri, run_id, entry, folder)

    monkeypatch.setattr(spool_module, "send", send)
    monkeypatch.setattr(spool_module, "backoff_s", lambda attempt: pytest.fail("a refusal was retried"))
    spool = Spool(uri, run_id, tmp_path / "journal")
    spool.tags({"refused": "yes"})
    spool.params({"after": "it"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spool.start()
        assert spool.drain(60)
    assert any("refused for good" in str(w.message) for w in caught)
    assert spool.sent == 2 and client.get_run(run_id).data.params == {"after": "it"}
    spool.close(0, None)


def test_a_changed_param_is_dropped_by_the_spool_on_a_real_store(store, tmp_path):
    uri, client, run_id = store
    client.log_batch(run_id, params=[Param("p", "1")])
    spool = Spool(uri, run_id, tmp_path / "journal")
    spool.params({"p": "2"})
    spool.tags({"next": "sent"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spool.start()
        assert spool.drain(60)
    assert any("Changing param values is not allowed" in str(w.message) for w in caught)
    assert client.get_run(run_id).data.tags["next"] == "sent"
    spool.close(0, None)


def test_the_spool_retries_a_transient_error(store, tmp_path, monkeypatch):
    uri, client, run_id = store
    real_send = spool_module.send
    down = [requests.ConnectionError("down")] * 2

    def send(*args):
        if down:
            raise down.pop()
        real_send(*args)

    waits: list[int] = []
    monkeypatch.setattr(spool_module, "send", send)
    monkeypatch.setattr(spool_module, "backoff_s", lambda attempt: waits.append(attempt) or 0.01)
    spool = Spool(uri, run_id, tmp_path / "journal").start()
    spool.tags({"clsr.status": "finished"})
    assert spool.drain(60)
    assert waits == [0, 1] and client.get_run(run_id).data.tags["clsr.status"] == "finished"
    spool.close(0, None)


@pytest.mark.parametrize(
    ("code", "pending"), [("PERMISSION_DENIED", False), ("TEMPORARILY_UNAVAILABLE", True)]
)
def test_a_replayed_journal_waits_only_for_a_transient_error(store, tmp_path, monkeypatch, code, pending):
    """The driver's replay of what trials left: a refused write is skipped (its journal kept aside for a
    person), a transient one leaves the run pending for the next replay."""
    uri, client, run_id = store
    storage = str(tmp_path / "storage")
    hand_over([{"op": "tags", "tags": {"a": "b"}}], tmp_path, storage, run_id)

    def send(*args):
        raise MlflowException("no", error_code=ErrorCode.Value(code))

    monkeypatch.setattr(spool_module, "send", send)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert replay_pending(uri, storage) == (0, [run_id] if pending else [])
    assert (pending_runs(storage) == [run_id]) is pending
    kept = list(Path(storage).rglob("journal.kept.jsonl"))
    assert bool(kept) is not pending


# --- the end of a study waits for what trials kept, by the same policy ----------------------------------------


def test_the_end_of_a_study_replays_until_mlflow_takes_everything(clock, monkeypatch):
    import clsr.study.record.parent as record

    left = [2, 1, 0]
    monkeypatch.setattr(record, "replay", lambda uri, storage: left.pop(0))
    assert record.wait_for_tracking("sqlite:///x.db", "storage", wait_s=900) == 0
    assert clock.sleeps == [1, 2]


def test_the_end_of_a_study_stops_waiting_after_tracking_wait_s(clock, monkeypatch):
    import clsr.study.record.parent as record

    monkeypatch.setattr(record, "replay", lambda uri, storage: 3)
    assert record.wait_for_tracking("sqlite:///x.db", "storage", wait_s=10) == 3
    assert sum(clock.sleeps) == 10
