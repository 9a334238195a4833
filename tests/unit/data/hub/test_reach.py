"""An unreachable hub is found with one connection and the process works from the local cache at once,
instead of after the libraries' retries (issue 35, item 1)."""

from __future__ import annotations

import socket
import sys

import pytest

from clsr.cluster.ports import free_port
from clsr.data.hub import reach as hub_reach
from clsr.data.hub.model_registry import model_source_problem
from clsr.data.sources import DataUnavailableError, load_from_hub


@pytest.fixture
def online(monkeypatch):
    """As a user without HF_HUB_OFFLINE: no offline flags, no proxy, a fresh answer, flags restored."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", *hub_reach.PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.delenv(hub_reach.SWITCHED_ENV, raising=False)
    hub_reach.hub_unreachable.cache_clear()
    yield monkeypatch
    hub_reach.hub_unreachable.cache_clear()


def refused_endpoint(monkeypatch) -> int:
    port = free_port()  # nothing listens there: the connection is refused at once
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    return port


def test_no_route_to_the_hub_switches_to_the_local_cache_once(online, capsys):
    import datasets.config
    import huggingface_hub.constants

    port = refused_endpoint(online)
    why = hub_reach.go_offline_if_unreachable()
    assert why is not None and why.startswith(f"127.0.0.1:{port}: ")
    assert hub_reach.switched_offline() == why
    assert huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE
    assert sys.modules["os"].environ["HF_HUB_OFFLINE"] == "1"  # Ray workers started later inherit it
    assert sys.modules["os"].environ[hub_reach.SWITCHED_ENV] == why  # and why, with it
    assert capsys.readouterr().err.count("working from the local cache only") == 1
    assert hub_reach.go_offline_if_unreachable() is None  # said once
    assert capsys.readouterr().err == ""


def test_a_listening_hub_or_a_proxy_leaves_the_libraries_alone(online):
    with socket.create_server(("127.0.0.1", 0)) as server:
        online.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_reach.go_offline_if_unreachable() is None
    hub_reach.hub_unreachable.cache_clear()
    refused_endpoint(online)
    online.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # the proxy decides, not a direct connection
    assert hub_reach.go_offline_if_unreachable() is None
    assert hub_reach.switched_offline() is None


def test_a_data_set_from_an_unreachable_hub_fails_with_the_local_file_to_provide(online, capsys):
    refused_endpoint(online)
    with pytest.raises(DataUnavailableError, match=r"provide <data_dir>/stsbenchmark/sts-dev.csv"):
        load_from_hub("mteb/stsbenchmark-sts", local_hint="stsbenchmark/sts-dev.csv", split="validation")
    assert "cannot be reached" in capsys.readouterr().err


def test_a_hub_model_outside_the_cache_is_unavailable_when_the_hub_cannot_be_reached(online, tmp_path):
    refused_endpoint(online)
    online.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    problem, unavailable = model_source_problem("princeton-nlp/unsup-simcse-bert-base-uncased")
    assert problem is None
    assert unavailable is not None
    assert "not in the local Hugging Face cache, and the hub cannot be reached from here" in unavailable
