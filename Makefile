.PHONY: run test setup bench
run:   ## set up and run web + workers + scheduler (embedded PostgreSQL + Redis by default); options: ARGS="--port 8001"
	scripts/run $(ARGS)
test:  ## set up and run ruff, mypy, Django checks and the test suite; pytest options: ARGS="tests/runner -x"
	scripts/test $(ARGS)
setup:
	scripts/setup
bench: setup
	.venv/bin/python benchmarks/worker_throughput.py
