"""Say clearly whether the PostgreSQL server of DATABASE_URL answers, and how to get one."""

import os
import sys

import environ
import psycopg

DEFAULT_URL = "postgres://root@127.0.0.1:5432/pgbus_workflows"


def main() -> int:
    """Exit 0 when the server answers, 1 with instructions when it does not."""
    url = os.environ.get("DATABASE_URL", DEFAULT_URL)
    config = environ.Env.db_url_config(url)
    if config["ENGINE"] != "django.db.backends.postgresql":
        print(f"DATABASE_URL must point at PostgreSQL for the test suite, got {config['ENGINE']}", file=sys.stderr)
        return 1
    params = {
        "host": config.get("HOST") or "127.0.0.1",
        "port": config.get("PORT") or 5432,
        "user": config.get("USER") or None,
        "password": config.get("PASSWORD") or None,
        "dbname": "postgres",
        "connect_timeout": 5,
    }
    try:
        with psycopg.connect(**{k: v for k, v in params.items() if v is not None}) as conn:
            version = conn.execute("SHOW server_version_num").fetchone()
    except psycopg.OperationalError as error:
        print(
            f"No PostgreSQL answers at {params['host']}:{params['port']} ({error}).\n"
            "Start one, for example:\n"
            "  Debian/Ubuntu: sudo apt-get install postgresql && sudo pg_ctlcluster $(ls /etc/postgresql) main start\n"
            "  Docker:        docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16\n"
            "then set DATABASE_URL=postgres://USER@HOST:5432/pgbus_workflows (a role that may create databases).",
            file=sys.stderr,
        )
        return 1
    if version is None or int(version[0]) < 140000:
        print(f"PostgreSQL 14+ is required, the server is {version}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
