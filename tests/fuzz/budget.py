"""How hard the fuzzers try: bounded and derandomised in ``make test``, 10⁵ inputs per
surface with ``make fuzz`` (``KILO_RULES_FUZZ_EXAMPLES`` sets the count)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("KILO_RULES_FUZZ_EXAMPLES", "150"))
FUZZING = "KILO_RULES_FUZZ_EXAMPLES" in os.environ

#: Use as ``@FUZZ`` on every ``@given`` test under tests/fuzz.
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=not FUZZING,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
