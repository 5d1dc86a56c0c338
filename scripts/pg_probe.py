"""Exit 0 when the PostgreSQL server of a database URL accepts connections, else 1.

Usage: ``python scripts/pg_probe.py postgres://postgres@127.0.0.1:5432/test``. It connects to
the server's ``postgres`` database first (the test run creates its own database, so the one in
the URL need not exist yet), then to the URL's database.
"""

from __future__ import annotations

import sys
from typing import Any

import dj_database_url
import psycopg


def main(url: str) -> int:
    config = dj_database_url.parse(url)
    if "postgresql" not in config["ENGINE"]:
        print(f"not a PostgreSQL URL: {config['ENGINE']}", file=sys.stderr)
        return 1
    params: dict[str, Any] = {"connect_timeout": 3}
    for key in ("HOST", "PORT", "USER", "PASSWORD"):
        if config.get(key):
            params[key.lower()] = config[key]
    where = f"{config.get('HOST') or 'local socket'}:{config.get('PORT') or 5432}"
    error: Exception | None = None
    for dbname in ("postgres", config.get("NAME") or "postgres"):
        try:
            with psycopg.connect(dbname=dbname, **params) as conn:
                row = conn.execute("SHOW server_version").fetchone()
        except psycopg.Error as exc:
            error = exc
            continue
        print(f"PostgreSQL {row[0] if row else '?'} at {where} accepts connections.")
        return 0
    print(f"PostgreSQL at {where} is unreachable: {' '.join(str(error).split())}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
