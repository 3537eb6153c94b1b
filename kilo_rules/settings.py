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

Kilo's own ``KILO_DISABLE_AUTOCOMPACT`` and ``KILO_DISABLE_PRUNE`` are read too.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """``KILO_RULES_*`` environment variables (and Kilo's own ``KILO_DISABLE_*``)."""

    model_config = SettingsConfigDict(env_prefix="KILO_RULES_", extra="ignore")

    policy: str = Field("kilo-default", description="Default policy for the CLI.")
    output_token_max: int | None = Field(None, gt=0, description="Output-token ceiling.")
    compaction_reserved: int | None = Field(None, ge=0, description="Tokens reserved.")
    threshold_percent: float | None = Field(None, gt=0, le=100, description="Compact at %.")
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

    def config(self) -> dict[str, Any]:
        """The ``config.*`` values these settings stand for (unset ones omitted)."""
        out: dict[str, Any] = {}
        if self.output_token_max is not None:
            out["config.output_token_max"] = self.output_token_max
        if self.compaction_reserved is not None:
            out["config.compaction.reserved"] = self.compaction_reserved
        if self.threshold_percent is not None:
            out["config.compaction.threshold_percent"] = self.threshold_percent
        if self.disable_autocompact:
            out["config.compaction.auto"] = False
        if self.disable_prune:
            out["config.compaction.prune"] = False
        return out
