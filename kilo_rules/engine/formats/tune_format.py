"""Tune v1: the typed model of a tune file, the single source of ``schemas/tune.v1.json``.

A tune file names a base policy, a model and recorded sessions, and lists candidate values
for some of the policy's knobs; ``kilo-rules tune`` (:mod:`kilo_rules.tools.simulation.tune`)
replays the sessions under every combination and keeps the cheapest one that meets the constraints::

    version: 1
    base: kilo-default
    model: anthropic/claude-sonnet-4-5
    sessions: [logs/*.jsonl]
    constraints: {max_overflows: 0, max_compactions: 3}
    knobs:
      compaction.tail_turns: [1, 2, 3]
      compaction.preserve_recent_tokens: {min: 4000, max: 16000, step: 4000}
    search: {method: grid, max_candidates: 500}

The models here hold no behaviour: they live apart from the engine so that the schema
generator, low in the layers, can read them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, StringConstraints

__all__ = [
    "KNOB_PATH_PATTERN",
    "MAX_CANDIDATES",
    "Constraints",
    "KnobRange",
    "KnobValue",
    "Search",
    "TuneFile",
]

#: The most candidates one tune file may ask for (``search.max_candidates`` is at most
#: this): each candidate is a whole replay of every session.
MAX_CANDIDATES = 10_000

#: A knob: a dotted path of policy keys (``compaction.tail_turns``).
KNOB_PATH_PATTERN = r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$"

_REF_MAX = 1024

#: A candidate value: what a policy may write for one setting (an expression is a string).
KnobValue = int | float | bool | str | None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KnobRange(_Model):
    """Evenly spaced numbers from ``min`` to ``max`` (included when a step lands on it)."""

    min: int | float = Field(description="The first value.")
    max: int | float = Field(description="The last value at most (min <= max).")
    step: PositiveInt | PositiveFloat = Field(
        description="The distance between two values (> 0). Integers when min, max and step "
        "all are.",
    )


class Constraints(_Model):
    """What a candidate must do on the sessions to be kept (feasible)."""

    max_overflows: int = Field(
        0,
        ge=0,
        description="Provider overflows (requests over the window, rejected and compacted) "
        "summed over every session, at most (default 0).",
    )
    max_compactions: int | None = Field(
        None,
        ge=0,
        description="Compactions in any one session, at most (default: unbounded).",
    )
    allow_stopped: bool = Field(
        False,
        description="Whether a replay that stopped early (its compaction exhausted) may "
        "still be kept; its cost then covers only the requests it built (default false).",
    )


class Search(_Model):
    """Which combinations of the knobs' values are tried."""

    method: Literal["grid", "random"] = Field(
        "grid",
        description="grid: every combination, the first knob varying slowest; random: "
        "`samples` distinct combinations drawn with `seed`.",
    )
    samples: int = Field(
        50, ge=1, description="random: how many combinations to draw (at most all of them)."
    )
    seed: int = Field(1, description="random: the seed of the draw (the same seed, the same draw).")
    max_candidates: int = Field(
        500,
        ge=1,
        le=MAX_CANDIDATES,
        description="A bound on the combinations (grid) or samples (random); more is an error, "
        "not a truncated search. The baseline is not counted.",
    )


KnobPath = Annotated[str, StringConstraints(pattern=KNOB_PATH_PATTERN, max_length=256)]
KnobValues = Annotated[list[KnobValue], Field(min_length=1, max_length=MAX_CANDIDATES)]


class TuneFile(_Model):
    """A tune file (Tune v1)."""

    version: Literal[1] = Field(description="Tune format version.")
    base: str = Field(
        min_length=1,
        max_length=_REF_MAX,
        description="The policy tuned: a bundled policy name (e.g. kilo-default) or a path to "
        "a policy file relative to the tune file (a path holds a / or ends in .yaml/.yml).",
    )
    model: str = Field(
        min_length=1,
        max_length=_REF_MAX,
        description="The model replayed: a catalog id (e.g. anthropic/claude-sonnet-4-5) or a "
        "YAML/JSON model file relative to the tune file. It must have prices.",
    )
    sessions: list[Annotated[str, StringConstraints(min_length=1, max_length=_REF_MAX)]] = Field(
        min_length=1,
        description="Recorded sessions: files, folders (every .json, .jsonl and .traj below) "
        "and globs, relative to the tune file.",
    )
    calibrate: bool = Field(
        False,
        description="Replay with the calibration fitted on each session's recorded usage "
        "(simulate --calibrate); a session whose log records no usage then fails.",
    )
    constraints: Constraints = Field(
        default_factory=Constraints, description="What a candidate must do to be kept."
    )
    knobs: dict[KnobPath, KnobValues | KnobRange] = Field(
        min_length=1,
        # Closed, as every mapping of the file: a key that is not a dotted path is refused.
        json_schema_extra={"additionalProperties": False},
        description="Dotted policy paths (compaction.tail_turns) mapped to their candidate "
        "values: a list (numbers, booleans, null, strings; expressions are strings) or a "
        "range {min, max, step}.",
    )
    search: Search = Field(
        default_factory=Search, description="Which combinations of the values are tried."
    )
