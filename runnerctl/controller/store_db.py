"""The database glue under the store: one cursor for SQLite and PostgreSQL alike.

Store (store.py) and the store modules beside it write SQL once, with `?` placeholders;
`Cursor` turns them into psycopg's `%s` on PostgreSQL. The helpers name a failure in one
line and describe a PostgreSQL URL without its password.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from runnerctl.errors import first_line

__all__ = ["Cursor", "close_quietly", "db_errors", "describe_url", "first_line"]

log = logging.getLogger(__name__)


class Cursor:
    """A cursor that takes `?` placeholders on both databases."""

    def __init__(self, cursor: Any, postgres: bool) -> None:
        self._cursor = cursor
        self._pg = postgres

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._cursor.execute(sql.replace("?", "%s") if self._pg else sql, tuple(params))
        return int(self._cursor.rowcount or 0)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.execute(sql, params)
        return [tuple(row) for row in self._cursor.fetchall()]


def db_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    try:
        import psycopg
    except ImportError:  # SQLite-only install
        return errors
    return (*errors, psycopg.Error)


def close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except db_errors() as exc:
        log.debug("closing a broken store connection: %s", exc)


def describe_url(url: str) -> str:
    """host:port/database of a PostgreSQL URL (never its password)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL": the connection will say what is wrong
        return "postgresql://(a URL that cannot be parsed)"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"postgresql://{parts.hostname or 'localhost'}{port}{parts.path}"
