"""Bulk writes Django's ORM makes slow, and what to do after them.

`bulk_update` builds a CASE WHEN per field and row and resolves each as an expression: about
3 ms per row in Python here (1.4 s for 500 messages). `update_rows` sends one
`UPDATE ... FROM unnest(<one array a column>)` per chunk instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from django.db import connection, models, transaction
from django.db.models.fields import AutoFieldMixin


def update_rows(
    model: type[models.Model],
    objs: Sequence[models.Model],
    fields: Sequence[str],
    *,
    only_if: dict[str, Any] | None = None,
    chunk: int = 1000,
) -> int:
    """UPDATE the given fields of each object, matched by primary key; returns rows written.

    only_if={"status": "sending"} writes only rows whose column still holds that value (a
    compare-and-set: a concurrent writer that got there first wins). Each field's values travel as
    one array of the field's column type, or once when every row has the same value: scalar fields
    only (no JSON or array fields)."""
    if not objs:
        return 0
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    columns: list[models.Field] = []
    for name in fields:
        field = meta.get_field(name)
        assert isinstance(field, models.Field)
        columns.append(field)
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    guard_sql, guard_params = "", []  # type: tuple[str, list[Any]]
    for name, value in (only_if or {}).items():
        field = meta.get_field(name)
        assert isinstance(field, models.Field)
        guard_sql += f" AND {table}.{quote(field.column)} = %s"
        guard_params.append(field.get_db_prep_value(value, connection))
    written = 0
    for start in range(0, len(objs), chunk):
        part = objs[start : start + chunk]
        # One array a column, typed as the field: the statement stays a few hundred characters
        # whatever the rows (psycopg parses a statement's placeholders per execution, ~80 ms for
        # 500 rows of VALUES with 3,500 of them), and PostgreSQL plans one shape. A column with one
        # value for every row (a status, a time) travels once, as that value.
        arrays, assignments = [f"%s::{pk.db_type(connection)}[]"], []
        scalars: list[Any] = []
        vectors: list[Any] = [[pk.get_db_prep_value(obj.pk, connection) for obj in part]]
        for field in columns:
            values = [getattr(obj, field.attname) for obj in part]
            if all(type(v) is type(values[0]) and v == values[0] for v in values):
                assignments.append(f"{quote(field.column)} = %s::{field.db_type(connection)}")
                scalars.append(field.get_db_prep_save(values[0], connection))
                continue
            arrays.append(f"%s::{field.db_type(connection)}[]")
            assignments.append(f"{quote(field.column)} = v.c{len(arrays) - 1}")
            vectors.append([field.get_db_prep_save(v, connection) for v in values])
        names = ", ".join(f"c{i}" for i in range(len(arrays)))
        # Identifiers come from the model's own metadata, quoted; every value is a parameter.
        sql = (
            f"UPDATE {table} SET {', '.join(assignments)} FROM unnest({', '.join(arrays)}) AS v({names}) "  # noqa: S608
            f"WHERE {table}.{quote(pk.column)} = v.c0{guard_sql}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, scalars + vectors + guard_params)
            written += cursor.rowcount
    return written


ANALYZE_AFTER_ROWS = 10_000


def analyze_if_grown(
    model: type[models.Model], rows: int, fields: Sequence[str] = (), *, share: float = 0.0
) -> None:
    """After writing `rows` new rows in bulk (ANALYZE_AFTER_ROWS or more), refresh the planner's
    statistics of the model's table now (PostgreSQL). Until autovacuum gets to it, queries on the
    fresh rows are planned as if the table were small: sequential scans, plans 100x slower.

    `fields`: only these columns' statistics (the table's size is refreshed whatever the list),
    about half the time of the whole table's when the queries on the fresh rows filter on a few.
    `share`: only when these rows are at least that share of the rows the table's statistics know
    (or it has none): a write that leaves the table's shape as it was does not pay an ANALYZE of a
    big table (1.3 to 1.7 s at 5,000,000 rows), whatever others wrote since the last one."""
    if rows < ANALYZE_AFTER_ROWS:
        return
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    with connection.cursor() as cursor:
        if share and not _shape_changed(cursor, table, rows, share):
            return
        columns = ", ".join(quote(f.column) for f in _fields(model, fields))
        cursor.execute(f"ANALYZE {table}{f' ({columns})' if columns else ''}")


def _shape_changed(cursor: Any, table: str, rows: int, share: float) -> bool:
    # This write's rows against the rows the statistics know. Rows others wrote since the last
    # ANALYZE are autovacuum's, whose threshold is the same tenth (autovacuum_analyze_scale_factor):
    # a campaign beside 5,000,000 messages of history whose statistics are behind does not pay an
    # ANALYZE of them all (0.5-1.7 s) for rows that are not its own.
    cursor.execute("SELECT c.reltuples FROM pg_class c WHERE c.oid = %s::regclass", [table])
    (known,) = cursor.fetchone()
    return known < 0 or rows >= share * known


def copy_rows(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    ignore_conflicts: bool = False,
) -> int:
    """INSERT rows with PostgreSQL's COPY, several times faster than bulk_create; returns how many
    rows were inserted.

    Each row gives `fields` in that order, as the database takes them (int, str, Decimal, bool,
    aware datetime, None for NULL: no field conversion runs on them). Every other concrete field
    but an auto primary key gets what bulk_create would give it: its default (a callable default
    is called for each row), auto_now and auto_now_add one timestamp for the call. `rows` is read
    lazily and streamed to the server: do not query this connection from inside it.

    ignore_conflicts=True leaves out the rows that would break a unique constraint, as
    bulk_create(ignore_conflicts=True) does: they are copied into a temporary table and moved
    with one INSERT ... SELECT ... ON CONFLICT DO NOTHING, in one transaction (or savepoint).
    Without it a conflicting row raises IntegrityError and none of the rows is written."""
    meta = model._meta
    given = _fields(model, fields)
    constant_fields, constants, per_row = _defaults(model, given)
    columns = [*given, *constant_fields, *(f for f, _ in per_row)]
    quote = connection.ops.quote_name
    names = ", ".join(quote(f.column) for f in columns)
    table = quote(meta.db_table)
    tail = tuple(constants)
    makers = [make for _, make in per_row]

    def lines() -> Iterator[tuple[Any, ...]]:
        for row in rows:
            yield (*row, *tail, *(make() for make in makers))

    with connection.wrap_database_errors, connection.cursor() as wrapper:
        cursor = wrapper.cursor  # psycopg's own: Django's wrapper has no copy()
        if not ignore_conflicts:
            return _copy(cursor, f"COPY {table} ({names}) FROM STDIN", lines())
        staging = quote(f"copy_{meta.db_table}"[:63])
        with transaction.atomic():
            # Gone with the transaction or savepoint on an error, dropped below otherwise.
            cursor.execute(
                f"CREATE TEMPORARY TABLE {staging} AS SELECT {names} FROM {table} WITH NO DATA"  # noqa: S608
            )
            _copy(cursor, f"COPY {staging} ({names}) FROM STDIN", lines())
            cursor.execute(
                f"INSERT INTO {table} ({names}) SELECT {names} FROM {staging} ON CONFLICT DO NOTHING"  # noqa: S608
            )
            inserted = int(cursor.rowcount)
            cursor.execute(f"DROP TABLE {staging}")
        return inserted


def insert_select(
    model: type[models.Model],
    fields: Sequence[str],
    select: str,
    *,
    ignore_conflicts: bool = False,
) -> tuple[str, list[Any]]:
    """The SQL (and its parameters) of an INSERT of the rows a query gives: no row goes through
    Python, each is made where the query reads it.

    `select` is a SELECT (or its name in a WITH) whose columns are `fields` in that order, as the
    database takes them. Every other concrete field but an auto primary key gets its default as
    copy_rows gives it, as a parameter; a callable default (a token, the time) must be among
    `fields`, computed in SQL. ignore_conflicts=True: ON CONFLICT DO NOTHING. The caller adds what
    it needs around it (a WITH before it, RETURNING after it) and runs it, with the parameters
    returned here before the ones of `select`."""
    meta = model._meta
    given = _fields(model, fields)
    constant_fields, constants, per_row = _defaults(model, given)
    if per_row:
        raise ValueError(f"give {', '.join(f.name for f, _ in per_row)} in `fields`: a callable default")
    quote = connection.ops.quote_name
    names = ", ".join(quote(f.column) for f in [*given, *constant_fields])
    defaults = "".join(", %s" for _ in constants)
    conflict = " ON CONFLICT DO NOTHING" if ignore_conflicts else ""
    # Identifiers from the model's own metadata, quoted; every default a parameter.
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({names}) "  # noqa: S608
        f"SELECT given.*{defaults} FROM ({select}) AS given{conflict}"
    )
    return sql, constants


def _fields(model: type[models.Model], names: Sequence[str]) -> list[models.Field]:
    given: list[models.Field] = []
    for name in names:
        field = model._meta.get_field(name)
        assert isinstance(field, models.Field) and field.concrete, name
        given.append(field)
    return given


def _defaults(
    model: type[models.Model], given: list[models.Field]
) -> tuple[list[models.Field], list[Any], list[tuple[models.Field, Callable[[], Any]]]]:
    """The concrete fields not given but an auto primary key, as bulk_create fills them: the
    ones with a constant value (and their values, as the database takes them), and the ones
    whose callable default is called for each row (with a maker of its database value)."""
    taken = {f.attname for f in given}
    template = model()  # what a new instance holds: the defaults, as bulk_create writes them
    constant_fields: list[models.Field] = []
    constants: list[Any] = []
    per_row: list[tuple[models.Field, Callable[[], Any]]] = []
    for field in model._meta.concrete_fields:
        if field.attname in taken or isinstance(field, AutoFieldMixin):
            continue
        if field.has_default() and callable(field.default):
            per_row.append((field, _prepared(field, field.default)))
        else:
            constant_fields.append(field)
            constants.append(field.get_db_prep_save(field.pre_save(template, add=True), connection))
    return constant_fields, constants, per_row


def _prepared(field: models.Field, default: Callable[[], Any]) -> Callable[[], Any]:
    """The field's callable default as the database takes it. Preparing costs more than making
    most defaults (a token, the time): skipped when it hands a sample back unchanged."""
    sample = default()
    if field.get_db_prep_save(sample, connection) is sample:
        return default
    return lambda: field.get_db_prep_save(default(), connection)


def _copy(cursor: Any, sql: str, rows: Iterable[tuple[Any, ...]]) -> int:
    written = 0
    with cursor.copy(sql) as copy:
        for row in rows:
            copy.write_row(row)
            written += 1
    return written
