"""The tutorial (docs/tutorial.md), run as a reader runs it: every file and command, in order.

A new project is made with ``django-admin startproject`` in a temporary folder; each
``{code-block}`` whose caption names a file writes (or, "added at the end", appends to) that
file, and each ``$`` line of a ``console`` block runs in bash, with the venv first on
``PATH``, and must exit 0. Only the lines a test cannot run (making a venv, installing,
an interactive superuser, the development server) are left out, and they must all be on the
page. After the blocks the prose describes, the runs are where it says.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

pytestmark = pytest.mark.processes

REPOSITORY = Path(__file__).resolve().parents[2]
PAGE = REPOSITORY / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```(\{code-block\} python|console)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
#: What the reader does and a test cannot: it runs in the venv it was started from instead.
NOT_RUN = {
    "python -m venv .venv",
    "source .venv/bin/activate",
    'pip install django "psycopg[binary]" ../pgbus-workflows',
    "python manage.py createsuperuser",
    "python manage.py runserver",
}
#: The runs' statuses after a console block, by the block's first command (as the prose says).
STATUSES_AFTER = {
    'python manage.py shell -c "from orders.models import Order; from orders.workflows import OrderWorkflow; '
    "OrderWorkflow.start(Order.objects.create(email='ann@example.com', total_cents=4200, "
    "address='1 Main Street'))\"": ["ready"],
    "python manage.py run_workflow_dispatcher --once": ["waiting"],
    "python manage.py workflows list --status waiting --ids | xargs python manage.py workflows signal "
    "payment_received --payload '{\"amount_cents\": 4200}'": ["finished"],
    'python manage.py shell -c "from orders.models import Order; from orders.workflows import OrderWorkflow; '
    "OrderWorkflow.start(Order.objects.create(email='bob@example.com', total_cents=900))\"": ["finished", "paused"],
    "python manage.py shell -c \"from orders.models import Order; Order.objects.filter(address='').update("
    "address='2 Side Street')\"": ["finished", "finished"],
    'python manage.py shell -c "from orders.models import Order; from orders.workflows import order_function; '
    "order_function.start(Order.objects.create(email='cy@example.com', total_cents=1500, "
    "address='3 High Street'))\"": ["finished", "finished", "waiting"],
    'python manage.py shell -c "from orders.models import Order; from orders.workflows import order_function; '
    "order_function.signal_for(Order.objects.get(email='cy@example.com'), 'payment_received', "
    "{'amount_cents': 1500})\"": ["finished", "finished", "finished"],
}


def blocks() -> list[tuple[str, str]]:
    """``(kind, body)`` of the page's Python files and console blocks, in page order."""
    return [("python" if kind.startswith("{") else "console", body) for kind, body in BLOCK.findall(PAGE.read_text())]


@pytest.fixture
def database() -> Iterator[dict[str, str]]:
    """A database of its own for the tutorial's project, dropped after the test."""
    config = settings.DATABASES["default"]
    name = f"pgbus_tutorial_{uuid.uuid4().hex[:8]}"
    server = {"host": config["HOST"] or "127.0.0.1", "port": config["PORT"] or 5432, "user": config["USER"]}
    if config["PASSWORD"]:
        server["password"] = config["PASSWORD"]
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield {"NAME": name, "HOST": str(server["host"]), "PORT": str(server["port"]), "USER": config["USER"]}
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(line: str, project: Path, env: dict[str, str]) -> str:
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", line], cwd=project, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, f"$ {line}\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def statuses(project: Path, env: dict[str, str]) -> list[str]:
    listed = json.loads(run("python manage.py workflows list --json", project, env))
    return sorted(run_["status"] for run_ in listed)


def test_the_tutorial_runs_as_written_in_a_new_project(tmp_path, database):
    project = tmp_path / "shop"
    project.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PGBUS_", "DATABASE_URL"))}
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    # The one line the page does not have: its database is this test's, not "shop" on localhost.
    database_override = f"\nDATABASES['default'].update({database!r})\n"
    skipped, checked, outputs = [], [], []
    for kind, body in blocks():
        if kind == "python":
            caption, code = re.match(r":caption: ([^\n]+)\n\n(.*)", body, re.DOTALL).groups()
            path = project / caption.split(" ")[0]
            if caption.endswith("(added at the end)"):
                override = database_override if path.name == "settings.py" else ""
                path.write_text(path.read_text() + "\n" + code + override)
            else:
                path.write_text(code)
            continue
        lines = [line[2:] for line in body.splitlines() if line.startswith("$ ")]
        for line in lines:
            if line in NOT_RUN:
                skipped.append(line)
            else:
                outputs.append(run(line, project, env))
        if lines and lines[0] in STATUSES_AFTER:
            assert statuses(project, env) == STATUSES_AFTER[lines[0]], lines[0]
            checked.append(lines[0])
    assert Counter(skipped) == Counter(NOT_RUN)
    assert checked == list(STATUSES_AFTER)
    assert re.search(r"^Ran 5 tests.*\n\nOK", outputs[-1], re.MULTILINE), outputs[-1]
    show = outputs[-2]  # part 9's `workflows show` of the durable run: its checkpoints as steps, its result
    checkpoints = re.findall(r"^  (\S+) +1  completed  success", show, re.MULTILINE)
    assert checkpoints == ["reserve", "payment_received", "take_payment", "ship", "@function"], show
    assert re.search(r"^  @function .*\{\"shipped_to\": \"3 High Street\"\}$", show, re.MULTILINE), show
    with psycopg.connect(dbname=database["NAME"], host=database["HOST"], user=database["USER"]) as conn:
        shipped = conn.execute("SELECT email, status, address FROM orders_order ORDER BY id").fetchall()
    assert shipped == [
        ("ann@example.com", "shipped", "1 Main Street"),
        ("bob@example.com", "shipped", "2 Side Street"),
        ("cy@example.com", "shipped", "3 High Street"),
    ]
