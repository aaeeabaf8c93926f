"""Femto-dollar columns and their sums, exact whatever the amount, on PostgreSQL and SQLite.

`FemtosField` holds a non-negative whole number of femto-dollars (billing.money)
of up to 38 digits (10**38 femto-dollars: 10**23 USD):

- PostgreSQL: `NUMERIC(38, 0)`. Its SUM is exact (numeric arithmetic), so
  `FemtoSum` is a plain SUM there.
- SQLite: decimal text (`'12500000000'`). SQLite has no exact wide type: an
  INTEGER is 64 bits (9.2e18 femto-dollars: 9,223 USD; SUM raises "integer
  overflow" past it) and Django's DecimalField is stored as REAL there (15
  significant digits). `FemtoSum` sums the text exactly in SQL, in two 64-bit
  parts: the digits above the last nine (whole micro-dollars) and the last
  nine, each summed natively, joined in one Python call per group
  (`django_femto_join`). So on SQLite an amount, and a sum, holds up to
  SQLITE_MAX_FEMTOS (9.2e27 femto-dollars: 9.2e12 USD); a larger amount is
  refused when written, a larger sum raises "integer overflow" (never a
  wrong figure).
  Comparisons (`gt`, `lte`, ...) compare by length, then text, which is
  numeric order for canonical non-negative integers; `order_by` on such a
  column is text order on SQLite, so nothing orders by one.

Chosen by measurement over two 64-bit columns per amount (whole micro-dollars
plus a femto remainder: 1.2x a bigint SUM where NUMERIC's is 2.8x on 1M rows,
but every amount two columns in every query). Against the 64-bit columns,
interleaved pairs on PostgreSQL (BENCHMARKS.md): the worker's insert and the
year's rollup fill are within noise. On SQLite the two-part SUM costs 1.8x a
64-bit SUM (a Python aggregate: 2.75x).
"""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.backends.signals import connection_created
from django.db.models import lookups

MAX_DIGITS = 38
MAX_FEMTOS = 10**MAX_DIGITS - 1
SQLITE_MAX_FEMTOS = (2**63 - 1) * 10**9 + 999_999_999  # its micro-dollars fit SQLite's 64-bit INTEGER


def femtos_int(value) -> int:
    """An int of femto-dollars from an int, an integral Decimal or decimal text; never a float (money is exact)."""
    if isinstance(value, (bool, float)):
        raise TypeError(f"a femto-dollar amount is an integer, not {value!r}")
    if isinstance(value, Decimal):
        if not value.is_finite() or value != value.to_integral_value():
            raise ValueError(f"a femto-dollar amount is a whole number, not {value}")
        return int(value)
    return int(value)


class FemtosField(models.Field):
    """A non-negative integer amount of femto-dollars, exact up to MAX_FEMTOS (see the module docstring)."""

    description = "Femto-dollars (exact, non-negative, up to 38 digits)"

    @property
    def validators(self):
        return [*super().validators, MinValueValidator(0)]

    def get_internal_type(self) -> str:
        # An integer to Django's machinery (no decimal converters; PostgreSQL's bulk_create sends each column as
        # one array, `UNNEST(%s::numeric[])`, only for the internal types it knows: without it 5,000 rows are
        # 100,000 placeholders for psycopg to parse, 4x slower). The column's type is db_type's.
        return "BigIntegerField"

    def db_type(self, connection) -> str:
        if connection.vendor == "postgresql":
            return f"numeric({MAX_DIGITS},0)"
        if connection.vendor == "sqlite":
            return "text"
        raise NotImplementedError(f"femto-dollar columns exist on PostgreSQL and SQLite, not {connection.vendor}")

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if value is None or hasattr(value, "resolve_expression"):
            return value
        value = femtos_int(value)
        if not 0 <= value <= MAX_FEMTOS:
            raise ValueError(f"a femto-dollar amount is between 0 and {MAX_FEMTOS}, not {value}")
        return value

    def get_db_prep_value(self, value, connection, prepared=False):
        if not prepared:
            value = self.get_prep_value(value)
        if isinstance(value, int) and connection.vendor == "sqlite":
            if value > SQLITE_MAX_FEMTOS:
                raise ValueError(f"SQLite holds femto-dollar amounts up to {SQLITE_MAX_FEMTOS}, not {value}")
            return str(value)
        return value

    def from_db_value(self, value, expression, connection):
        return None if value is None else int(value)

    def to_python(self, value):
        if value is None or isinstance(value, int):
            return value
        try:
            return femtos_int(value)
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise ValidationError(f"{value!r} is not a whole number of femto-dollars") from exc

    def formfield(self, **kwargs):
        return super().formfield(**{"form_class": forms.IntegerField, "min_value": 0, **kwargs})


class _LengthOrdered:
    """On SQLite, compare decimal texts numerically: the longer is larger, equal lengths compare as text."""

    strict: str  # the length comparison that decides alone

    def as_sqlite(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        sql = (f"(length({lhs}) {self.strict} length({rhs}) OR "
               f"(length({lhs}) = length({rhs}) AND {lhs} {self.operator} {rhs}))")
        both = (*lhs_params, *rhs_params)
        return sql, (*both, *both, *lhs_params, *rhs_params)


def _ordered(base, strict: str, operator: str):
    return type(f"Femtos{base.__name__}", (_LengthOrdered, base), {"strict": strict, "operator": operator})


for _lookup in (_ordered(lookups.GreaterThan, ">", ">"), _ordered(lookups.GreaterThanOrEqual, ">", ">="),
                _ordered(lookups.LessThan, "<", "<"), _ordered(lookups.LessThanOrEqual, "<", "<=")):
    FemtosField.register_lookup(_lookup)


class FemtoSum(models.Aggregate):
    """SUM of a FemtosField, exact on both backends; an int (None over no rows).

    `ceil_digits=d`: the sum of each value rounded up to a multiple of 10**d, in those units
    (d=6: nano-dollars, each record's cost rounded up, as admission counts spend).
    """

    function = "SUM"
    name = "FemtoSum"
    arity = 1

    def __init__(self, expression, *, ceil_digits: int = 0, **extra):
        if not 0 <= ceil_digits < 18:
            raise ValueError("ceil_digits is between 0 and 17")
        self.ceil_digits = ceil_digits
        super().__init__(expression, output_field=FemtosField(), **extra)

    def as_postgresql(self, compiler, connection, **extra):
        if self.ceil_digits:
            unit = 10**self.ceil_digits
            extra["template"] = f"%(function)s(div(%(expressions)s + {unit - 1}, {unit}))"
        return self.as_sql(compiler, connection, **extra)

    def as_sqlite(self, compiler, connection, **extra):
        source = self.get_source_expressions()[0]
        if self.filter is not None:
            source = models.Case(models.When(self.filter, then=source))
        value, params = compiler.compile(source)
        d = self.ceil_digits
        # floor(v / 10**d) as text is v without its last d digits: its digits above the last nine, and those nine
        high = f"SUM(CAST(substr({value}, 1, length({value}) - {d + 9}) AS INTEGER))"
        low = f"SUM(CAST(substr({value}, -{d + 9}, 9) AS INTEGER))"
        if d:
            bumps = f"SUM(CAST(substr({value}, -{d}) AS INTEGER) > 0)"
            return f"django_femto_join({high}, {low}, {bumps})", (*params, *params, *params, *params)
        return f"django_femto_join({high}, {low}, 0)", (*params, *params, *params)


def _femto_join(high, low, bumps):
    """high x 10**9 + low + bumps, as decimal text (None: a sum over no rows)."""
    if high is None:
        return None
    return str(int(high) * 10**9 + int(low) + int(bumps or 0))


def _sqlite_functions(sender, connection, **kwargs) -> None:
    if connection.vendor == "sqlite":
        connection.connection.create_function("django_femto_join", 3, _femto_join, deterministic=True)


def connect_signals() -> None:
    connection_created.connect(_sqlite_functions, dispatch_uid="billing.femtos.sqlite_functions")
