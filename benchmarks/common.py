"""What the benchmark scripts share (import it after django.setup())."""

from __future__ import annotations


def ensure_database() -> None:
    """Create the database DATABASE_URL names when it does not exist, then migrate it."""
    import django.db
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    settings_db = connection.settings_dict
    try:
        connection.ensure_connection()
    except django.db.OperationalError:
        with psycopg.connect(
            host=settings_db["HOST"],
            port=settings_db["PORT"],
            user=settings_db["USER"],
            dbname="postgres",
            autocommit=True,
        ) as admin:
            admin.execute(f'CREATE DATABASE "{settings_db["NAME"]}"')
    call_command("migrate", verbosity=0)
