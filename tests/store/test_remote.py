"""PolicyStore over a bundle URL, against a real HTTP server on 127.0.0.1: ETags and 304,
failures and backoff, and a cold start from the last good bundle while the server is down."""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kilo_rules import PolicyStore, StoreError, StoreSettings
from kilo_rules.engine.base.net import NetworkSettings
from kilo_rules.engine.formats.bundle import build_bundle, generate_keypair, sign_bundle
from kilo_rules.tools.serving.store import backoff_delay

from ..hostile_server import running
from ..runtime.helpers import model
from .helpers import (
    RELEASES,
    SESSION,
    SONNET,
    BundleServer,
    Compiles,
    compiles,
    marker_of,
    wait_for,
    write_tree,
)

__all__ = ["compiles"]  # the fixture, imported for pytest

LOCAL = StoreSettings(allow_private=True, poll_seconds=0.02, poll_max_seconds=0.2)


@pytest.fixture
def server() -> Iterator[BundleServer]:
    with running(BundleServer()) as srv:
        yield srv


def bundle_bytes(tmp: Path, marker: str, key: bytes | None = None) -> bytes:
    tree = tmp / f"tree-{marker}"
    write_tree(tree, marker)
    out = tmp / f"{marker}.tar.gz"
    build_bundle(tree, out, revision_number=next(RELEASES))
    if key is not None:
        sign_bundle(out, key)
    return out.read_bytes()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/team.tar.gz"


def test_a_304_costs_no_download_and_no_compile(
    tmp_path: Path, server: BundleServer, compiles: Compiles
) -> None:
    server.publish(bundle_bytes(tmp_path, "A"))
    cache = tmp_path / "cache"
    with PolicyStore.from_url(server.url, cache_dir=cache, settings=LOCAL) as store:
        assert store.revision and server.statuses == [200]
        assert server.seen == [None]  # nothing cached yet: no ETag to send
        assert marker_of(store.apply(SESSION, SONNET).body()) == "A"
        assert compiles.count == 2  # the routed policy's first model, and the one asked for

        result = store.reload()
        assert result.reason == "not modified (304)" and not result.swapped
        assert server.seen[-1] == server.etag and server.statuses[-1] == 304
        assert compiles.count == 2
        assert store.stats().last_error is None

        server.publish(bundle_bytes(tmp_path, "B"))
        result = store.reload()
        assert result.swapped and server.statuses[-1] == 200
        assert compiles.count == 4  # both again, before the swap
        assert marker_of(store.apply(SESSION, SONNET).body()) == "B"

        # The last good bundle and its ETag are kept for a cold start.
        kept = {p.suffix: p for p in cache.iterdir() if not p.name.endswith(".served.json")}
        assert kept[".gz"].read_bytes() == server.body
        meta = json.loads(kept[".json"].read_text())
        assert meta == {"url": server.url, "etag": server.etag, "revision": store.revision}
        # Beside them, the revision number served, which an older bundle must exceed.
        [served] = cache.glob("*.served.json")
        record = json.loads(served.read_text())
        assert record["source"] == server.url and record["revision"] == store.revision
        assert record["revision_number"] > 0


def test_a_failing_server_backs_off_then_recovers(tmp_path: Path, server: BundleServer) -> None:
    server.publish(bundle_bytes(tmp_path, "A"))
    settings = StoreSettings(allow_private=True, poll_seconds=1.0, poll_max_seconds=5.0)
    with PolicyStore.from_url(server.url, cache_dir=tmp_path / "c", settings=settings) as store:
        good = store.revision
        assert store.next_delay() == 1.0
        server.fail = 3
        for failures in (1, 2, 3):
            delay = store.poll_once()
            assert 0.0 <= delay <= min(5.0, 2.0**failures)
            assert store.revision == good  # still serving
            stats = store.stats()
            assert stats.unavailable == failures
            assert (stats.last_error or "").startswith("source unavailable: ")
            assert "HTTP 500" in (stats.last_error or "")
        server.publish(bundle_bytes(tmp_path, "B"))
        assert store.poll_once() == 1.0  # answered: back to the normal interval
        assert store.revision != good and store.stats().last_error is None
        assert marker_of(store.apply(SESSION, model()).body()) == "B"


def test_backoff_is_exponential_with_full_jitter() -> None:
    class Top(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    top = Top()
    assert backoff_delay(0, 10.0, 300.0, top) == 10.0
    assert [backoff_delay(n, 10.0, 300.0, top) for n in (1, 2, 3, 4, 5, 6)] == [
        20.0,
        40.0,
        80.0,
        160.0,
        300.0,
        300.0,
    ]
    rng = random.Random(7)
    draws = [backoff_delay(3, 10.0, 300.0, rng) for _ in range(200)]
    assert all(0.0 <= d <= 80.0 for d in draws)
    assert min(draws) < 20.0 < 60.0 < max(draws)  # spread over the whole range


def test_the_poller_recovers_after_failures(tmp_path: Path, server: BundleServer) -> None:
    server.publish(bundle_bytes(tmp_path, "A"))
    with PolicyStore.from_url(
        server.url, cache_dir=tmp_path / "c", settings=LOCAL, poll=True
    ) as store:
        first = store.revision
        server.fail = 3
        wait_for(lambda: server.fail == 0)
        server.publish(bundle_bytes(tmp_path, "B"))
        wait_for(lambda: store.revision != first)
        assert store.stats().unavailable >= 3
        assert marker_of(store.apply(SESSION, model()).body()) == "B"
        wait_for(lambda: server.statuses[-1] == 304)  # polling on, with the new ETag


def test_a_cold_start_uses_the_last_good_bundle_while_the_server_is_down(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    with running(BundleServer()) as srv:
        srv.publish(bundle_bytes(tmp_path, "A"))
        url = srv.url
        with PolicyStore.from_url(url, cache_dir=cache, settings=LOCAL) as store:
            good = store.revision
    # The server is gone now.
    with PolicyStore.from_url(url, cache_dir=cache, settings=LOCAL) as store:
        assert store.revision == good
        assert marker_of(store.apply(SESSION, model()).body()) == "A"
        stats = store.stats()
        assert stats.unavailable == 1 and stats.last_error is None
        assert store.next_delay() <= 2 * LOCAL.poll_seconds  # backing off meanwhile


def test_a_cold_start_sends_the_cached_etag(tmp_path: Path, server: BundleServer) -> None:
    server.publish(bundle_bytes(tmp_path, "A"))
    cache = tmp_path / "cache"
    with PolicyStore.from_url(server.url, cache_dir=cache, settings=LOCAL) as store:
        good = store.revision
    with PolicyStore.from_url(server.url, cache_dir=cache, settings=LOCAL) as store:
        assert server.seen[-1] == server.etag and server.statuses[-1] == 304
        assert store.revision == good
        assert store.stats().unavailable == 0


def test_no_cache_and_no_server_serves_nothing(tmp_path: Path) -> None:
    with PolicyStore.from_url(
        closed_port_url(), cache_dir=tmp_path / "empty", settings=LOCAL
    ) as store:
        assert store.revision == ""
        with pytest.raises(StoreError) as info:
            store.plan_for(model())
        assert info.value.diagnostic.code == "store.not-ready"
        assert "source unavailable" in info.value.diagnostic.message


def test_the_cached_bundle_is_verified_again(tmp_path: Path) -> None:
    private, public = generate_keypair()
    cache = tmp_path / "cache"
    with running(BundleServer()) as srv:
        srv.publish(bundle_bytes(tmp_path, "A", private))
        url = srv.url
        with PolicyStore.from_url(url, cache_dir=cache, public_key=public, settings=LOCAL) as s:
            assert s.revision
    (cached,) = cache.glob("*.tar.gz")
    cached.write_bytes(bundle_bytes(tmp_path, "Z"))  # unsigned, written by someone else
    with PolicyStore.from_url(url, cache_dir=cache, public_key=public, settings=LOCAL) as store:
        assert store.revision == ""
        assert store.stats().rejected == 1
        assert "manifest.sig" in (store.stats().last_error or "")


def test_a_rejected_remote_bundle_is_not_fetched_again(
    tmp_path: Path, server: BundleServer
) -> None:
    private, public = generate_keypair()
    server.publish(bundle_bytes(tmp_path, "A", private))
    with PolicyStore.from_url(
        server.url, cache_dir=tmp_path / "c", public_key=public, settings=LOCAL
    ) as store:
        good = store.revision
        server.publish(bundle_bytes(tmp_path, "B"))  # unsigned
        result = store.reload()
        assert result.rejected and [d.code for d in result.errors] == ["bundle.unsigned"]
        assert result.errors[0].location.file == server.url
        assert store.reload().reason == "not modified (304)"
        assert store.stats().rejected == 1
        assert store.revision == good


def test_the_network_policy_applies(tmp_path: Path, server: BundleServer) -> None:
    server.publish(bundle_bytes(tmp_path, "A"))
    refused = StoreSettings(poll_seconds=0.02, poll_max_seconds=0.2)  # no allow_private
    with PolicyStore.from_url(server.url, cache_dir=tmp_path / "c", settings=refused) as store:
        assert store.revision == ""
        assert "non-public address" in (store.stats().last_error or "")
    assert server.statuses == []
    network = NetworkSettings(private_hosts=("127.0.0.1",))
    with PolicyStore.from_url(
        server.url, cache_dir=tmp_path / "c", settings=refused, network=network
    ) as store:
        assert store.revision
