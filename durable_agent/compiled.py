"""Statements run on a cursor with the ORM's own columns and converters: a model's columns
read back as instances (:class:`Columns`), and reads whose SQL the ORM builds once per
database (:class:`CompiledRead`).

Note [Reads compiled once]
    A pass runs the same few ORM reads for every host, the ledger's scans above all; building
    and compiling a ``QuerySet`` cost about twice what running its statement did (a scan: 0.9
    ms through the ORM against 0.3 ms for its SQL on a cursor, a scan with its generation,
    which joins through a ``FilteredRelation``, 1.5 ms). A :class:`CompiledRead` asks the ORM
    once per database for the statement of a ``values_list`` query built around a marker key,
    keeps the SQL, its parameters and the columns' database converters, and afterwards runs
    that SQL with the real key wherever the marker stood, converting each row as the ORM
    does. The statement is the ORM's own, so it changes with the models and the Django
    version; only its parameters are filled in here. A query whose SQL would depend on the
    key's value (``None``, a list) cannot be compiled this way, so the key is a primary key.

The same holds for the statements built by hand: the alarm transaction's reads
(``durable_agent/maintenance/store/rows.py``) and the claim of a thread's head, whose
``RETURNING`` row becomes a ``Submission`` through :class:`Columns` (a ``RawQuerySet`` cost
0.26 ms more a claim).

Note [Timestamps read by psycopg's own loader]
    With ``USE_TZ`` and no database ``TIME_ZONE``, Django's PostgreSQL backend (psycopg 3)
    registers on every connection a ``timestamptz`` loader of its own: psycopg's pure-Python
    loader, whose aware result it then gives Django's UTC. psycopg's default loader (its C
    implementation where psycopg's binary or C package is installed) already returns an aware
    datetime in the session's time zone, which Django sets to UTC on each connection: the same
    value with the same ``tzinfo`` (``datetime.UTC``). Parsing every timestamp in Python was
    the largest single item of a burst pass's client time (about a tenth, py-spy;
    docs/benchmarks.md). So :func:`reading` gives the compiled reads, the alarm transaction's
    reads (``durable_agent/maintenance/store/rows.py``) and the claim of a thread's head
    (``durable_agent/agents/leases.py``) a cursor with psycopg's default loader registered on
    the cursor (as Django itself registers a loader on a cursor whose time zone differs from
    the connection's), exactly where Django's would give the same value: PostgreSQL through
    psycopg 3, ``connection.timezone`` Django's UTC and the session's ``TimeZone`` UTC.
    Anywhere else the cursor is Django's own. tests/test_compiled.py compares the values and
    their ``tzinfo`` with the ORM's, and checks that Django's loader is not called.

Note [An instance without Model.__init__]
    Every alarm transaction reads the host's state row, its host and its slot back as model
    instances, and the claim of a thread's head its submission: ``Model.from_db`` calls
    ``Model.__init__``, which sends ``pre_init`` and ``post_init``, makes a ``ModelState`` and
    sets each field's attribute through ``setattr``, several times the work of the instance
    itself (a fresh pass makes seven; tracked by ``python -m bench.pass_cost``). For a whole
    row of a model whose ``__init__`` and ``from_db`` are Django's own, whose columns'
    attributes are Django's plain deferred attributes (a ``ForeignKeyDeferredAttribute`` only
    clears a cached related object, which a new instance does not have) and that has no
    ``pre_init`` or ``post_init`` receiver at the time (asked only when either signal has a
    receiver at all), :meth:`Columns.instance` builds what ``from_db`` would: the instance's
    ``__dict__`` holds each column's converted value under its ``attname``, and its
    ``_state`` is a ``ModelState`` with ``adding`` False and ``db`` the connection's alias.
    Any other model (a field with a descriptor of its own, such as a file field; an
    ``__init__`` or ``from_db`` overridden; a receiver connected) goes through ``from_db`` as
    before. tests/test_compiled.py compares the instances with the ORM's, field by field, and
    checks that a receiver connected later is still sent its signals.

Django internals relied on: ``Query.get_compiler``, ``SQLCompiler.as_sql`` / ``select`` /
``col_count`` / ``get_converters``, ``Field.get_col`` and ``Col.get_db_converters``,
``connection.ops.get_db_converters``, ``Model.from_db`` and what it does (``ModelState``,
``DeferredAttribute``, ``pre_init``/``post_init``), the converters' ``(value,
expression, connection)`` signature, ``connection.timezone`` and the wrapped cursor's psycopg
``adapters`` (:func:`reading`). tests/test_compiled.py runs every read built here
against the ORM's own answer, and tests/maintenance/store/test_rows.py every row read back.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

#: The key a read is compiled with: no row has it, and it is found among the parameters.
MARKER = -7_364_125_981

Converter = Callable[[Any, Any, BaseDatabaseWrapper], Any]
Converters = dict[int, tuple[list[Callable[..., Any]], Any]]


@dataclass(frozen=True)
class Columns:
    """One model's concrete columns in a SELECT (or RETURNING) list, and how to read them
    back as the ORM does: each field's database converters, then ``Model.from_db``."""

    model: type[Model]
    attnames: list[str]
    sql: list[str]
    converters: list[tuple[list[Converter], Any]]

    @classmethod
    def of(cls, model: type[Model], connection: BaseDatabaseWrapper) -> Columns:
        table = model._meta.db_table
        fields: Sequence[Field[Any, Any]] = model._meta.concrete_fields
        quote = connection.ops.quote_name
        converters = []
        for field in fields:
            column = field.get_col(table)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            converters.append((found, column))
        return cls(
            model,
            [f.attname for f in fields],
            [f"{quote(table)}.{quote(str(f.column))}" for f in fields],
            converters,
        )

    @classmethod
    def cached(cls, model: type[Model], connection: BaseDatabaseWrapper) -> Columns:
        """:meth:`of`, built once per database and model."""
        key = (connection.alias, connection.vendor, model)
        found = _columns.get(key)
        if found is None:
            found = _columns[key] = cls.of(model, connection)
        return found

    def values(self, row: Sequence[Any], connection: BaseDatabaseWrapper) -> list[Any]:
        out = []
        for value, (found, column) in zip(row, self.converters, strict=True):
            for convert in found:
                value = convert(value, column, connection)
            out.append(value)
        return out

    def instance(self, row: Sequence[Any], connection: BaseDatabaseWrapper) -> Model:
        """The row as ``Model.from_db`` gives it (Note [An instance without Model.__init__])."""
        values = self.values(row, connection)
        model = self.model
        if (
            not _plain(model)
            or (pre_init.receivers and pre_init.has_listeners(model))
            or (post_init.receivers and post_init.has_listeners(model))
        ):
            return model.from_db(connection.alias, self.attnames, values)
        new = model.__new__(model)
        state = new._state = ModelState()
        state.adding, state.db = False, connection.alias
        new.__dict__.update(zip(self.attnames, values, strict=True))
        return new


def _plain(model: type[Model]) -> bool:
    """Whether ``Model.from_db`` of a whole row of ``model`` does nothing but set each
    column's attribute in the instance's ``__dict__`` (Note [An instance without
    Model.__init__]); found once per model."""
    found = _plain_models.get(model)
    if found is None:
        found = _plain_models[model] = (
            model.__init__ is Model.__init__
            and getattr(model.from_db, "__func__", None) is Model.from_db.__func__  # type: ignore[attr-defined]
            and all(
                type(getattr(model, f.attname, None))
                in (DeferredAttribute, ForeignKeyDeferredAttribute)
                for f in model._meta.concrete_fields
            )
        )
    return found


_plain_models: dict[type[Model], bool] = {}


_columns: dict[tuple[str, str, type[Model]], Columns] = {}


@contextmanager
def reading(connection: BaseDatabaseWrapper) -> Iterator[Any]:
    """``connection.cursor()``, reading ``timestamptz`` columns with psycopg's own loader
    where that gives what Django's does (Note [Timestamps read by psycopg's own loader])."""
    with connection.cursor() as cursor:
        loader = _psycopg_timestamptz(connection, cursor.cursor)
        if loader is not None:
            cursor.cursor.adapters.register_loader("timestamptz", loader)
        yield cursor


_default_loader: list[Any] = []  # psycopg's default timestamptz text loader, once looked up


def _psycopg_timestamptz(connection: BaseDatabaseWrapper, raw: Any) -> Any:
    if connection.vendor != "postgresql" or not hasattr(raw, "adapters"):
        return None  # another database, or psycopg 2
    if connection.timezone is not datetime.UTC:
        return None  # USE_TZ off (naive values) or a database TIME_ZONE
    tz = raw.connection.info.parameter_status("TimeZone")
    if tz not in ("UTC", "Etc/UTC"):
        return None
    if not _default_loader:
        import psycopg
        from psycopg.pq import Format

        oid = psycopg.postgres.types["timestamptz"].oid
        _default_loader.append(psycopg.adapters.get_loader(oid, Format.TEXT))
    return _default_loader[0]


@dataclass(frozen=True)
class _Plan:
    sql: str
    params: tuple[Any, ...]
    slots: tuple[int, ...]  # where the marker stood among params
    converters: Converters


class CompiledRead:
    """``build(key)`` (a ``values_list`` query over ``model``) compiled once per database;
    :meth:`rows` runs it for a key (Note [Reads compiled once])."""

    def __init__(self, model: type[Model], build: Callable[[int], QuerySet[Any, Any]]) -> None:
        self._model = model
        self._build = build
        self._plans: dict[tuple[str, str], _Plan] = {}

    def _plan(self, alias: str) -> _Plan:
        connection = connections[alias]
        key = (alias, connection.vendor)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        compiler = self._build(MARKER).query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        slots = tuple(i for i, value in enumerate(params) if value == MARKER)
        if not slots:
            raise ValueError("the compiled read does not take its key as a parameter")
        fields = [selected[0] for selected in compiler.select[: compiler.col_count]]
        plan = _Plan(sql, tuple(params), slots, compiler.get_converters(fields))
        self._plans[key] = plan
        return plan

    def rows(self, key: int) -> list[tuple[Any, ...]]:
        """The query's rows for ``key``, as ``values_list`` gives them (tuples)."""
        if not isinstance(key, int) or isinstance(key, bool):
            raise TypeError(f"a compiled read's key is an int, not {type(key).__name__}")
        alias = router.db_for_read(self._model)
        plan = self._plan(alias)
        params = list(plan.params)
        for slot in plan.slots:
            params[slot] = key
        connection = connections[alias]
        with reading(connection) as cursor:
            cursor.execute(plan.sql, params)
            rows = cursor.fetchall()
        if not plan.converters:
            return [tuple(row) for row in rows]
        out = []
        for row in rows:
            values = list(row)
            for position, (converters, expression) in plan.converters.items():
                value = values[position]
                for convert in converters:
                    value = convert(value, expression, connection)
                values[position] = value
            out.append(tuple(values))
        return out
