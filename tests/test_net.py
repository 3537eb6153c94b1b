"""The network policy (kilo_rules.engine.base.net), alone and behind instruction URLs, against a
hostile server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kilo_rules.engine.base.errors import KiloRulesError, NetworkError
from kilo_rules.engine.base.net import (
    NetClient,
    NetworkSettings,
    UrlCache,
    is_public_address,
    network_settings,
    use_network,
)
from kilo_rules.engine.compiler.compile import compile_policy
from kilo_rules.engine.formats.policy import Instructions
from kilo_rules.engine.runtime.apply import apply_plan
from kilo_rules.engine.runtime.context import StepInput, Workspace
from kilo_rules.engine.runtime.system import instructions_text
from kilo_rules.engine.runtime.trace import Decision

from .hostile_server import BOMB_DECODED, HostileServer, elapsed, hostile
from .runtime.helpers import model, session, user

__all__ = ["hostile"]  # the fixture, imported for pytest

LOCAL = NetworkSettings(private_hosts=("127.0.0.1",))
MB = 1024 * 1024


def code_of(info: pytest.ExceptionInfo[NetworkError]) -> str:
    return info.value.diagnostic.code


def public(host: str, timeout: float) -> list[str]:
    """A resolver for made-up names: every one is a public address."""
    return ["93.184.215.14"]


# ------------------------------------------------------------------------ the policy rules


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "127.0.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "224.0.0.1",
        "240.0.0.1",
        "0.0.0.0",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff0e::1",
        "::ffff:127.0.0.1",
        "::ffff:10.1.2.3",
        "not an address",
    ],
)
def test_non_public_addresses(address: str) -> None:
    assert not is_public_address(address)


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses(address: str) -> None:
    assert is_public_address(address)


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/rules.md", "gopher://x/", "/relative"]
)
def test_other_schemes_are_refused(url: str) -> None:
    with pytest.raises(NetworkError) as info:
        NetClient(NetworkSettings(allow_private=True)).get_text(url)
    assert code_of(info) == "net.scheme"
    assert isinstance(info.value, KiloRulesError)


def test_loopback_is_refused_unless_allowed(hostile: HostileServer) -> None:
    url = f"{hostile.base_url}/text"
    with pytest.raises(NetworkError) as info:
        NetClient(NetworkSettings()).get_text(url)
    assert code_of(info) == "net.address"
    assert info.value.diagnostic.details["address"] == "127.0.0.1"
    assert hostile.hits["text"] == 0  # refused before connecting
    assert NetClient(NetworkSettings(allow_private=True)).get_text(url) == "Use tabs."
    assert NetClient(LOCAL).get_text(url) == "Use tabs."
    assert NetClient(NetworkSettings(), private_hosts=["127.0.0.1"]).get_text(url) == "Use tabs."


def test_every_resolved_address_is_checked() -> None:
    def mixed(host: str, timeout: float) -> list[str]:
        return ["93.184.215.14", "10.0.0.7"]

    with pytest.raises(NetworkError) as info:
        NetClient(NetworkSettings(), resolve=mixed).check("https://rebind.example/")
    assert code_of(info) == "net.address"
    assert info.value.diagnostic.details["address"] == "10.0.0.7"


def test_allowed_hosts_exact_and_suffix() -> None:
    client = NetClient(
        NetworkSettings(allowed_hosts=("Rules.Example.", "*.corp.example")), resolve=public
    )
    assert client.check("https://rules.example/a") == ["93.184.215.14"]
    assert client.check("https://a.b.corp.example/a") == ["93.184.215.14"]
    for url in ("https://corp.example/", "https://evilcorp.example/", "https://other.example/"):
        with pytest.raises(NetworkError) as info:
            client.check(url)
        assert code_of(info) == "net.host", url


def test_a_name_that_does_not_resolve_is_a_host_error() -> None:
    def nothing(host: str, timeout: float) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(NetworkError) as info:
        NetClient(NetworkSettings(), resolve=nothing).check("https://nowhere.invalid/")
    assert code_of(info) == "net.host"


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILO_RULES_NET_ALLOWED_HOSTS", "a.example, *.b.example")
    monkeypatch.setenv("KILO_RULES_NET_PRIVATE_HOSTS", '["127.0.0.1"]')
    monkeypatch.setenv("KILO_RULES_NET_SCHEMES", "https")
    monkeypatch.setenv("KILO_RULES_NET_MAX_BYTES", "1000")
    s = NetworkSettings()
    assert s.allowed_hosts == ("a.example", "*.b.example")
    assert s.private_hosts == ("127.0.0.1",)
    assert s.schemes == ("https",)
    assert s.max_bytes == 1000
    assert NetworkSettings.model_fields["allow_private"].default is False


# ------------------------------------------------------------------- deadline and size


def test_a_drip_is_cut_by_the_total_deadline(hostile: HostileServer) -> None:
    start = time.monotonic()
    with pytest.raises(NetworkError) as info:
        NetClient(LOCAL).get_text(f"{hostile.base_url}/drip", deadline=1.0)
    took = elapsed(start)
    assert code_of(info) == "net.deadline"
    assert 0.9 <= took < 2.0  # one byte every 0.2 s would take 200 s


def test_the_deadline_holds_when_a_read_stalls_near_its_end(hostile: HostileServer) -> None:
    start = time.monotonic()
    with pytest.raises(NetworkError) as info:
        NetClient(LOCAL).get_text(f"{hostile.base_url}/stall", deadline=1.0)
    assert code_of(info) == "net.deadline"
    assert elapsed(start) < 1.5  # without the watchdog the read would wait until ~1.8 s


def test_a_gzip_bomb_stops_at_the_decoded_cap(hostile: HostileServer) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(NetworkError) as info:
            NetClient(LOCAL).get_text(f"{hostile.base_url}/bomb", max_bytes=MB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code_of(info) == "net.too-large"
    assert info.value.diagnostic.details["measured"] == "decoded"
    assert peak < 8 * MB < BOMB_DECODED // 20  # the 200 MB were never expanded


def test_the_wire_cap_holds_without_a_content_length(hostile: HostileServer) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(NetworkError) as info:
            NetClient(LOCAL).get_text(f"{hostile.base_url}/flood", max_bytes=MB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code_of(info) == "net.too-large"
    assert info.value.diagnostic.details["measured"] == "on the wire"
    assert peak < 8 * MB


def test_a_declared_length_over_the_cap_is_refused_unread(hostile: HostileServer) -> None:
    with pytest.raises(NetworkError) as info:
        NetClient(LOCAL).get_text(f"{hostile.base_url}/big", max_bytes=MB)
    assert info.value.diagnostic.details["measured"] == "content-length"


def test_status_and_default_limits(hostile: HostileServer) -> None:
    with pytest.raises(NetworkError) as info:
        NetClient(LOCAL).get_text(f"{hostile.base_url}/nothing-here")
    assert code_of(info) == "net.status"
    assert info.value.diagnostic.details["status"] == 404
    reply = NetClient(LOCAL).request("GET", f"{hostile.base_url}/nothing-here")
    assert reply.status_code == 404 and reply.text == "not found"


def test_the_connection_goes_to_the_checked_address(hostile: HostileServer) -> None:
    # "pinned.test" has no DNS entry: only the checked address can be what was reached.
    def local(host: str, timeout: float) -> list[str]:
        return ["127.0.0.1"]

    port = hostile.server_address[1]
    client = NetClient(NetworkSettings(private_hosts=("pinned.test",)), resolve=local)
    assert client.get_text(f"http://pinned.test:{port}/text") == "Use tabs."
    assert hostile.host_headers == [f"pinned.test:{port}"]


# ---------------------------------------------------------------------------- redirects


def test_a_redirect_to_a_private_address_is_refused(hostile: HostileServer) -> None:
    with pytest.raises(NetworkError) as info:
        NetClient(LOCAL).get_text(f"{hostile.base_url}/redirect")
    assert code_of(info) == "net.redirect"
    assert info.value.diagnostic.details["refused"] == "net.address"
    assert "169.254.169.254" in info.value.diagnostic.message


def test_a_redirect_to_a_host_not_allowed_is_refused(hostile: HostileServer) -> None:
    port = hostile.server_address[1]
    hostile.redirect_to = f"http://localhost:{port}/text"
    settings = NetworkSettings(allowed_hosts=("127.0.0.1",), allow_private=True)
    with pytest.raises(NetworkError) as info:
        NetClient(settings).get_text(f"{hostile.base_url}/redirect")
    assert code_of(info) == "net.redirect"
    assert info.value.diagnostic.details["refused"] == "net.host"
    assert hostile.hits["text"] == 0


def test_allowed_redirects_are_followed_up_to_the_hop_limit(hostile: HostileServer) -> None:
    hostile.redirect_to = f"{hostile.base_url}/text"
    assert NetClient(LOCAL).get_text(f"{hostile.base_url}/redirect") == "Use tabs."
    hostile.redirect_to = f"{hostile.base_url}/redirect"  # a loop
    settings = NetworkSettings(private_hosts=("127.0.0.1",), max_redirects=3)
    with pytest.raises(NetworkError, match="more than 3 redirects"):
        NetClient(settings).get_text(f"{hostile.base_url}/redirect")
    assert hostile.hits["redirect"] == 1 + 4


def test_redirect_headers_methods_and_downgrade() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        routes = {
            "/start": (307, "https://other.example/kept"),
            "/see-other": (303, "/done"),
            "/down": (302, "http://a.example/plain"),
        }
        if request.url.path in routes:
            status, location = routes[request.url.path]
            return httpx.Response(status, headers={"location": location})
        return httpx.Response(200, text="ok")

    client = NetClient(NetworkSettings(), transport=httpx.MockTransport(handler), resolve=public)
    headers = {"authorization": "Bearer secret", "content-type": "application/json"}
    client.request("POST", "https://a.example/start", headers=headers, content=b"{}")
    assert [r.method for r in seen] == ["POST", "POST"]  # 307 keeps the method and body
    assert seen[1].content == b"{}"
    assert "authorization" not in seen[1].headers  # not sent to another origin
    seen.clear()
    client.request("POST", "https://a.example/see-other", headers=headers, content=b"{}")
    assert [(r.method, r.url.path) for r in seen] == [("POST", "/see-other"), ("GET", "/done")]
    assert seen[1].headers["authorization"] == "Bearer secret"  # same origin
    with pytest.raises(NetworkError, match="from https to http") as info:
        client.get_text("https://a.example/down")
    assert code_of(info) == "net.redirect"


# ---------------------------------------------------------------------------- the cache


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_url_cache_ttl_and_negative_ttl() -> None:
    clock = FakeClock()
    cache: UrlCache[str] = UrlCache(4, negative_ttl=5.0, clock=clock)
    calls: list[str] = []

    def ok() -> str:
        calls.append("ok")
        return f"v{len(calls)}"

    def fail() -> str:
        calls.append("fail")
        raise ValueError("down")

    assert cache.get("a", 60, ok) == "v1"
    clock.now = 59.0
    assert cache.get("a", 60, ok) == "v1"
    clock.now = 60.0
    assert cache.get("a", 60, ok) == "v2"
    assert cache.get("a", 0, ok) == "v3"  # 0: always fetched
    calls.clear()
    with pytest.raises(ValueError):
        cache.get("b", 60, fail)
    clock.now = 64.0
    with pytest.raises(ValueError):
        cache.get("b", 60, fail)  # the failure is remembered ...
    assert calls == ["fail"]
    clock.now = 65.0
    with pytest.raises(ValueError):
        cache.get("b", 60, fail)  # ... for the negative TTL only
    assert calls == ["fail", "fail"]
    for key in "cdefg":
        cache.get(key, 60, ok)
    assert len(cache._entries) == 4  # bounded


def test_url_cache_fetches_once_for_concurrent_callers() -> None:
    cache: UrlCache[str] = UrlCache()
    calls: list[int] = []

    def slow() -> str:
        calls.append(1)
        time.sleep(0.2)
        return "text"

    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get("k", 60, slow))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == ["text"] * 8 and len(calls) == 1


# --------------------------------------------------------------------- instruction URLs


def instructions(*urls: str, timeout: float = 5.0, cap: int = 262_144) -> Instructions:
    return Instructions(urls=urls, url_timeout_seconds=timeout, url_max_bytes=cap)


def url_warnings(settings: Instructions) -> list[dict[str, object]]:
    _, _, decisions = instructions_text(settings, StepInput())
    return [d for d in decisions if "warning" in d]


@pytest.fixture
def local_ok() -> Iterator[None]:
    """The operator allows the test server's loopback address."""
    with use_network(NetworkSettings(private_hosts=("127.0.0.1",))):
        yield


def test_instruction_url_on_loopback_is_refused_by_default(hostile: HostileServer) -> None:
    [warning] = url_warnings(instructions(f"{hostile.base_url}/text"))
    assert warning["code"] == "net.address"
    assert hostile.hits["text"] == 0


def test_instruction_url_allowed_by_the_operator(
    hostile: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with use_network(NetworkSettings(allow_private=True)):
        text, loaded, _ = instructions_text(instructions(f"{hostile.base_url}/text"), StepInput())
    assert loaded == [f"{hostile.base_url}/text"]
    assert text.endswith("\nUse tabs.")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/rules.md"])
def test_instruction_url_schemes(url: str, local_ok: None) -> None:
    [warning] = url_warnings(instructions(url))
    assert warning["code"] == "net.scheme"


def test_instruction_url_drip_is_cut_by_the_deadline(
    hostile: HostileServer, local_ok: None
) -> None:
    start = time.monotonic()
    [warning] = url_warnings(instructions(f"{hostile.base_url}/drip", timeout=1.0))
    assert warning["code"] == "net.deadline"
    assert elapsed(start) < 2.0


def test_instruction_url_gzip_bomb_is_refused(hostile: HostileServer, local_ok: None) -> None:
    tracemalloc.start()
    try:
        [warning] = url_warnings(instructions(f"{hostile.base_url}/bomb", cap=MB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert warning["code"] == "net.too-large"
    assert peak < 8 * MB


def test_instruction_url_redirect_and_size(hostile: HostileServer, local_ok: None) -> None:
    warnings = url_warnings(
        instructions(f"{hostile.base_url}/redirect", f"{hostile.base_url}/big", cap=MB)
    )
    assert [w["code"] for w in warnings] == ["net.redirect", "net.too-large"]


def _policy(tmp_path: Path, url: str, ttl: float, timeout: float = 5.0) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(
        "version: 1\nname: p\nextends: kilo-default\nsystem:\n  instructions:\n"
        f"    urls: [{url!r}]\n    url_ttl_seconds: {ttl}\n    url_timeout_seconds: {timeout}\n"
    )
    return p


def _replay(tmp_path: Path, plan_path: Path, steps: int) -> list[list[Decision]]:
    """The instruction-URL decisions of each of ``steps`` steps of one turn."""
    plan = compile_policy(plan_path, model())
    warnings = []
    for step in range(1, steps + 1):
        ws = Workspace(cwd=str(tmp_path))
        result = apply_plan(plan, session(user("u1", "hi")), StepInput(workspace=ws, step=step))
        warnings.append([d for d in result.decisions if d.rule == "instructions.url"])
    return warnings


def test_instruction_url_is_fetched_once_within_its_ttl(
    hostile: HostileServer, local_ok: None, tmp_path: Path
) -> None:
    _replay(tmp_path, _policy(tmp_path, f"{hostile.base_url}/text", 300), 6)
    assert hostile.hits["text"] == 1


def test_instruction_url_ttl_zero_fetches_every_step(
    hostile: HostileServer, local_ok: None, tmp_path: Path
) -> None:
    _replay(tmp_path, _policy(tmp_path, f"{hostile.base_url}/text", 0), 4)
    assert hostile.hits["text"] == 4


def test_a_hanging_instruction_url_costs_one_deadline_not_one_per_step(
    hostile: HostileServer, local_ok: None, tmp_path: Path
) -> None:
    start = time.monotonic()
    steps = _replay(tmp_path, _policy(tmp_path, f"{hostile.base_url}/drip", 300, 1.0), 12)
    assert elapsed(start) < 6.0  # 12 deadlines would be 12 s
    assert hostile.hits["drip"] == 1
    assert all(len(s) == 1 for s in steps)  # every step still records the warning
    assert {s[0].severity for s in steps} == {"warning"}


def test_the_library_reads_no_environment_the_cli_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILO_RULES_NET_ALLOW_PRIVATE", "true")
    assert network_settings().allow_private is False  # a program passes its own policy
    with use_network(NetworkSettings()):  # what the CLI does around every command
        assert network_settings().allow_private is True
    assert network_settings() == NetworkSettings.model_construct()
