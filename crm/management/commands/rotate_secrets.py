from __future__ import annotations

import sys
from typing import Any

from django.utils.translation import gettext as _
from tqdm import tqdm

from crm import cli, crypto


class Command(cli.CrmCommand):
    help = (
        "Re-encrypt every stored secret under the current ENCRYPTION_KEY. Rotation: set the new key "
        "in ENCRYPTION_KEY and the old one in ENCRYPTION_OLD_KEYS, deploy, run this, then drop the old key."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        with tqdm(unit=_(" secrets"), disable=None, file=sys.stderr, dynamic_ncols=True) as bar:

            def progress(field: str, rows: int) -> None:
                bar.set_postfix_str(field, refresh=False)
                bar.update(rows)

            result = crypto.rotate(progress=progress)
        for field, rows in result.items():
            self.stdout.write(
                _("%(field)s: %(count)s re-encrypted") % {"field": field, "count": cli.number(rows)}
            )
        self.stdout.write(
            _("current key %(key)s: %(count)s secrets re-encrypted")
            % {"key": crypto.current_key_id(), "count": cli.number(sum(result.values()))}
        )
