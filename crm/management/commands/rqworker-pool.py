"""django-rq's `rqworker-pool` refuses in one line: the product's pool is `manage.py workers`."""

from __future__ import annotations

from crm import cli


class Command(cli.RefusedCommand):
    help = refusal = (
        "the product's worker pool is `manage.py workers --processes N`: rqworker-pool is not used here"
    )
