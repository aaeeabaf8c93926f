"""The worker's usage-record INSERT: one statement, one round trip, for a whole engine step's records.

    INSERT INTO usage (columns) SELECT ... FROM <the rows as one JSON parameter> AS r
        LEFT JOIN api_keys AS k ON k.id = r.api_key_id WHERE true
        ON CONFLICT (request_id) DO NOTHING

- One JSON parameter (PostgreSQL `json_populate_recordset` over the table's
  own row type, SQLite `json_each`), not 24 placeholders per row: the ORM's
  `bulk_create` prepared every field of every row, and psycopg then parsed
  and quoted each placeholder of a query too long for its cache; both cost
  more than the insert itself (benchmarks/usage_records.py).
- The API keys' check is the LEFT JOIN: a key deleted while its request ran
  leaves its record without the key, in the same statement (no SELECT first).
- `ON CONFLICT (request_id) DO NOTHING`: the first write of a request wins.
- Values go in as the ORM would store them (`connection.ops` adapts the
  datetimes: aware ISO-8601 on PostgreSQL, naive UTC text on SQLite). The
  femto-dollar amounts go in as JSON strings of their digits: a JSON number
  past 64 bits would reach SQLite's json_extract as a REAL (rounded);
  PostgreSQL reads the string into the NUMERIC column, SQLite keeps it as the
  column's decimal text (billing.models.femtos).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import connection, models
from django.utils import timezone

from billing.models import UsageRecord
from billing.models.femtos import FemtosField
from tenants.models import ApiKey

_FIELDS = [field for field in UsageRecord._meta.concrete_fields if not field.primary_key]
_PLAIN = tuple((field.column, field.attname) for field in _FIELDS
               if not isinstance(field, (models.DateTimeField, models.DecimalField, FemtosField)))
_DATETIMES = tuple((field.column, field.attname) for field in _FIELDS
                   if isinstance(field, models.DateTimeField) and field.attname != "created_at")
_DECIMALS = tuple((field.column, field.attname) for field in _FIELDS if isinstance(field, models.DecimalField))
_FEMTOS = tuple((field.column, field.attname, field) for field in _FIELDS if isinstance(field, FemtosField))
_sql: dict[str, str] = {}


def usage_insert_sql(vendor: str) -> str:
    """The statement for `vendor` (its one parameter: `usage_insert_param`)."""
    sql = _sql.get(vendor)
    if sql is not None:
        return sql
    quote = connection.ops.quote_name
    meta, keys = UsageRecord._meta, ApiKey._meta
    if vendor == "postgresql":
        source = f"json_populate_recordset(NULL::{quote(meta.db_table)}, %s::json)"
        value_of = lambda column: "r." + quote(column)  # noqa: E731
    elif vendor == "sqlite":
        source = "json_each(%s)"
        value_of = lambda column: f"json_extract(r.value, '$.{column}')"  # noqa: E731
    else:
        raise NotImplementedError(f"usage records are written on PostgreSQL or SQLite, not {vendor}")
    key_column, key_id = meta.get_field("api_key").column, "k." + quote(keys.pk.column)
    columns = [field.column for field in _FIELDS]
    values = ", ".join(key_id if column == key_column else value_of(column) for column in columns)
    sql = _sql[vendor] = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(map(quote, columns))}) SELECT {values} FROM {source} AS r "
        f"LEFT JOIN {quote(keys.db_table)} AS k ON {key_id} = {value_of(key_column)} "
        f"WHERE true ON CONFLICT ({quote(meta.get_field('request_id').column)}) DO NOTHING"
    )
    return sql


def usage_insert_param(rows: list[dict[str, Any]]) -> str:
    """The rows (field values by attname: `usage_record_fields` plus `usage_rows_cost`) as the
    statement's JSON parameter; created_at is the row's (when its request ended: a spooled record
    written after a database outage keeps its own hour), else now, the time of the insert."""
    now = _datetime(timezone.now())
    items = []
    for row in rows:
        item = {column: row[attname] for column, attname in _PLAIN}
        for column, attname in _DATETIMES:
            item[column] = _datetime(row[attname])
        for column, attname in _DECIMALS:
            item[column] = str(row[attname])
        for column, attname, field in _FEMTOS:
            item[column] = str(field.get_db_prep_value(row[attname], connection))  # checked: 0 to its maximum
        created_at = row.get("created_at")
        item["created_at"] = _datetime(created_at) if created_at is not None else now
        items.append(item)
    return json.dumps(items)


def _datetime(value: datetime | None) -> str | None:
    """As the ORM stores it (aware on PostgreSQL, naive UTC on SQLite), in ISO-8601 text."""
    value = connection.ops.adapt_datetimefield_value(value)
    return value.isoformat() if isinstance(value, datetime) else value
