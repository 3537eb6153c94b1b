"""Bundles are releases in order: a validly signed bundle older than the one served (its
revision number not above) is refused, across restarts too, unless the operator allows a
rollback; an expired manifest is refused; an unnumbered (version 1) bundle is accepted only
while nothing numbered has been served."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kilo_rules import PolicyStore, StoreSettings
from kilo_rules.engine.formats.bundle import (
    MANIFEST,
    BundleError,
    Manifest,
    _bundle_members,
    _pack,
    build_bundle,
    directory_revision,
    generate_keypair,
    sign_bundle,
)

from ..hostile_server import running
from .helpers import SESSION, SONNET, BundleServer, marker_of, write_tree

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def keys() -> tuple[bytes, bytes]:
    return generate_keypair()


@pytest.fixture
def server() -> Iterator[BundleServer]:
    with running(BundleServer()) as srv:
        yield srv


def release(tmp: Path, marker: str, number: int, private: bytes, **kw: object) -> Path:
    """A signed bundle of a tree marked ``marker`` with revision number ``number``."""
    tree = tmp / f"tree-{marker}-{number}"
    write_tree(tree, marker)
    out = tmp / f"{marker}-{number}.tar.gz"
    build_bundle(tree, out, revision_number=number, **kw)  # type: ignore[arg-type]
    sign_bundle(out, private)
    return out


def hand_signed(tmp: Path, marker: str, private: bytes, **manifest: object) -> Path:
    """A bundle signed here rather than by sign_bundle, which refuses to write either kind
    made here: an unnumbered (version 1) manifest, as releases were made before revision
    numbers (no ``manifest`` given), or an expired one (``revision_number`` and
    ``expires_at`` given)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    tree = tmp / f"tree-{marker}-hand"
    write_tree(tree, marker)
    files = {p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*.*")}
    content = directory_revision(tree)
    version = 2 if manifest else 1
    raw = Manifest(version, content.revision, content.files, **manifest).dumps()  # type: ignore[arg-type]
    key = load_pem_private_key(private, password=None)
    assert isinstance(key, Ed25519PrivateKey)
    signature = base64.b64encode(key.sign(raw)) + b"\n"
    out = tmp / f"{marker}-hand.tar.gz"
    out.write_bytes(_pack(_bundle_members(raw, signature, files)))
    return out


def serve(at: Path, bundle: Path) -> None:
    """Put ``bundle`` where the store reads it (a new file: a new inode and mtime)."""
    tmp = at.with_suffix(".new")
    shutil.copyfile(bundle, tmp)
    tmp.replace(at)


def test_an_older_signed_bundle_replayed_is_refused(
    tmp_path: Path, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    old, new = release(tmp_path, "A", 10, private), release(tmp_path, "B", 11, private)
    at = tmp_path / "live.tar.gz"
    serve(at, old)
    settings = StoreSettings(cache_dir=tmp_path / "cache")
    with PolicyStore.from_bundle(at, public_key=public, settings=settings) as store:
        serve(at, new)
        assert store.reload().swapped
        b = store.revision
        serve(at, old)  # validly signed, and older
        result = store.reload()
        assert result.rejected and not result.swapped and store.revision == b
        [error] = result.errors
        assert error.code == "bundle.rollback"
        assert "10 is older than 11" in error.message
        assert error.location.file == f"{at}!/{MANIFEST}"
        assert error.location.line == 4  # "revision_number": 10
        assert error.details["served_revision"] == b
        assert result.reason.startswith("rejected: ") and "older than 11" in result.reason
        assert marker_of(store.apply(SESSION, SONNET).body()) == "B"
        assert store.stats().rejected == 1


def test_a_restart_followed_by_an_old_bundle_is_refused(
    tmp_path: Path, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    old, new = release(tmp_path, "A", 10, private), release(tmp_path, "B", 11, private)
    at = tmp_path / "live.tar.gz"
    settings = StoreSettings(cache_dir=tmp_path / "cache")
    serve(at, new)
    with PolicyStore.from_bundle(at, public_key=public, settings=settings) as store:
        served = store.revision
    [record] = (tmp_path / "cache").glob("*.served.json")
    assert json.loads(record.read_text()) == {
        "source": str(at),
        "revision": served,
        "revision_number": 11,
    }
    assert [p.name for p in record.parent.iterdir() if p.name.startswith(".")] == []
    serve(at, old)
    with PolicyStore.from_bundle(at, public_key=public, settings=settings) as store:
        assert store.revision == ""  # nothing older is served, even with nothing to serve
        assert "older than 11" in (store.stats().last_error or "")
    serve(at, new)  # the release served before the restart is that release again
    with PolicyStore.from_bundle(at, public_key=public, settings=settings) as store:
        assert store.revision == served


def test_the_same_number_for_other_files_is_refused(
    tmp_path: Path, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    at = tmp_path / "live.tar.gz"
    serve(at, release(tmp_path, "A", 10, private))
    with PolicyStore.from_bundle(at, public_key=public) as store:
        serve(at, release(tmp_path, "B", 10, private))
        result = store.reload()
        assert result.rejected
        assert "already names" in result.errors[0].message


def test_an_operator_may_roll_back_on_purpose(tmp_path: Path, keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    old, new = release(tmp_path, "A", 10, private), release(tmp_path, "B", 11, private)
    at = tmp_path / "live.tar.gz"
    serve(at, new)
    settings = StoreSettings(cache_dir=tmp_path / "cache", allow_rollback=True)
    with PolicyStore.from_bundle(at, public_key=public, settings=settings) as store:
        serve(at, old)
        assert store.reload().swapped
        assert marker_of(store.apply(SESSION, SONNET).body()) == "A"
    # The release rolled back to is now the one served: a restart without the setting
    # starts from it, and refuses what lies between.
    plain = StoreSettings(cache_dir=tmp_path / "cache")
    with PolicyStore.from_bundle(at, public_key=public, settings=plain) as store:
        assert marker_of(store.apply(SESSION, SONNET).body()) == "A"


def test_the_setting_reads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILO_RULES_STORE_ALLOW_ROLLBACK", "true")
    assert StoreSettings().allow_rollback is True
    monkeypatch.delenv("KILO_RULES_STORE_ALLOW_ROLLBACK")
    assert StoreSettings().allow_rollback is False


def test_an_unnumbered_bundle_is_accepted_only_before_a_numbered_one(
    tmp_path: Path, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    legacy = hand_signed(tmp_path, "L", private)
    at = tmp_path / "live.tar.gz"
    serve(at, legacy)
    with PolicyStore.from_bundle(at, public_key=public) as store:
        assert marker_of(store.apply(SESSION, SONNET).body()) == "L"
        serve(at, hand_signed(tmp_path, "M", private))
        assert store.reload().swapped  # unnumbered after unnumbered: as before
        serve(at, release(tmp_path, "A", 1, private))
        assert store.reload().swapped
        serve(at, legacy)
        result = store.reload()
        assert result.rejected
        assert result.errors[0].code == "bundle.rollback"
        assert "has no revision number" in result.errors[0].message


def test_an_expired_manifest_is_refused(tmp_path: Path, keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    at = tmp_path / "live.tar.gz"
    serve(at, release(tmp_path, "A", 1, private))
    with PolicyStore.from_bundle(at, public_key=public) as store:
        good = store.revision
        # Signed while it was valid (until 2001); replayed long after.
        tree = tmp_path / "tree-old"
        write_tree(tree, "B")
        stale = tmp_path / "stale.tar.gz"
        build_bundle(tree, stale, revision_number=5, expires_at=datetime(2001, 1, 1, tzinfo=UTC))
        with pytest.raises(BundleError) as info:
            sign_bundle(stale, private)  # an expired manifest is not signed again
        assert info.value.diagnostic.code == "bundle.expired"
        stale = hand_signed(
            tmp_path, "B", private, revision_number=5, expires_at=datetime(2001, 1, 1, tzinfo=UTC)
        )
        serve(at, stale)
        result = store.reload()
        assert result.rejected and store.revision == good
        [error] = result.errors
        assert error.code == "bundle.expired"
        assert error.location.file == f"{at}!/{MANIFEST}" and error.location.line == 5
        assert error.details["expires_at"] == "2001-01-01T00:00:00Z"


def test_an_old_bundle_from_the_server_is_refused_and_the_cache_serves(
    tmp_path: Path, server: BundleServer, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    old = release(tmp_path, "A", 10, private).read_bytes()
    new = release(tmp_path, "B", 11, private).read_bytes()
    cache = tmp_path / "cache"
    local = StoreSettings(allow_private=True)
    server.publish(old)
    with PolicyStore.from_url(
        server.url, cache_dir=cache, public_key=public, settings=local
    ) as store:
        server.publish(new)
        assert store.reload().swapped
        served = store.revision
        server.publish(old)  # a replay by whoever answers for the server
        result = store.reload()
        assert result.rejected and result.errors[0].code == "bundle.rollback"
        assert result.errors[0].location.file == f"{server.url}!/{MANIFEST}"
        assert store.revision == served
    # A restart while the server still replays the old one: refused, and the last good
    # bundle (the same release as the record) serves.
    with PolicyStore.from_url(
        server.url, cache_dir=cache, public_key=public, settings=local
    ) as store:
        assert store.revision == served
        assert marker_of(store.apply(SESSION, SONNET).body()) == "B"
