"""The project's settings plus one trivial view (`/bench/trivial`), the baseline the intake
benchmark measures in the same run on the same server."""

from crm.settings import *  # noqa: F403

ROOT_URLCONF = "benchmarks.bench_urls"
