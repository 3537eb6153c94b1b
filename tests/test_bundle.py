"""Policy bundles: build, sign, verify and extract, and every way a bundle is refused."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

import kilo_rules.engine.formats.bundle as bundle_mod
from kilo_rules.engine.formats.bundle import (
    EXTRA_HINT,
    MANIFEST,
    MAX_MEMBERS,
    SIGNATURE,
    BundleError,
    Manifest,
    build_bundle,
    default_revision_number,
    directory_revision,
    expires_at_text,
    extract_bundle,
    generate_keypair,
    parse_expires_at,
    revision_of,
    sign_bundle,
    verify_bundle,
)
from kilo_rules.tools.cli import EXIT_DIAGNOSTICS, EXIT_OK, EXIT_USAGE, main

ROOT = Path(__file__).resolve().parent.parent
POLICY = "version: 1\nname: p\nextends: kilo-default\n"
PROMPT = "You are a careful agent.\n"


# ---------------------------------------------------------------- helpers


def _policy_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "p.yaml").write_text(POLICY, encoding="utf-8")
    (root / "prompts").mkdir(exist_ok=True)
    (root / "prompts" / "agent.md").write_text(PROMPT, encoding="utf-8")
    (root / "routes.yaml").write_text("version: 1\ndefault: ./p.yaml\n", encoding="utf-8")
    return root


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    """A small policy directory."""
    return _policy_dir(tmp_path / "pol")


@pytest.fixture
def built(tmp_path: Path, policy: Path) -> Path:
    """The bundle of :func:`policy`, unsigned."""
    out = tmp_path / "b.tar.gz"
    build_bundle(policy, out)
    return out


@pytest.fixture(scope="module")
def keys() -> tuple[bytes, bytes]:
    """One key pair for the module (private PEM, public PEM)."""
    return generate_keypair()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_bytes(files: dict[str, bytes]) -> bytes:
    digests = {p: _sha(d) for p, d in files.items()}
    return Manifest(1, revision_of(digests), digests).dumps()


def _info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    return info


def _tar(
    members: Iterable[tuple[str, bytes] | tarfile.TarInfo],
    fmt: int = tarfile.USTAR_FORMAT,
) -> bytes:
    """A gzipped tarball written by :mod:`tarfile`, members in the order given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tf.addfile(m)
            else:
                tf.addfile(_info(m[0], len(m[1])), io.BytesIO(m[1]))
    return gzip.compress(buf.getvalue(), mtime=0)


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tf:
        out = []
        for m in tf.getmembers():
            f = tf.extractfile(m)
            assert f is not None
            out.append((m.name, f.read()))
        return out


def _code(exc: pytest.ExceptionInfo[BundleError]) -> str:
    return exc.value.diagnostic.code


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---------------------------------------------------------------- round trip


def test_build_verify_extract_round_trip(tmp_path: Path, policy: Path) -> None:
    out = tmp_path / "b.tar.gz"
    manifest = build_bundle(policy, out)
    assert manifest.version == 2 and manifest.revision_number > 0
    assert list(manifest.files) == ["p.yaml", "prompts/agent.md", "routes.yaml"]
    assert manifest.files["p.yaml"] == _sha(POLICY.encode())
    assert manifest.revision.startswith("sha256:") and len(manifest.revision) == 71
    assert verify_bundle(out) == manifest
    dest = tmp_path / "deploy" / "rev1"
    assert extract_bundle(out, dest) == manifest
    assert (dest / "p.yaml").read_text(encoding="utf-8") == POLICY
    assert (dest / "prompts" / "agent.md").read_text(encoding="utf-8") == PROMPT
    assert _listing(dest) == ["p.yaml", "prompts", "prompts/agent.md", "routes.yaml"]
    # What is extracted gives the bundle's revision back.
    assert directory_revision(dest).revision == manifest.revision
    assert directory_revision(dest).files == manifest.files
    # No temporary directory is left beside dest.
    assert _listing(tmp_path / "deploy") == _listing(dest.parent)
    assert [p.name for p in (tmp_path / "deploy").iterdir()] == ["rev1"]


def test_the_tarball_is_plain_ustar_that_tar_reads(built: Path) -> None:
    with tarfile.open(built) as tf:
        members = tf.getmembers()
    assert [m.name for m in members] == [MANIFEST, "p.yaml", "prompts/agent.md", "routes.yaml"]
    for m in members:
        assert m.isreg() and m.mtime == 0 and m.mode == 0o644 and m.uid == 0 and m.gid == 0
        assert m.uname == "" and m.gname == ""
    raw = built.read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # gzip mtime 0
    manifest = json.loads(dict(_members(built))[MANIFEST])
    assert manifest == verify_bundle(built).to_json()


def test_manifest_is_immutable_and_sorted() -> None:
    m = Manifest(1, revision_of({"b": "0" * 64, "a": "1" * 64}), {"b": "0" * 64, "a": "1" * 64})
    assert list(m.files) == ["a", "b"]
    with pytest.raises(TypeError):
        m.files["c"] = "x"  # type: ignore[index]
    assert hash(m) == hash(Manifest(1, m.revision, dict(m.files)))


def test_an_empty_directory_bundles(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    m = build_bundle(tmp_path / "empty", tmp_path / "e.tar.gz")
    assert dict(m.files) == {} and verify_bundle(tmp_path / "e.tar.gz") == m


# ---------------------------------------------------------------- determinism


def test_two_builds_are_byte_identical(tmp_path: Path, policy: Path) -> None:
    a, b = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    assert build_bundle(policy, a, revision_number=7) == build_bundle(policy, b, revision_number=7)
    assert a.read_bytes() == b.read_bytes()
    # Another copy, elsewhere, written later and with other modes: the same bytes.
    copy = _policy_dir(tmp_path / "elsewhere" / "copy")
    os.utime(copy / "p.yaml", (1, 1))
    (copy / "p.yaml").chmod(0o600)
    c = tmp_path / "c.tar.gz"
    build_bundle(copy, c, revision_number=7)
    assert c.read_bytes() == a.read_bytes()


def test_the_revision_is_stable_and_follows_the_content(tmp_path: Path, policy: Path) -> None:
    first = directory_revision(policy)
    assert directory_revision(policy) == first
    assert build_bundle(policy, tmp_path / "x.tar.gz").revision == first.revision
    (policy / "prompts" / "agent.md").write_text(PROMPT + "More.\n", encoding="utf-8")
    changed = directory_revision(policy)
    assert changed.revision != first.revision
    assert changed.files["p.yaml"] == first.files["p.yaml"]
    (policy / "prompts" / "agent.md").write_text(PROMPT, encoding="utf-8")
    assert directory_revision(policy) == first
    (policy / "prompts" / "agent.md").rename(policy / "prompts" / "renamed.md")
    assert directory_revision(policy).revision != first.revision


def test_the_revision_is_the_documented_hash() -> None:
    files = {"a.yaml": "1" * 64, "b/c.md": "2" * 64}
    lines = f"a.yaml\0{'1' * 64}\nb/c.md\0{'2' * 64}\n".encode()
    assert revision_of(files) == "sha256:" + hashlib.sha256(lines).hexdigest()
    page = (ROOT / "docs" / "bundles.md").read_text(encoding="utf-8")
    assert "path NUL digest LF" in page


def test_signing_is_deterministic_too(
    tmp_path: Path, built: Path, keys: tuple[bytes, bytes]
) -> None:
    one, two = tmp_path / "one.tar.gz", tmp_path / "two.tar.gz"
    sign_bundle(built, keys[0], one)
    sign_bundle(built, keys[0], two)
    assert one.read_bytes() == two.read_bytes()
    # Signing a signed bundle again replaces the signature: the same file.
    sign_bundle(one, keys[0])
    assert one.read_bytes() == two.read_bytes()


# ---------------------------------------------------------------- which files


def test_directory_skips_dot_files_symlinks_and_its_own_files(tmp_path: Path, policy: Path) -> None:
    before = directory_revision(policy)
    (policy / ".git").mkdir()
    (policy / ".git" / "HEAD").write_text("ref\n", encoding="utf-8")
    (policy / ".hidden.yaml").write_text("x", encoding="utf-8")
    (policy / "prompts" / ".swp").write_text("x", encoding="utf-8")
    (policy / MANIFEST).write_text("{}", encoding="utf-8")
    (policy / SIGNATURE).write_text("sig", encoding="utf-8")
    outside = tmp_path / "secret.txt"
    outside.write_text("secret", encoding="utf-8")
    (policy / "link.md").symlink_to(outside)
    (policy / "linkdir").symlink_to(tmp_path)
    os.mkfifo(policy / "fifo")
    assert directory_revision(policy) == before
    # Deeper down, manifest.json is a policy file like any other.
    (policy / "prompts" / MANIFEST).write_text("{}", encoding="utf-8")
    assert "prompts/manifest.json" in directory_revision(policy).files


def test_an_output_inside_the_directory_is_left_out(policy: Path) -> None:
    first = build_bundle(policy, policy / "self.tar.gz", revision_number=3)
    second = build_bundle(policy, policy / "self.tar.gz", revision_number=3)
    assert first == second and "self.tar.gz" not in second.files


@pytest.mark.parametrize(
    ("name", "code"),
    [("back\\slash.md", "bundle.path"), ("tab\there.md", "bundle.path")],
)
def test_a_file_name_a_bundle_cannot_hold_is_refused(policy: Path, name: str, code: str) -> None:
    (policy / name).write_text("x", encoding="utf-8")
    with pytest.raises(BundleError) as exc:
        directory_revision(policy)
    assert _code(exc) == code
    assert exc.value.diagnostic.location.file == str(policy / name)


def test_directory_caps(policy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_mod, "MAX_FILES", 2)
    with pytest.raises(BundleError) as exc:
        directory_revision(policy)
    assert _code(exc) == "bundle.too-many"
    monkeypatch.setattr(bundle_mod, "MAX_FILES", 100)
    monkeypatch.setattr(bundle_mod, "MAX_FILE_BYTES", 20)
    with pytest.raises(BundleError) as exc:
        directory_revision(policy)
    assert _code(exc) == "bundle.too-large"
    assert exc.value.diagnostic.details["limit"] == 20
    monkeypatch.setattr(bundle_mod, "MAX_FILE_BYTES", 1000)
    monkeypatch.setattr(bundle_mod, "MAX_TOTAL_BYTES", 50)
    with pytest.raises(BundleError) as exc:
        directory_revision(policy)
    assert _code(exc) == "bundle.too-large"


def test_a_missing_directory_is_an_io_error(tmp_path: Path) -> None:
    with pytest.raises(BundleError) as exc:
        directory_revision(tmp_path / "missing")
    assert _code(exc) == "bundle.io"
    (tmp_path / "file").write_text("x", encoding="utf-8")
    with pytest.raises(BundleError) as exc:
        build_bundle(tmp_path / "file", tmp_path / "o.tar.gz")
    assert _code(exc) == "bundle.io"


def test_case_folding_collisions_are_refused(policy: Path) -> None:
    (policy / "P.yaml").write_text("x", encoding="utf-8")
    if (policy / "p.yaml").read_text(encoding="utf-8") != POLICY:  # pragma: no cover
        pytest.skip("a case-insensitive file system")
    with pytest.raises(BundleError) as exc:
        directory_revision(policy)
    assert _code(exc) == "bundle.duplicate"


# ---------------------------------------------------------------- signatures


def test_sign_and_verify_with_a_generated_key(
    tmp_path: Path, built: Path, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    assert b"BEGIN PRIVATE KEY" in private and b"BEGIN PUBLIC KEY" in public
    unsigned = verify_bundle(built)
    signed = tmp_path / "signed.tar.gz"
    sign_bundle(built, private, signed)
    assert verify_bundle(signed, public) == unsigned
    assert verify_bundle(signed) == unsigned  # without a key the signature is not needed
    names = [n for n, _ in _members(signed)]
    assert names[:2] == [MANIFEST, SIGNATURE]
    dest = tmp_path / "dest"
    assert extract_bundle(signed, dest, public) == unsigned
    assert SIGNATURE not in _listing(dest) and MANIFEST not in _listing(dest)
    # In place, by default.
    sign_bundle(built, private)
    assert verify_bundle(built, public) == unsigned


def test_a_wrong_key_is_refused(tmp_path: Path, built: Path, keys: tuple[bytes, bytes]) -> None:
    sign_bundle(built, keys[0])
    _, other = generate_keypair()
    with pytest.raises(BundleError) as exc:
        verify_bundle(built, other)
    assert _code(exc) == "bundle.signature"
    assert exc.value.diagnostic.location.file == f"{built}!/{SIGNATURE}"
    with pytest.raises(BundleError) as exc:
        extract_bundle(built, tmp_path / "dest", other)
    assert _code(exc) == "bundle.signature"
    assert not (tmp_path / "dest").exists()


def test_an_unsigned_bundle_is_refused_when_a_key_is_required(
    built: Path, keys: tuple[bytes, bytes]
) -> None:
    with pytest.raises(BundleError) as exc:
        verify_bundle(built, keys[1])
    assert _code(exc) == "bundle.unsigned"
    assert exc.value.diagnostic.location.file == str(built)


def test_a_manifest_edited_after_signing_is_refused(
    tmp_path: Path, built: Path, keys: tuple[bytes, bytes]
) -> None:
    # The attacker changes a file and rewrites the manifest consistently (digests and
    # revision): only the signature tells.
    sign_bundle(built, keys[0])
    members = dict(_members(built))
    sig = members.pop(SIGNATURE)
    members.pop(MANIFEST)
    members["p.yaml"] = b"version: 1\nname: evil\n"
    forged = tmp_path / "forged.tar.gz"
    forged.write_bytes(
        _tar([(MANIFEST, _manifest_bytes(members)), (SIGNATURE, sig), *members.items()])
    )
    assert verify_bundle(forged).files["p.yaml"] == _sha(members["p.yaml"])
    with pytest.raises(BundleError) as exc:
        verify_bundle(forged, keys[1])
    assert _code(exc) == "bundle.signature"


@pytest.mark.parametrize(
    "sig", [b"not base64!", b"QUJD\n", b"", b"A" * 1025], ids=["junk", "short", "empty", "big"]
)
def test_a_malformed_signature_is_refused(
    tmp_path: Path, built: Path, keys: tuple[bytes, bytes], sig: bytes
) -> None:
    members = _members(built)
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(_tar([members[0], (SIGNATURE, sig), *members[1:]]))
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad, keys[1])
    assert _code(exc) in ("bundle.signature", "bundle.too-large")


def test_keys_that_cannot_be_used(built: Path, keys: tuple[bytes, bytes]) -> None:
    for pem in (b"", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", keys[0]):
        with pytest.raises(BundleError) as exc:
            verify_bundle(built, pem)
        assert _code(exc) == "bundle.key"
    with pytest.raises(BundleError) as exc:
        sign_bundle(built, keys[1])
    assert _code(exc) == "bundle.key"


def test_a_tampered_bundle_is_never_signed(
    tmp_path: Path, built: Path, keys: tuple[bytes, bytes]
) -> None:
    members = _members(built)
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(_tar([members[0], ("p.yaml", b"changed"), *members[2:]]))
    with pytest.raises(BundleError) as exc:
        sign_bundle(bad, keys[0])
    assert _code(exc) == "bundle.digest"
    assert SIGNATURE not in dict(_members(bad))


def test_without_cryptography_signing_names_the_extra(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)
    for call in (
        lambda: sign_bundle(built, b"key"),
        lambda: verify_bundle(built, b"key"),
        generate_keypair,
    ):
        with pytest.raises(BundleError) as exc:
            call()
        assert _code(exc) == "bundle.cryptography-missing"
        assert exc.value.diagnostic.hint == EXTRA_HINT
        assert "pip install 'kilo-rules[bundle]'" in EXTRA_HINT
    assert verify_bundle(built).files  # no key, no cryptography needed


def test_the_package_imports_without_cryptography() -> None:
    code = (
        "import sys; sys.modules['cryptography'] = None\n"
        "import kilo_rules, kilo_rules.engine.formats.bundle, kilo_rules.tools.cli\n"
        "print(kilo_rules.build_bundle.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "build_bundle"


# ---------------------------------------------------------------- tampered bundles


def _rebuilt(tmp_path: Path, members: list[tuple[str, bytes]], name: str = "x.tar.gz") -> Path:
    out = tmp_path / name
    out.write_bytes(_tar(members))
    return out


def test_a_tampered_member_is_refused(tmp_path: Path, built: Path) -> None:
    members = [(n, b"evil\n" if n == "p.yaml" else d) for n, d in _members(built)]
    bad = _rebuilt(tmp_path, members)
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    assert _code(exc) == "bundle.digest"
    diag = exc.value.diagnostic
    assert diag.location.file == f"{bad}!/p.yaml"
    assert diag.details["expected"] == _sha(POLICY.encode())


def test_a_member_added_is_refused(tmp_path: Path, built: Path) -> None:
    bad = _rebuilt(tmp_path, [*_members(built), ("extra.yaml", b"x")])
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    assert _code(exc) == "bundle.unexpected"
    assert exc.value.diagnostic.location.file == f"{bad}!/extra.yaml"


def test_a_member_removed_is_refused(tmp_path: Path, built: Path) -> None:
    bad = _rebuilt(tmp_path, [m for m in _members(built) if m[0] != "routes.yaml"])
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    assert _code(exc) == "bundle.missing"
    assert exc.value.diagnostic.details["member"] == "routes.yaml"


def test_a_manifest_edited_is_refused(tmp_path: Path, built: Path) -> None:
    members = _members(built)
    data = json.loads(members[0][1])
    # A digest changed: the revision no longer recomputes.
    data["files"]["p.yaml"] = "0" * 64
    bad = _rebuilt(tmp_path, [(MANIFEST, json.dumps(data, indent=2).encode()), *members[1:]])
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    assert _code(exc) == "bundle.revision"
    assert exc.value.diagnostic.location.file == f"{bad}!/{MANIFEST}"
    assert exc.value.diagnostic.location.line == 3  # the "revision" line
    # Digest and revision changed together: the member no longer matches.
    data["revision"] = revision_of(data["files"])
    bad = _rebuilt(tmp_path, [(MANIFEST, json.dumps(data).encode()), *members[1:]])
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    assert _code(exc) == "bundle.digest"


def _v2(number: object, expires: str | None = None) -> str:
    """A version 2 manifest of no files, the number on line 3 and the expiry on line 4."""
    files = {}
    revision = revision_of(files)
    lines = ['{"version": 2,', f' "revision": "{revision}",', f' "revision_number": {number},']
    if expires is not None:
        lines.append(f' "expires_at": {expires},')
    return "\n".join([*lines, ' "files": {}}'])


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('{"version": 1,\n "files": {}\n', 3, "Expecting"),
        ('{"version": 3, "revision": "x", "files": {}}', 1, "unsupported manifest version"),
        ('{"version": 2, "revision": "x", "files": {}}', 1, "has no 'revision_number'"),
        ('{"version": 1,\n "revision_number": 3}', 2, "unknown key 'revision_number'"),
        ('{"version": 1,\n "expires_at": "2999-01-01T00:00:00Z"}', 2, "unknown key 'expires_at'"),
        (_v2(0), 3, "revision number is not an integer"),
        (_v2("true"), 3, "revision number is not an integer"),
        (_v2('"5"'), 3, "revision number is not an integer"),
        (_v2(2**63), 3, "revision number is not an integer"),
        (_v2(5, '"2999-01-01T00:00:00+01:00"'), 4, "expires_at is not an RFC 3339 UTC time"),
        (_v2(5, '"2999-02-30T00:00:00Z"'), 4, "expires_at is not an RFC 3339 UTC time"),
        (_v2(5, "1700000000"), 4, "expires_at is not an RFC 3339 UTC time"),
        ('{"version": true, "revision": "x", "files": {}}', 1, "unsupported manifest version"),
        ('{"version": 1, "files": {}}', 1, "has no 'revision'"),
        ('{"version": 1, "version": 1}', 1, "appears twice"),
        ('{"version": 1, "revision": "sha256:00", "files": {}}', 1, "revision is not"),
        ('{"version": 1,\n "other": 1}', 2, "unknown key 'other'"),
        ("[1]", 1, "not a JSON object"),
        ("[" * 5000 + "]" * 5000, 1, "not valid JSON"),
        ('{"version": NaN}', 1, "not valid JSON"),
        (
            '{"version":1,"revision":"sha256:'
            + "0" * 64
            + '",\n"files":{"../x":"'
            + "0" * 64
            + '"}}',
            2,
            "'../x' is refused",
        ),
    ],
)
def test_a_malformed_manifest_is_located_in_it(
    tmp_path: Path, built: Path, text: str, line: int, message: str
) -> None:
    bad = _rebuilt(tmp_path, [(MANIFEST, text.encode()), *_members(built)[1:]])
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    diag = exc.value.diagnostic
    assert diag.code == "bundle.manifest"
    assert diag.location.file == f"{bad}!/{MANIFEST}"
    assert diag.location.line == line
    assert message in diag.message


def test_no_manifest_is_refused(tmp_path: Path, built: Path) -> None:
    bad = _rebuilt(tmp_path, _members(built)[1:])
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    assert _code(exc) == "bundle.manifest"


# ---------------------------------------------------------------- hostile tarballs


def _huge_header(name: str) -> bytes:
    info = _info(name, 2**32)
    raw = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    return gzip.compress(raw + bytes(1024), mtime=0)


def _many_members() -> bytes:
    return _tar([(f"f{i}.yaml", b"") for i in range(MAX_MEMBERS + 1)])


def _bomb() -> bytes:
    # 20 MiB of zeros compress to about 20 KB, a ratio of about 1000.
    out = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunks = [out.compress(bytes(1024 * 1024)) for _ in range(20)]
    return b"".join(chunks) + out.flush()


def _device() -> tarfile.TarInfo:
    info = _info("dev.yaml", kind=tarfile.CHRTYPE)
    info.devmajor, info.devminor = 1, 3
    return info


def _link(kind: bytes, target: str) -> tarfile.TarInfo:
    info = _info("link.yaml", kind=kind)
    info.linkname = target
    return info


HOSTILE: dict[str, tuple[bytes, str]] = {
    "traversal": (_tar([("../x", b"pwned")]), "bundle.path"),
    "deep-traversal": (_tar([("prompts/../../x", b"pwned")]), "bundle.path"),
    "absolute": (_tar([("/tmp/kilo-rules-pwned", b"pwned")]), "bundle.path"),
    "dot-file": (_tar([(".bashrc", b"pwned")]), "bundle.path"),
    "backslash": (_tar([("..\\x", b"pwned")]), "bundle.path"),
    "symlink": (_tar([_link(tarfile.SYMTYPE, "/etc/passwd")]), "bundle.link"),
    "hardlink": (_tar([_link(tarfile.LNKTYPE, "/etc/passwd")]), "bundle.link"),
    "gnu-symlink": (_tar([_link(tarfile.SYMTYPE, "../../x")], tarfile.GNU_FORMAT), "bundle.link"),
    "device": (_tar([_device()]), "bundle.member-type"),
    "fifo": (_tar([_info("f.yaml", kind=tarfile.FIFOTYPE)]), "bundle.member-type"),
    "directory": (_tar([_info("prompts", kind=tarfile.DIRTYPE)]), "bundle.member-type"),
    "pax-header": (_tar([("é" * 60 + ".yaml", b"x")], tarfile.PAX_FORMAT), "bundle.member-type"),
    "gnu-long-name": (
        _tar([("a" * 120 + ".yaml", b"x")], tarfile.GNU_FORMAT),
        "bundle.member-type",
    ),
    "huge-declared-size": (_huge_header("big.yaml"), "bundle.too-large"),
    "too-many-members": (_many_members(), "bundle.too-many"),
    "gzip-bomb": (_bomb(), "bundle.bomb"),
    "duplicate": (_tar([("a.yaml", b"1"), ("a.yaml", b"2")]), "bundle.duplicate"),
    "case-duplicate": (_tar([("a.yaml", b"1"), ("A.YAML", b"2")]), "bundle.duplicate"),
    "nfc-duplicate": (_tar([("\u00e9.md", b"1"), ("e\u0301.md", b"2")]), "bundle.duplicate"),
    "file-and-dir": (_tar([("a", b"1"), ("a/b.yaml", b"2")]), "bundle.duplicate"),
    "duplicate-manifest": (_tar([(MANIFEST, b"{}"), (MANIFEST, b"{}")]), "bundle.duplicate"),
    "not-gzip": (b"PK\x03\x04 a zip file", "bundle.gzip"),
    "empty": (b"", "bundle.gzip"),
    "truncated-gzip": (_tar([("a.yaml", b"x" * 5000)])[:40], "bundle.gzip"),
    "trailing-data": (_tar([("a.yaml", b"x")]) + b"junk", "bundle.gzip"),
    "not-tar": (gzip.compress(b"hello" * 200, mtime=0), "bundle.tar"),
    "no-end-marker": (
        gzip.compress(_info("a.yaml").tobuf(tarfile.USTAR_FORMAT), mtime=0),
        "bundle.tar",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_tarballs_are_refused_without_writing(tmp_path: Path, name: str) -> None:
    data, code = HOSTILE[name]
    box = tmp_path / "box"
    box.mkdir()
    bad = box / "hostile.tar.gz"
    bad.write_bytes(data)
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    assert _code(exc) == code, exc.value.diagnostic
    assert exc.value.diagnostic.location.file.startswith(str(bad))
    dest = box / "out" / "dest"
    with pytest.raises(BundleError) as exc:
        extract_bundle(bad, dest)
    assert _code(exc) == code
    # Nothing was written: not dest, not beside it, not above it.
    assert _listing(box) == ["hostile.tar.gz"]
    assert not Path("/tmp/kilo-rules-pwned").exists()


#: Members PEP 706's data filter refuses, and the error it raises for each.
FILTERED: dict[str, str] = {
    "traversal": "OutsideDestinationError",
    "deep-traversal": "OutsideDestinationError",
    "symlink": "AbsoluteLinkError",
    "hardlink": "AbsoluteLinkError",
    "gnu-symlink": "LinkOutsideDestinationError",
    "device": "SpecialFileError",
    "fifo": "SpecialFileError",
}


@pytest.mark.parametrize("name", list(FILTERED))
def test_the_data_filter_refusals_are_located_bundle_errors(tmp_path: Path, name: str) -> None:
    data, code = HOSTILE[name]
    bad = tmp_path / "hostile.tar.gz"
    bad.write_bytes(data)
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    diag = exc.value.diagnostic
    assert (diag.code, diag.details["filter"]) == (code, FILTERED[name])
    assert diag.location.file == str(bad)  # the bundle, never the hostile name


@pytest.mark.parametrize("name", list(FILTERED))
def test_without_the_data_filter_the_same_members_are_refused(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python 3.11 before 3.11.4 has no tarfile.data_filter: the rules of the reader alone.
    monkeypatch.setattr(bundle_mod, "_DATA_FILTER", None)
    data, code = HOSTILE[name]
    bad = tmp_path / "hostile.tar.gz"
    bad.write_bytes(data)
    with pytest.raises(BundleError) as exc:
        extract_bundle(bad, tmp_path / "out")
    assert _code(exc) == code and "filter" not in exc.value.diagnostic.details
    assert not (tmp_path / "out").exists()


def test_every_member_goes_through_the_data_filter(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str]] = []
    real = tarfile.data_filter

    def recording(info: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        seen.append((info.name, dest))
        return real(info, dest)

    monkeypatch.setattr(bundle_mod, "_DATA_FILTER", recording)
    verify_bundle(built)
    assert [name for name, _ in seen] == [name for name, _ in _members(built)]
    # Judged against a destination that does not exist: nothing on disk sways the verdict.
    assert not any(Path(dest).exists() for _, dest in seen)


def test_a_link_the_data_filter_lets_in_is_still_refused(tmp_path: Path) -> None:
    bad = tmp_path / "b.tar.gz"
    bad.write_bytes(_tar([_link(tarfile.SYMTYPE, "team.yaml")]))
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    assert _code(exc) == "bundle.link" and "filter" not in exc.value.diagnostic.details


def test_a_hostile_name_is_not_put_into_a_location(tmp_path: Path) -> None:
    bad = tmp_path / "b.tar.gz"
    bad.write_bytes(_tar([("../../etc/passwd", b"x")]))
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad)
    diag = exc.value.diagnostic
    assert diag.location.file == str(bad)
    assert diag.details["member"] == "../../etc/passwd"


def test_a_bundle_file_over_the_cap_is_refused(
    tmp_path: Path, built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bundle_mod, "MAX_BUNDLE_BYTES", 100)
    with pytest.raises(BundleError) as exc:
        verify_bundle(built)
    assert _code(exc) == "bundle.too-large"


def test_a_member_over_the_cap_is_refused(
    tmp_path: Path, built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bundle_mod, "MAX_FILE_BYTES", 10)
    with pytest.raises(BundleError) as exc:
        verify_bundle(built)
    assert _code(exc) == "bundle.too-large"
    assert exc.value.diagnostic.details == {"size": len(POLICY), "limit": 10}
    monkeypatch.setattr(bundle_mod, "MAX_FILE_BYTES", 1000)
    monkeypatch.setattr(bundle_mod, "MAX_TOTAL_BYTES", 50)
    with pytest.raises(BundleError) as exc:
        verify_bundle(built)
    assert _code(exc) == "bundle.too-large"


def test_the_bomb_cap_leaves_room_for_small_bundles(tmp_path: Path) -> None:
    # Under the floor the ratio is not held against a bundle: 900 KB of zeros compress
    # about a thousand times, and are still let in.
    files = {"a.yaml": bytes(900_000)}
    ok = _rebuilt(tmp_path, [(MANIFEST, _manifest_bytes(files)), *files.items()])
    compressed = len(ok.read_bytes())
    assert len(gzip.decompress(ok.read_bytes())) > bundle_mod.MAX_RATIO * compressed
    assert verify_bundle(ok).files


def test_a_special_file_on_disk_is_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "b.tar.gz"
    os.mkfifo(fifo)
    with pytest.raises(BundleError) as exc:
        verify_bundle(fifo)
    assert _code(exc) == "bundle.io"
    with pytest.raises(BundleError) as exc:
        verify_bundle(tmp_path / "missing.tar.gz")
    assert _code(exc) == "bundle.io"


# ---------------------------------------------------------------- extraction


def test_extract_refuses_an_occupied_destination(tmp_path: Path, built: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "old.yaml").write_text("old", encoding="utf-8")
    with pytest.raises(BundleError) as exc:
        extract_bundle(built, dest)
    assert _code(exc) == "bundle.dest"
    assert _listing(dest) == ["old.yaml"]
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BundleError) as exc:
        extract_bundle(built, link)
    assert _code(exc) == "bundle.dest"
    assert not (tmp_path / "elsewhere").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert extract_bundle(built, empty).files


def test_a_failed_extraction_leaves_nothing(
    tmp_path: Path, built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = bundle_mod._write_tree

    def half(top: Path, files: dict[str, bytes]) -> None:
        real(top, dict(list(files.items())[:1]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bundle_mod, "_write_tree", half)
    parent = tmp_path / "deploy"
    with pytest.raises(BundleError) as exc:
        extract_bundle(built, parent / "dest")
    assert _code(exc) == "bundle.io"
    assert _listing(parent) == []


def test_extracted_files_have_ordinary_modes(tmp_path: Path, built: Path) -> None:
    dest = tmp_path / "dest"
    extract_bundle(built, dest)
    mode = stat.S_IMODE((dest / "p.yaml").stat().st_mode)
    assert mode & 0o600 == 0o600 and not mode & 0o111


# ---------------------------------------------------------------- the command line


def test_cli_build_sign_verify_keygen(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _policy_dir(in_tmp / "pol")
    revision = directory_revision(in_tmp / "pol").revision
    assert main(["bundle", "build", "pol", "-o", "b.tar.gz"]) == EXIT_OK
    out = capsys.readouterr()
    assert out.out == revision + "\n"
    assert "3 file(s)" in out.err

    assert main(["bundle", "keygen", "--out-dir", "keys"]) == EXIT_OK
    assert capsys.readouterr().out.split() == ["keys/bundle.key", "keys/bundle.pub"]
    assert stat.S_IMODE((in_tmp / "keys" / "bundle.key").stat().st_mode) == 0o600
    assert b"PUBLIC KEY" in (in_tmp / "keys" / "bundle.pub").read_bytes()

    assert main(["bundle", "verify", "b.tar.gz"]) == EXIT_OK
    assert capsys.readouterr().out == revision + "\n"
    assert main(["bundle", "verify", "b.tar.gz", "--pubkey", "keys/bundle.pub"]) == (
        EXIT_DIAGNOSTICS
    )
    assert "error[bundle.unsigned]" in capsys.readouterr().err

    assert main(["bundle", "sign", "b.tar.gz", "--key", "keys/bundle.key", "-o", "s.tar.gz"]) == 0
    assert capsys.readouterr().out == revision + "\n"
    assert main(["bundle", "verify", "s.tar.gz", "--pubkey", "keys/bundle.pub"]) == EXIT_OK
    captured = capsys.readouterr()
    assert captured.out == revision + "\n" and "signature valid" in captured.err

    assert main(["bundle", "sign", "b.tar.gz", "--key", "keys/bundle.key"]) == EXIT_OK
    assert (in_tmp / "b.tar.gz").read_bytes() == (in_tmp / "s.tar.gz").read_bytes()


def test_cli_verify_reports_a_tampered_bundle_located(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_bundle(_policy_dir(in_tmp / "pol"), in_tmp / "b.tar.gz")
    members = [(n, b"evil" if n == "p.yaml" else d) for n, d in _members(in_tmp / "b.tar.gz")]
    (in_tmp / "bad.tar.gz").write_bytes(_tar(members))
    assert main(["bundle", "verify", "bad.tar.gz"]) == EXIT_DIAGNOSTICS
    err = capsys.readouterr().err
    assert err.startswith("bad.tar.gz!/p.yaml:1:1: error[bundle.digest]: member 'p.yaml'")


def test_cli_usage_and_io_errors_exit_2(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_bundle(_policy_dir(in_tmp / "pol"), in_tmp / "b.tar.gz")
    (in_tmp / "junk.pem").write_text("not a key", encoding="utf-8")
    cases = [
        (["bundle"], "required: ACTION"),
        (["bundle", "build", "pol"], "-o/--output"),
        (["bundle", "verify", "missing.tar.gz"], "error[bundle.io]"),
        (["bundle", "build", "missing", "-o", "x.tar.gz"], "error[bundle.io]"),
        (["bundle", "verify", "b.tar.gz", "--pubkey", "missing.pem"], "missing.pem"),
        (
            ["bundle", "verify", "b.tar.gz", "--pubkey", "junk.pem"],
            "junk.pem:1:1: error[bundle.key]",
        ),
        (["bundle", "sign", "b.tar.gz", "--key", "junk.pem"], "junk.pem:1:1: error[bundle.key]"),
    ]
    for argv, said in cases:
        assert main(argv) == EXIT_USAGE, argv
        assert said in capsys.readouterr().err, argv


def test_cli_keygen_never_overwrites(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bundle", "keygen", "--out-dir", "k"]) == EXIT_OK
    key = (in_tmp / "k" / "bundle.key").read_bytes()
    assert main(["bundle", "keygen", "--out-dir", "k"]) == EXIT_USAGE
    assert "already exists" in capsys.readouterr().err
    assert (in_tmp / "k" / "bundle.key").read_bytes() == key


BROKEN = "version: 1\nname: p\nextends: kilo-default\nprune:\n  protect_turnz: 2\n"


def test_cli_build_refuses_a_tree_check_rejects_and_writes_nothing(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _policy_dir(in_tmp / "pol")
    assert main(["bundle", "build", "pol", "-o", "b.tar.gz", "--revision", "1"]) == EXIT_OK
    before = (in_tmp / "b.tar.gz").read_bytes()
    capsys.readouterr()
    (in_tmp / "pol" / "p.yaml").write_text(BROKEN, encoding="utf-8")
    for out in ("b.tar.gz", "new.tar.gz"):
        assert main(["bundle", "build", "pol", "-o", out, "--revision", "2"]) == (EXIT_DIAGNOSTICS)
        err = capsys.readouterr().err
        assert "pol/p.yaml:5:3: error[schema.unknown-key]: unknown key 'protect_turnz'" in err
        assert "   5 |   protect_turnz: 2" in err  # the source line, with a caret
        assert err.rstrip().endswith(
            "1 error(s) in its policies (kilo-rules check); nothing written"
        )
    assert (in_tmp / "b.tar.gz").read_bytes() == before
    assert not (in_tmp / "new.tar.gz").exists()
    assert sorted(p.name for p in in_tmp.iterdir()) == ["b.tar.gz", "pol"]  # no temporary


def test_cli_sign_refuses_a_bundle_whose_policies_check_rejects(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _policy_dir(in_tmp / "pol")
    (in_tmp / "pol" / "p.yaml").write_text(BROKEN, encoding="utf-8")
    build_bundle(in_tmp / "pol", in_tmp / "b.tar.gz")  # the library does not check
    before = (in_tmp / "b.tar.gz").read_bytes()
    assert main(["bundle", "keygen", "--out-dir", "keys"]) == EXIT_OK
    capsys.readouterr()
    for extra in ([], ["-o", "s.tar.gz"]):
        argv = ["bundle", "sign", "b.tar.gz", "--key", "keys/bundle.key", *extra]
        assert main(argv) == EXIT_DIAGNOSTICS
        err = capsys.readouterr().err
        assert "b.tar.gz!/p.yaml:5:3: error[schema.unknown-key]" in err
    assert (in_tmp / "b.tar.gz").read_bytes() == before
    assert not (in_tmp / "s.tar.gz").exists()


def test_cli_check_verifies_a_bundle_and_checks_its_policies(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _policy_dir(in_tmp / "pol")
    (in_tmp / "pol" / "p.yaml").write_text(BROKEN, encoding="utf-8")
    build_bundle(in_tmp / "pol", in_tmp / "b.tar.gz")
    assert main(["check", "b.tar.gz", "--format", "json"]) == EXIT_DIAGNOSTICS
    (d,) = json.loads(capsys.readouterr().out)
    assert (d["code"], d["location"]) == (
        "schema.unknown-key",
        {"file": "b.tar.gz!/p.yaml", "line": 5, "col": 3},
    )
    assert main(["check", "b.tar.gz"]) == EXIT_DIAGNOSTICS
    assert "   5 |   protect_turnz: 2" in capsys.readouterr().out  # carets from the bundle

    (in_tmp / "pol" / "p.yaml").write_text(POLICY, encoding="utf-8")
    build_bundle(in_tmp / "pol", in_tmp / "b.tar.gz")
    assert main(["check", "b.tar.gz"]) == EXIT_OK
    # The YAML files inside it are checked, not the prompt.
    assert "checked 2 file(s): 0 error(s)" in capsys.readouterr().err
    assert main(["bundle", "keygen", "--out-dir", "keys"]) == EXIT_OK
    assert main(["check", "b.tar.gz", "--pubkey", "keys/bundle.pub"]) == EXIT_DIAGNOSTICS
    assert "b.tar.gz:1:1: error[bundle.unsigned]" in capsys.readouterr().out
    assert main(["bundle", "sign", "b.tar.gz", "--key", "keys/bundle.key"]) == EXIT_OK
    capsys.readouterr()
    assert main(["check", "b.tar.gz", "--pubkey", "keys/bundle.pub"]) == EXIT_OK
    assert "checked 2 file(s): 0 error(s)" in capsys.readouterr().err

    members = [(n, b"evil" if n == "p.yaml" else d) for n, d in _members(in_tmp / "b.tar.gz")]
    (in_tmp / "bad.tar.gz").write_bytes(_tar(members))
    assert main(["check", "bad.tar.gz"]) == EXIT_DIAGNOSTICS
    assert "bad.tar.gz!/p.yaml:1:1: error[bundle.digest]" in capsys.readouterr().out
    assert main(["check", "b.tar.gz", "--pubkey", "missing.pem"]) == EXIT_USAGE


def test_cli_docs_list_the_bundle_commands() -> None:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for action in ("build", "sign", "verify", "keygen"):
        assert f"kilo-rules bundle {action}" in page


# ---------------------------------------------------------------- revision numbers, expiry


def test_the_revision_number_and_expiry_are_in_the_signed_manifest(
    tmp_path: Path, policy: Path, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    out = tmp_path / "b.tar.gz"
    expires = datetime(2999, 1, 31, 12, tzinfo=UTC)
    built = build_bundle(policy, out, revision_number=42, expires_at=expires)
    doc = json.loads(dict(_members(out))[MANIFEST])
    assert doc["version"] == 2 and doc["revision_number"] == 42
    assert doc["expires_at"] == "2999-01-31T12:00:00Z"
    assert sign_bundle(out, private) == built  # the number it was built with, signed
    assert verify_bundle(out, public) == built
    # A number raised after signing is a manifest that is no longer the one signed.
    members = _members(out)
    raised = members[0][1].replace(b'"revision_number": 42', b'"revision_number": 43')
    bad = _rebuilt(tmp_path, [(MANIFEST, raised), *members[1:]])
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad, public)
    assert _code(exc) == "bundle.signature"
    longer = members[0][1].replace(b"2999-01-31", b"3999-01-31")
    bad = _rebuilt(tmp_path, [(MANIFEST, longer), *members[1:]], "y.tar.gz")
    with pytest.raises(BundleError) as exc:
        verify_bundle(bad, public)
    assert _code(exc) == "bundle.signature"


def test_sign_replaces_the_number_and_expiry_only_when_asked(
    tmp_path: Path, policy: Path, keys: tuple[bytes, bytes]
) -> None:
    private, public = keys
    out = tmp_path / "b.tar.gz"
    build_bundle(policy, out, revision_number=5)
    later = datetime(2999, 6, 1, tzinfo=UTC)
    signed = sign_bundle(out, private, tmp_path / "s.tar.gz", revision_number=9, expires_at=later)
    assert (signed.revision_number, signed.expires_at) == (9, later)
    assert verify_bundle(tmp_path / "s.tar.gz", public) == signed
    assert verify_bundle(out).revision_number == 5  # the input is left as it was
    # An unnumbered (version 1) bundle is numbered when it is signed.
    legacy = _rebuilt(tmp_path, _members(out), "legacy.tar.gz")
    digests = verify_bundle(out).files
    v1 = Manifest(1, revision_of(digests), digests).dumps()
    legacy = _rebuilt(tmp_path, [(MANIFEST, v1), *_members(out)[1:]], "legacy.tar.gz")
    assert verify_bundle(legacy).revision_number == 0
    assert sign_bundle(legacy, private).revision_number >= 1
    with pytest.raises(BundleError) as exc:
        build_bundle(policy, out, revision_number=0)
    assert _code(exc) == "bundle.revision-number"


def test_the_default_number_follows_the_clock_and_the_bundle_it_replaces(
    tmp_path: Path, policy: Path
) -> None:
    out = tmp_path / "b.tar.gz"
    assert default_revision_number(out, now=1_700_000_000.9) == 1_700_000_000
    build_bundle(policy, out, revision_number=2_000_000_000)
    # Over a bundle numbered beyond the clock, the next is one more than it ...
    assert default_revision_number(out, now=1_700_000_000) == 2_000_000_001
    assert build_bundle(policy, out).revision_number == 2_000_000_001
    assert build_bundle(policy, out).revision_number == 2_000_000_002
    # ... and anything at the output that is not a bundle is no previous release.
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a bundle")
    assert default_revision_number(junk, now=7) == 7


def test_an_expired_manifest_is_refused_located(tmp_path: Path, policy: Path) -> None:
    out = tmp_path / "b.tar.gz"
    until = datetime(2030, 1, 1, tzinfo=UTC)
    build_bundle(policy, out, revision_number=3, expires_at=until)
    assert verify_bundle(out, now=datetime(2029, 12, 31, tzinfo=UTC)).expires_at == until
    for now in (until, datetime(2031, 1, 1, tzinfo=UTC)):
        with pytest.raises(BundleError) as exc:
            verify_bundle(out, now=now)
        diag = exc.value.diagnostic
        assert diag.code == "bundle.expired"
        assert diag.location.file == f"{out}!/{MANIFEST}" and diag.location.line == 5
        with pytest.raises(BundleError):
            extract_bundle(out, tmp_path / "dest", now=now)
        assert not (tmp_path / "dest").exists()


def test_expiry_times_are_rfc3339_utc_only() -> None:
    assert parse_expires_at("2026-01-31T12:00:00Z") == datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert parse_expires_at("2026-01-31T12:00:00.5Z").microsecond == 500_000
    for bad in ("2026-01-31T12:00:00+00:00", "2026-01-31", "2026-02-30T00:00:00Z", " x"):
        with pytest.raises(ValueError):
            parse_expires_at(bad)
    assert expires_at_text(datetime(2026, 1, 31, 13, tzinfo=timezone(timedelta(hours=1)))) == (
        "2026-01-31T12:00:00Z"
    )


def test_cli_sets_the_revision_number_and_expiry(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _policy_dir(in_tmp / "pol")
    argv = ["bundle", "build", "pol", "-o", "b.tar.gz", "--revision", "42"]
    assert main([*argv, "--expires-at", "2999-01-01T00:00:00Z"]) == EXIT_OK
    assert "revision number 42, expires 2999-01-01T00:00:00Z" in capsys.readouterr().err
    assert main(["bundle", "build", "pol", "-o", "b.tar.gz"]) == EXIT_OK  # over it: higher
    assert verify_bundle(in_tmp / "b.tar.gz").revision_number > 42
    assert main(["bundle", "keygen", "--out-dir", "keys"]) == EXIT_OK
    sign = ["bundle", "sign", "b.tar.gz", "--key", "keys/bundle.key", "--revision", "7"]
    assert main(sign) == EXIT_OK
    assert "revision number 7" in capsys.readouterr().err
    assert main(["bundle", "verify", "b.tar.gz", "--pubkey", "keys/bundle.pub"]) == EXIT_OK
    assert "revision number 7" in capsys.readouterr().err
    for bad, said in (
        (["--revision", "0"], "a revision number is 1 to"),
        (["--revision", "x"], "not a whole number"),
        (["--expires-at", "tomorrow"], "not an RFC 3339 UTC time"),
    ):
        assert main(["bundle", "build", "pol", "-o", "c.tar.gz", *bad]) == EXIT_USAGE
        assert said in capsys.readouterr().err
    assert not (in_tmp / "c.tar.gz").exists()
