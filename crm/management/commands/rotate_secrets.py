from __future__ import annotations

from django.core.management.base import BaseCommand

from crm import crypto


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored secret under the current ENCRYPTION_KEY. Rotation: set the new key "
        "in ENCRYPTION_KEY and the old one in ENCRYPTION_OLD_KEYS, deploy, run this, then drop the old key."
    )

    def handle(self, *args, **options) -> None:
        result = crypto.rotate()
        for field, rows in result.items():
            self.stdout.write(f"{field}: {rows} re-encrypted")
        self.stdout.write(
            f"current key {crypto.current_key_id()}: {sum(result.values())} secrets re-encrypted"
        )
