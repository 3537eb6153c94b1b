"""PolicyStore over a bundle file: verified (and its signature checked when a key is set)
before anything in it is checked or served."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

import kilo_rules.tools.serving.store as store_module
from kilo_rules import PolicyStore, StoreError, StoreSettings
from kilo_rules.engine.formats.bundle import build_bundle, generate_keypair, sign_bundle

from ..runtime.helpers import model
from .helpers import RELEASES, SESSION, marker_of, wait_for, write_tree


@pytest.fixture(scope="module")
def keys() -> tuple[bytes, bytes]:
    return generate_keypair()


def make_bundle(tmp: Path, marker: str, name: str, key: bytes | None = None) -> Path:
    tree = tmp / f"tree-{name}"
    write_tree(tree, marker)
    out = tmp / f"{name}.tar.gz"
    build_bundle(tree, out, revision_number=next(RELEASES))
    if key is not None:
        sign_bundle(out, key)
    return out


def tamper(bundle: Path, old: str, new: str) -> None:
    """Change a file's bytes inside the tarball, leaving its manifest as it was."""
    tar = gzip.decompress(bundle.read_bytes())
    assert len(old) == len(new) and tar.count(old.encode()) == 1
    bundle.write_bytes(gzip.compress(tar.replace(old.encode(), new.encode())))


def test_a_bundle_is_served_under_its_manifest_revision(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    write_tree(tree, "A")
    out = tmp_path / "team.tar.gz"
    manifest = build_bundle(tree, out)
    with PolicyStore.from_bundle(out) as store:
        assert store.revision == manifest.revision
        result = store.apply(SESSION, model())
        assert result.revision == manifest.revision
        assert marker_of(result.body()) == "A"


def test_a_signed_bundle_passes_with_its_key(tmp_path: Path, keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    bundle = make_bundle(tmp_path, "A", "signed", private)
    with PolicyStore.from_bundle(bundle, public_key=public) as store:
        assert marker_of(store.apply(SESSION, model()).body()) == "A"


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("unsigned", "bundle.unsigned"),
        ("tampered", "bundle.digest"),
        ("other-key", "bundle.signature"),
    ],
)
def test_a_bundle_that_fails_verification_is_refused(
    tmp_path: Path, keys: tuple[bytes, bytes], kind: str, code: str
) -> None:
    private, public = keys
    if kind == "unsigned":
        bundle = make_bundle(tmp_path, "A", kind)
    elif kind == "tampered":
        bundle = make_bundle(tmp_path, "A", kind, private)
        tamper(bundle, "MARKER<A>", "MARKER<Z>")
    else:
        bundle = make_bundle(tmp_path, "A", kind, generate_keypair()[0])
    with PolicyStore.from_bundle(bundle, public_key=public) as store:
        assert store.revision == ""
        stats = store.stats()
        assert stats.rejected == 1
        assert (stats.last_error or "").startswith("rejected: ")
        with pytest.raises(StoreError) as info:
            store.plan_for(model())
        assert info.value.diagnostic.code == "store.not-ready"
        result = store.reload()
        assert [d.code for d in result.errors] == [code]
        assert result.errors[0].location.file.startswith(str(bundle))


def test_a_tampered_replacement_keeps_the_good_bundle_serving(
    tmp_path: Path, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    good = make_bundle(tmp_path, "A", "good", private)
    served = tmp_path / "served.tar.gz"
    served.write_bytes(good.read_bytes())
    with PolicyStore.from_bundle(served, public_key=public) as store:
        first = store.revision
        bad = make_bundle(tmp_path, "B", "bad", private)
        tamper(bad, "MARKER<B>", "MARKER<X>")
        served.write_bytes(bad.read_bytes())
        result = store.reload()
        assert result.rejected and [d.code for d in result.errors] == ["bundle.digest"]
        assert store.revision == first
        assert marker_of(store.apply(SESSION, model()).body()) == "A"

        served.write_bytes(make_bundle(tmp_path, "C", "next", private).read_bytes())
        assert store.reload().swapped
        assert marker_of(store.apply(SESSION, model()).body()) == "C"


def test_an_unchanged_bundle_file_is_not_extracted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = make_bundle(tmp_path, "A", "one")
    extracted: list[Path] = []
    real = store_module.extract_bundle

    def counted(path: Path, dest: Path, key: bytes | None = None) -> object:
        extracted.append(path)
        return real(path, dest, key)

    monkeypatch.setattr(store_module, "extract_bundle", counted)
    with PolicyStore.from_bundle(bundle) as store:
        assert store.reload().reason == "unchanged"
        assert len(extracted) == 1
        # The same bytes under a new file: extracted, and still the same revision.
        bundle.write_bytes(bundle.read_bytes())
        assert store.reload().reason == "unchanged"
        assert len(extracted) == 2


def test_settings_name_the_bundle_and_its_key(tmp_path: Path, keys: tuple[bytes, bytes]) -> None:
    private, public = keys
    key_file = tmp_path / "public.pem"
    key_file.write_bytes(public)
    signed = make_bundle(tmp_path, "A", "signed", private)
    with PolicyStore.from_settings(StoreSettings(bundle=signed, public_key=key_file)) as store:
        assert store.revision
    unsigned = make_bundle(tmp_path, "A", "plain")
    with PolicyStore.from_settings(StoreSettings(bundle=unsigned, public_key=key_file)) as store:
        assert store.revision == ""
    with pytest.raises(StoreError) as info:
        PolicyStore.from_settings(StoreSettings(bundle=signed, public_key=tmp_path / "none"))
    assert info.value.diagnostic.code == "store.public-key"


def test_a_polled_bundle_file_is_reloaded_when_replaced(tmp_path: Path) -> None:
    served = tmp_path / "served.tar.gz"
    served.write_bytes(make_bundle(tmp_path, "A", "a").read_bytes())
    settings = StoreSettings(poll_seconds=0.02, poll_max_seconds=0.1)
    with PolicyStore.from_bundle(served, settings=settings) as store:
        store.start()
        first = store.revision
        served.write_bytes(make_bundle(tmp_path, "B", "b").read_bytes())
        wait_for(lambda: store.revision != first)
        assert marker_of(store.apply(SESSION, model()).body()) == "B"
