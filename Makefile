# Two commands matter (see README): `make demo` runs the main job on the bundled default
# policy, `make test` runs the whole suite (`make test-fast`, the tier without the slow
# tests, while working). Each builds its own virtualenv in .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-fast bench fuzz clean

$(BIN)/kilo-rules: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(BIN)/kilo-rules
	$(BIN)/kilo-rules demo

# pytest-xdist spreads the tests over one worker per core. Work stealing keeps both busy
# to the end: the conftest puts the tests marked slow first, so the long ones do not
# start last and leave one core idle while they finish.
PYTEST_PARALLEL = $(BIN)/pytest -q -n auto --dist worksteal

test: $(BIN)/kilo-rules
	$(BIN)/ruff check kilo_rules tests benchmarks
	$(BIN)/ruff format --check kilo_rules tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(PYTEST_PARALLEL)

# The unit tier: everything but the tests marked slow (whole recorded sessions replayed,
# corpus runs, the browser, Dask, long property searches). `make test` is still the gate.
test-fast: $(BIN)/kilo-rules
	$(PYTEST_PARALLEL) -m "not slow"

# Every untrusted surface with 10^5 generated inputs, shared among the surface's tests
# (make test runs a derandomised few). Each importer is a surface of its own.
FUZZ_RUN = $(BIN)/pytest -q -p no:cacheprovider --hypothesis-show-statistics
fuzz: $(BIN)/kilo-rules
	KILO_RULES_FUZZ_EXAMPLES=16667  $(FUZZ_RUN) tests/fuzz/test_fuzz_policy.py      # 6 tests
	KILO_RULES_FUZZ_EXAMPLES=25000  $(FUZZ_RUN) tests/fuzz/test_fuzz_expr.py        # 4 tests
	KILO_RULES_FUZZ_EXAMPLES=100000 $(FUZZ_RUN) tests/fuzz/test_fuzz_config.py      # 1 test
	KILO_RULES_FUZZ_EXAMPLES=33334  $(FUZZ_RUN) tests/fuzz/test_fuzz_session.py     # 3 tests
	KILO_RULES_FUZZ_EXAMPLES=33334  $(FUZZ_RUN) tests/fuzz/test_fuzz_summarizer.py  # 3 tests
	KILO_RULES_FUZZ_EXAMPLES=50000  $(FUZZ_RUN) tests/fuzz/test_fuzz_importers.py   # 2 per importer
	KILO_RULES_FUZZ_EXAMPLES=25000  $(FUZZ_RUN) tests/fuzz/test_fuzz_routes.py      # 4 tests
	KILO_RULES_FUZZ_EXAMPLES=25000  $(FUZZ_RUN) tests/fuzz/test_fuzz_bundle.py      # 4 tests
	KILO_RULES_FUZZ_EXAMPLES=33334  $(FUZZ_RUN) tests/fuzz/test_fuzz_simulate_report.py  # 3 tests
	KILO_RULES_FUZZ_EXAMPLES=33334  $(FUZZ_RUN) tests/fuzz/test_fuzz_serve.py       # 3 tests
	KILO_RULES_FUZZ_EXAMPLES=33334  $(FUZZ_RUN) tests/fuzz/test_fuzz_workspace_reads.py  # 3 tests
	KILO_RULES_FUZZ_EXAMPLES=25000  $(FUZZ_RUN) tests/fuzz/test_fuzz_policytest.py  # 4 tests

bench: $(BIN)/kilo-rules
	$(BIN)/python benchmarks/bench_expr.py
	$(BIN)/python benchmarks/bench_tokens.py
	$(BIN)/python benchmarks/bench_runtime.py
	$(BIN)/python benchmarks/bench_compile.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
