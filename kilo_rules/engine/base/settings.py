"""Environment settings (pydantic-settings): what an operator can set without a policy.

They become the ``config.*`` names policies read. The CLI reads them; a program passes
them on with ``compile_policy(policy, model, config=Settings().config())``. The library
functions never read the environment themselves, so they stay pure.

| variable | config name | meaning |
|---|---|---|
| ``KILO_RULES_POLICY`` | — | default policy for the CLI (bundled name or path) |
| ``KILO_RULES_OUTPUT_TOKEN_MAX`` | ``config.output_token_max`` | output-token ceiling |
| ``KILO_RULES_COMPACTION_RESERVED`` | ``config.compaction.reserved`` | tokens reserved |
| ``KILO_RULES_THRESHOLD_PERCENT`` | ``config.compaction.threshold_percent`` | compact at % |
| ``KILO_RULES_DISABLE_AUTOCOMPACT`` | ``config.compaction.auto`` | false: never compact |
| ``KILO_RULES_DISABLE_PRUNE`` | ``config.compaction.prune`` | false: never prune |
| ``KILO_RULES_READ_ROOTS`` | — | more directories policies may read files under |

Kilo's own ``KILO_DISABLE_AUTOCOMPACT`` and ``KILO_DISABLE_PRUNE`` are read too.

Each ``config.*`` name takes its type and range from the field it stands for
(:data:`CONFIG_FIELDS`), so ``--config output_token_max=-5`` is refused exactly as
``KILO_RULES_OUTPUT_TOKEN_MAX=-5`` is; :func:`check_config` does the checking.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Annotated, Any

from pydantic import AliasChoices, Field, TypeAdapter, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kilo_rules.engine.base.errors import Diagnostic, Location, PolicyError, did_you_mean


class Settings(BaseSettings):
    """``KILO_RULES_*`` environment variables (and Kilo's own ``KILO_DISABLE_*``)."""

    model_config = SettingsConfigDict(env_prefix="KILO_RULES_", extra="ignore")

    policy: str = Field("kilo-default", description="Default policy for the CLI.")
    output_token_max: int | None = Field(None, gt=0, description="Output-token ceiling.")
    compaction_reserved: int | None = Field(None, ge=0, description="Tokens reserved.")
    threshold_percent: float | None = Field(
        None, gt=0, le=100, allow_inf_nan=False, description="Compact at %."
    )
    disable_autocompact: bool = Field(
        False,
        validation_alias=AliasChoices("KILO_RULES_DISABLE_AUTOCOMPACT", "KILO_DISABLE_AUTOCOMPACT"),
        description="Never compact automatically.",
    )
    disable_prune: bool = Field(
        False,
        validation_alias=AliasChoices("KILO_RULES_DISABLE_PRUNE", "KILO_DISABLE_PRUNE"),
        description="Never prune tool outputs.",
    )
    read_roots: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="More directories policies may read files under (os.pathsep-separated).",
    )

    @field_validator("read_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        # A search-path list, as PATH is: the environment cannot carry JSON comfortably.
        if isinstance(value, str):
            return tuple(p for p in value.split(os.pathsep) if p)
        return value

    def config(self) -> dict[str, Any]:
        """The ``config.*`` values these settings stand for (unset ones omitted)."""
        out: dict[str, Any] = {}
        for name, (field, inverted) in CONFIG_FIELDS.items():
            value = getattr(self, field)
            if inverted:
                # A switch only ever turns the behaviour off; unset leaves it to the policy.
                if value:
                    out[name] = False
            elif value is not None:
                out[name] = value
        return out


#: Every ``config.*`` name: the settings field that types it, and whether the name means
#: the opposite of the field (``config.compaction.auto`` is ``not disable_autocompact``).
CONFIG_FIELDS: dict[str, tuple[str, bool]] = {
    "config.output_token_max": ("output_token_max", False),
    "config.compaction.auto": ("disable_autocompact", True),
    "config.compaction.reserved": ("compaction_reserved", False),
    "config.compaction.threshold_percent": ("threshold_percent", False),
    "config.compaction.prune": ("disable_prune", True),
}

_CONFIG_AT = Location("<config>", 1, 1)


@cache
def _adapter(name: str) -> TypeAdapter[Any]:
    field, _ = CONFIG_FIELDS[name]
    info = Settings.model_fields[field]
    typed: Any = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    return TypeAdapter(typed)


def _short(name: str) -> str:
    return name.removeprefix("config.")


def _value_problem(name: str, value: Any) -> tuple[Any, str | None]:
    numeric = not CONFIG_FIELDS[name][1]
    if numeric and isinstance(value, str):
        with contextlib.suppress(ValueError):
            value_f = float(value)
            if not math.isfinite(value_f):
                return None, f"must be a finite number, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return None, f"must be a finite number, got {value!r}"
    if numeric and isinstance(value, bool):
        return None, f"must be a number, got {value!r}"
    try:
        return _adapter(name).validate_python(value), None
    except ValidationError as exc:
        return None, f"{exc.errors()[0]['msg'].lower()} (got {value!r})"


def check_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (``config.*`` names, or the same without the prefix) checked against
    their types and ranges and converted (``"8000"`` → 8000); None leaves a name unset.
    Raises :class:`PolicyError` with one diagnostic per bad name or value."""
    out: dict[str, Any] = {}
    problems: list[Diagnostic] = []
    for key, value in values.items():
        name = key if key.startswith("config.") else f"config.{key}"
        if name not in CONFIG_FIELDS:
            guess = did_you_mean(_short(name), [_short(n) for n in CONFIG_FIELDS])
            problems.append(
                Diagnostic(
                    "config.unknown-key",
                    f"unknown config name {_short(name)!r}",
                    _CONFIG_AT,
                    hint=(f"did you mean {guess!r}? " if guess else "")
                    + "known: "
                    + ", ".join(_short(n) for n in CONFIG_FIELDS),
                )
            )
            continue
        if value is None:
            out[name] = None
            continue
        checked, why = _value_problem(name, value)
        if why is not None:
            problems.append(Diagnostic("config.value", f"config {_short(name)}: {why}", _CONFIG_AT))
            continue
        out[name] = checked
    if problems:
        raise PolicyError(problems)
    return out


def parse_config(pairs: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--config``) as checked ``config.*`` values; a value is read
    as the environment variable of the same setting would be (``8000``, ``75.5``,
    ``false``). Raises :class:`PolicyError` naming every bad pair."""
    raw: dict[str, Any] = {}
    problems: list[Diagnostic] = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(
                Diagnostic(
                    "config.syntax",
                    f"--config expects KEY=VALUE, got {pair!r}",
                    _CONFIG_AT,
                    hint="e.g. --config output_token_max=8000",
                )
            )
            continue
        raw[key] = value.strip()
    try:
        checked = check_config(raw)
    except PolicyError as exc:
        problems.extend(exc.diagnostics)
    if problems:
        raise PolicyError(problems)
    return checked
