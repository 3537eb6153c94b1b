"""How a server of kilo-rules listens and who may call it: the settings the sidecar
(``KILO_RULES_SERVE_*``) and the gateway (``KILO_RULES_GATEWAY_*``) share, typed once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode

__all__ = ["ListenSettings", "split_commas"]


def split_commas(value: Any) -> Any:
    """A comma-separated setting (as the environment writes it) as a tuple."""
    if isinstance(value, str):
        return tuple(p.strip() for p in value.split(",") if p.strip())
    return value


class ListenSettings(BaseSettings):
    """The address, the connection bounds and the access rules of one server."""

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on (0: any free).")
    head_timeout: float = Field(
        10.0, gt=0, allow_inf_nan=False, description="Seconds a request head may take."
    )
    body_timeout: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="Seconds a request body may take."
    )
    keep_alive_timeout: int = Field(5, ge=1, description="Seconds an idle connection is kept.")
    max_connections: int = Field(
        1000, ge=1, description="Connections past which new requests are answered 503."
    )
    token_file: Path | None = Field(
        None, description="File of bearer tokens callers may present, one a line."
    )
    tokens: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Bearer tokens callers may present (comma-separated).", repr=False
    )
    no_auth: bool = Field(False, description="Let anyone who reaches the socket call.")
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Host header values answered (comma-separated)."
    )
    open_probes: bool = Field(False, description="/healthz, /readyz, /metrics without a token.")
    cors_origins: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Browser origins allowed to call (comma-separated)."
    )

    @field_validator("tokens", "allowed_hosts", "cors_origins", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        return split_commas(value)
