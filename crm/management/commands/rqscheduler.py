"""django-rq's `rqscheduler` refuses in one line: the product's scheduler is `manage.py scheduler`."""

from __future__ import annotations

from crm import cli


class Command(cli.RefusedCommand):
    help = refusal = "the product's scheduler is `manage.py scheduler`: rqscheduler is not used here"
