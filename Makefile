.PHONY: run test setup bench
run:   ## set up and run web + workers + scheduler (embedded SQLite + Redis by default)
	scripts/run
test:  ## set up and run ruff, mypy, Django checks and the test suite
	scripts/test
setup:
	scripts/setup
bench: setup
	.venv/bin/python benchmarks/worker_throughput.py
