"""``KILO_RULES_GATEWAY_*``: the gateway's settings, typed once (its options win over them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import httpx
from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from kilo_rules.tools.serving.listen import ListenSettings, split_commas

__all__ = ["GatewaySettings"]


def _default_ledger() -> Path:
    from kilo_rules.tools.serving.store import default_cache_dir

    # Beside the bundle cache, not in it.
    return default_cache_dir().parent / "gateway" / "ledger.sqlite3"


class GatewaySettings(ListenSettings):
    """Where the gateway forwards, what it keeps, and its bounds (its options win)."""

    model_config = SettingsConfigDict(env_prefix="KILO_RULES_GATEWAY_", extra="ignore", frozen=True)

    port: int = Field(8787, ge=0, le=65535, description="Port to listen on (0: any free).")
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Worker processes answering on the one socket (1: the server is this "
        "process; more need os.fork).",
    )

    anthropic_url: str = Field(
        "https://api.anthropic.com",
        description="Base URL of the Anthropic upstream (/v1/messages is appended).",
    )
    openai_url: str = Field(
        "https://api.openai.com",
        description="Base URL of the OpenAI upstream (/v1/chat/completions, /v1/responses).",
    )
    ledger: Path | None = Field(
        default_factory=_default_ledger,
        description="The SQLite compaction ledger (created if missing).",
    )
    ledger_ttl_seconds: float = Field(
        7 * 86400, gt=0, allow_inf_nan=False, description="Entries expire after this idle."
    )
    ledger_max_entries: int = Field(100_000, ge=1, description="Entries kept at most.")
    tenant_header: str | None = Field(
        None,
        description="Request header naming the tenant (default: a hash of the API key).",
    )
    models: Path | None = Field(
        None,
        description="A YAML/JSON list of model descriptors (as in the catalog) for model ids "
        "the catalog does not know, or to override its limits.",
    )
    max_body_bytes: int = Field(32 << 20, ge=1, description="Largest request body accepted.")
    max_reply_bytes: int = Field(
        64 << 20, ge=1, description="Largest upstream reply relayed (a stream included)."
    )
    connect_timeout: float = Field(10.0, gt=0, allow_inf_nan=False)
    upstream_timeout: float = Field(
        600.0, gt=0, allow_inf_nan=False, description="Seconds an upstream may go silent."
    )
    prepare_timeout: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="Seconds managing one request may take."
    )
    decision_log: Path | None = Field(None, description="File to append one line per request.")
    retry_overflow: bool = Field(
        True, description="Compact and retry once when the upstream says the prompt is too long."
    )
    passthrough_paths: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Paths never managed, only relayed (comma-separated)."
    )

    @field_validator("anthropic_url", "openai_url")
    @classmethod
    def _url(cls, value: str) -> str:
        url = httpx.URL(value)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"{value!r}: an upstream is an http:// or https:// base URL")
        if url.query or url.fragment:
            raise ValueError(f"{value!r}: an upstream base URL has no query or fragment")
        return value.rstrip("/")

    @field_validator("passthrough_paths", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return split_commas(value)
