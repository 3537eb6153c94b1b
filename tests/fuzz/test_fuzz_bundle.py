"""Bundles made of hostile bytes: random bytes, a real bundle's tar headers mutated (with
their checksums mended, so the mutation reaches the checks past them), mutated manifests,
and random members of every tar type under random names. Manifests are mutated in both
versions: 1 (unnumbered) and 2 (a revision number and an expiry, which a store trusts to
refuse a rollback, so a mutated one must never read as another valid value).

``verify_bundle`` and ``extract_bundle`` end in a manifest or a ``BundleError`` located at
the bundle, never anything else; a refused bundle writes nothing, and an accepted one
writes exactly its manifest's files under the destination and nothing beside it."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from hypothesis import given
from hypothesis import strategies as st

from kilo_rules.engine.formats.bundle import (
    MANIFEST,
    SIGNATURE,
    BundleError,
    Manifest,
    directory_revision,
    extract_bundle,
    generate_keypair,
    revision_of,
    verify_bundle,
)
from tests.fuzz.budget import FUZZ
from tests.fuzz.mutate import dumps, mutated

PRIVATE, PUBLIC = generate_keypair()
FILES = {
    "p.yaml": b"version: 1\nname: p\n",
    "prompts/agent.md": b"You are careful.\n",
    "routes.yaml": b"routes: []\n",
}


#: Far enough ahead that no run of the fuzzer sees it expire.
EXPIRES = datetime(2999, 1, 1, tzinfo=UTC)


def _manifest(files: dict[str, bytes], version: int = 2) -> Manifest:
    digests = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
    if version == 1:
        return Manifest(1, revision_of(digests), digests)
    return Manifest(2, revision_of(digests), digests, 41, EXPIRES)


MANIFEST_DOC: dict[str, Any] = _manifest(FILES).to_json()
MANIFEST_V1_DOC: dict[str, Any] = _manifest(FILES, 1).to_json()


def _header(name: bytes, size: int, kind: bytes = b"0", magic: bytes = b"ustar\x0000") -> bytes:
    """A ustar header, written here rather than by the code under test."""
    prefix = b""
    if len(name) > 100 and b"/" in name[-101:]:
        cut = name.rindex(b"/", len(name) - 101)
        prefix, name = name[:cut], name[cut + 1 :]
    h = bytearray(512)
    h[0:100] = name[:100].ljust(100, b"\0")
    h[100:108] = b"0000644\0"
    h[108:124] = b"0000000\0" * 2
    h[124:136] = f"{size:011o}".encode()[-11:] + b"\0"
    h[136:148] = b"00000000000\0"
    h[156:157] = kind[:1]
    h[257:265] = magic
    h[345:500] = prefix[:155].ljust(155, b"\0")
    return _mend(bytes(h))


def _mend(header: bytes) -> bytes:
    """``header`` with its checksum made right again."""
    h = bytearray(header[:512].ljust(512, b"\0"))
    h[148:156] = b" " * 8
    h[148:156] = f"{sum(h):06o}".encode() + b"\0 "
    return bytes(h)


def _tar(members: list[tuple[bytes, bytes, bytes]]) -> bytes:
    out = bytearray()
    for name, data, kind in members:
        out += _header(name, len(data), kind) + data + bytes(-len(data) % 512)
    return bytes(out + bytes(1024))


def _signed_tar(manifest: bytes, files: dict[str, bytes]) -> bytes:
    key = load_pem_private_key(PRIVATE, password=None)
    assert isinstance(key, Ed25519PrivateKey)
    signature = base64.b64encode(key.sign(manifest))
    members = [(MANIFEST.encode(), manifest, b"0"), (SIGNATURE.encode(), signature, b"0")]
    members += [(p.encode(), d, b"0") for p, d in files.items()]
    return _tar(members)


BASE_TAR = _signed_tar(_manifest(FILES).dumps(), FILES)


def check(data: bytes) -> None:
    """Verify and extract ``data`` as a bundle; assert a typed, located outcome and that
    nothing is written where it should not be."""
    with tempfile.TemporaryDirectory() as tmp:
        box = Path(tmp)
        bundle = box / "b.tar.gz"
        bundle.write_bytes(data)
        for key in (None, PUBLIC):
            try:
                verify_bundle(bundle, key)
            except BundleError as exc:
                for diag in exc.diagnostics:
                    assert diag.code.startswith("bundle."), diag
                    assert diag.location.file.startswith(str(bundle)), diag
        dest = box / "out" / "dest"
        try:
            manifest = extract_bundle(bundle, dest)
        except BundleError as exc:
            assert all(d.location.file.startswith(str(bundle)) for d in exc.diagnostics)
            assert sorted(p.name for p in box.iterdir()) == ["b.tar.gz"]
            return
        written = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if not p.is_dir())
        assert written == sorted(manifest.files)
        assert directory_revision(dest).revision == manifest.revision
        # What was accepted is what a manifest may say, whatever the mutation made of it.
        assert manifest.version in (1, 2)
        assert (manifest.revision_number == 0) == (manifest.version == 1)
        assert manifest.expires_at is None or manifest.expires_at.tzinfo is not None
        assert sorted(p.name for p in box.iterdir()) == ["b.tar.gz", "out"]
        assert [p.name for p in (box / "out").iterdir()] == ["dest"]


# ---------------------------------------------------------------- random bytes


@pytest.mark.slow
@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=2048),
        st.binary(max_size=2048).map(lambda b: b"\x1f\x8b\x08\x00" + b),
        st.binary(max_size=4096).map(lambda b: gzip.compress(b, mtime=0)),
    )
)
def test_random_bytes(data: bytes) -> None:
    check(data)


# ---------------------------------------------------------------- mutated tar headers

# Offsets in a header worth hitting: name, mode, size, checksum, type, link name, magic,
# version, prefix.
_HOT = [0, 1, 50, 99, 100, 124, 130, 134, 135, 148, 155, 156, 157, 257, 262, 263, 345, 400]
_BYTES = [0, 0x20, 0x2E, 0x2F, 0x30, 0x31, 0x32, 0x35, 0x37, 0x78, 0x4C, 0x5C, 0x80, 0xFF]


@st.composite
def mutated_tar(draw: st.DrawFn) -> bytes:
    tar = bytearray(BASE_TAR)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        headers = [i for i in range(0, len(tar) - 511, 512) if tar[i + 257 : i + 262] == b"ustar"]
        if not headers:
            break
        op = draw(st.sampled_from(["byte", "byte", "field", "cut", "copy", "zero", "drop"]))
        block = draw(st.sampled_from(headers))
        if op == "byte":
            at = block + draw(st.sampled_from(_HOT) | st.integers(0, 511))
            tar[at] = draw(st.sampled_from(_BYTES) | st.integers(0, 255))
        elif op == "field":
            # A size or a name written whole: huge, negative-looking, traversing, linked.
            at, value = draw(
                st.sampled_from(
                    [
                        (124, b"77777777777\0"),
                        (124, b"\x80" + bytes(10) + b"\x01"),
                        (124, b"\xff" * 12),
                        (124, b"00000001000\0"),
                        (0, b"../evil\0"),
                        (0, b"/abs\0"),
                        (0, b"a/../../b\0"),
                        (0, b".hidden\0"),
                        (0, b"P.YAML\0"),
                        (0, b"p.yaml\0"),
                        (0, b"routes.yaml/x\0"),
                        (0, b"\xc3\x28\0"),
                        (157, b"/etc/passwd\0"),
                        (345, b"..\0"),
                    ]
                )
            )
            tar[block + at : block + at + len(value)] = value
        elif op == "cut":
            del tar[draw(st.integers(0, len(tar))) :]
        elif op == "copy":
            size = draw(st.sampled_from([512, 1024, 1536]))
            tar[block:block] = tar[block : block + size]
        elif op == "zero":
            tar[block : block + 512] = bytes(512)
        elif op == "drop":
            del tar[block : block + 512]
    if draw(st.sampled_from([True, True, True, False])):
        for i in range(0, len(tar) - 511, 512):
            if tar[i + 257 : i + 262] == b"ustar":
                tar[i : i + 512] = _mend(bytes(tar[i : i + 512]))
    return gzip.compress(bytes(tar), mtime=0)


@pytest.mark.slow
@FUZZ
@given(data=mutated_tar())
def test_mutated_tar_headers(data: bytes) -> None:
    check(data)


# ---------------------------------------------------------------- mutated manifests


_NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 10**400, True, 1.0, "41", None]),
)
_TIMES = st.one_of(
    st.text(alphabet="0123456789-:TZ.+ ", max_size=30),
    st.sampled_from(
        [
            "2999-01-01T00:00:00Z",
            "2999-01-01T00:00:00.123456Z",
            "2999-01-01T00:00:00.1234567Z",
            "2999-01-01T00:00:00+00:00",
            "2999-02-30T00:00:00Z",
            "2999-01-01 00:00:00Z",
            "2000-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
            "0000-01-01T00:00:00Z",
            "",
        ]
    ),
    st.integers(),
    st.none(),
)


@st.composite
def numbered_manifests(draw: st.DrawFn) -> dict[str, Any]:
    """A version 2 manifest whose number and expiry are anything JSON can say."""
    doc = dict(MANIFEST_DOC)
    doc["revision_number"] = draw(_NUMBERS)
    if draw(st.booleans()):
        doc["expires_at"] = draw(_TIMES)
    else:
        doc.pop("expires_at")
    doc["version"] = draw(st.sampled_from([2, 2, 1, 3]))
    return doc


@pytest.mark.slow
@FUZZ
@given(
    doc=st.one_of(mutated(MANIFEST_DOC), mutated(MANIFEST_V1_DOC), numbered_manifests()),
    signed=st.booleans(),
    indent=st.sampled_from([None, 2]),
)
def test_mutated_manifests(doc: Any, signed: bool, indent: int | None) -> None:
    raw = dumps(doc, indent=indent).encode("utf-8")
    if signed:
        tar = _signed_tar(raw, FILES)
    else:
        tar = _tar(
            [(MANIFEST.encode(), raw, b"0")] + [(p.encode(), d, b"0") for p, d in FILES.items()]
        )
    check(gzip.compress(tar, mtime=0))


# ---------------------------------------------------------------- random members

_VALID_NAME = st.from_regex(r"[a-zA-Z\u00e9]{1,6}(/[a-z]{1,6}){0,2}\.(yaml|md)", fullmatch=True)
_NAMES = st.one_of(
    _VALID_NAME,
    _VALID_NAME,
    st.sampled_from(
        [
            "p.yaml",
            "P.yaml",
            "a",
            "a/b",
            "a/b/c.md",
            "../x",
            "./x",
            "/x",
            "a//b",
            "a/",
            ".x",
            "a/.x",
            "..",
            "x\\y",
            "é.md",
            "e\u0301.md",
            MANIFEST,
            SIGNATURE,
            "prompts/" + "d" * 100 + ".md",
            "n" * 120,
        ]
    ),
    st.text(alphabet="ab./\\\x00\n\u00e9A", max_size=12),
)
# Mostly regular files, so that a list of members often gets past its first one.
_KINDS = st.sampled_from(
    [b"0"] * 10 + [b"\0", b"1", b"2", b"3", b"5", b"6", b"7", b"x", b"L", b"Z"]
)


@pytest.mark.slow
@FUZZ
@given(
    members=st.lists(st.tuples(_NAMES, st.binary(max_size=40), _KINDS), min_size=0, max_size=6),
    listed=st.booleans(),
)
def test_random_members(members: list[tuple[str, bytes, bytes]], listed: bool) -> None:
    files = {n: d for n, d, k in members if k in (b"0", b"\0")}
    # With ``listed``, the manifest lists exactly the regular members, so that a bundle of
    # odd but acceptable names gets through to extraction.
    manifest = _manifest(files if listed else FILES).dumps()
    entries = [(MANIFEST.encode(), manifest, b"0")]
    entries += [(n.encode("utf-8", "surrogatepass"), d, k) for n, d, k in members]
    check(gzip.compress(_tar(entries), mtime=0))


def test_the_base_bundle_is_valid() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "b.tar.gz"
        bundle.write_bytes(gzip.compress(BASE_TAR, mtime=0))
        assert verify_bundle(bundle, PUBLIC) == _manifest(FILES)
    assert json.loads(_manifest(FILES).dumps()) == MANIFEST_DOC
    assert MANIFEST_DOC["revision_number"] == 41
    assert MANIFEST_DOC["expires_at"] == "2999-01-01T00:00:00Z"
