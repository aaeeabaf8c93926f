"""Dump every row of every table as text (for secrets-at-rest and idempotence tests)."""

from django.db import connection


def _text(value) -> str:
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex() + " " + bytes(value).decode("latin-1")
    return str(value)


def dump_tables(*, exclude_tables: tuple[str, ...] = ()) -> dict[str, list[tuple[str, ...]]]:
    """{table: sorted rows, each a tuple of column texts} for every table in the database."""
    dump = {}
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor, include_views=False)):
            if table in exclude_tables:
                continue
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            columns = [col[0] for col in cursor.description]
            rows = [tuple(f"{name}={_text(value)}" for name, value in zip(columns, row)) for row in cursor.fetchall()]
            dump[table] = sorted(rows)
    return dump


def dump_text(**kwargs) -> str:
    return "\n".join(" | ".join(row) for rows in dump_tables(**kwargs).values() for row in rows)
