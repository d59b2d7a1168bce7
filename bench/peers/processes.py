"""What the comparison's peers share on the project's side: their virtualenvs and their worker processes.

No Django: ``bench.comparison`` and the peers' ``*_bench`` modules use it from the project's
virtualenv. A peer's worker is started in a session of its own, so that the whole of it (a
Celery worker and its prefork children) can be counted, measured and killed at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

PEERS = Path(__file__).resolve().parent.parent / ".peers"


def ensure_venv(name: str, requirements: list[str], marker: str) -> Path:
    """The bin directory of ``bench/.peers/<name>-venv``, made and filled with ``requirements`` if ``marker`` is absent.

    ``marker`` is a file of that bin directory the installation makes (a console script).
    """
    venv = PEERS / f"{name}-venv"
    bin_dir = venv / "bin"
    if not (bin_dir / marker).exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(bin_dir / "pip"), "install", "-q", *requirements], check=True)
    return bin_dir


def installed_version(bin_dir: Path, distribution: str) -> str:
    """The version of ``distribution`` installed in the virtualenv of ``bin_dir`` ("?" if unknown)."""
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    out = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "?"


def spawn(command: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own, its output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=out, start_new_session=True)


def kill_all(process: subprocess.Popen[Any]) -> None:
    """SIGKILL ``process`` and every process of its session (its children included), as a crash would."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (read from ``/proc``; Linux only)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def footprint(pid: int) -> tuple[int, float]:
    """How many processes ``pid``'s tree holds, and their resident memory together, MB (Linux only)."""
    count, rss_kb = 0, 0
    for each in descendants(pid):
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        count += 1
        rss_kb += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return count, rss_kb / 1024


def crash_fact(starts: int, finished: float | None, restarted: float) -> dict[str, Any]:
    """The observations of a crash run: did the killed step run again, did the run complete, and when."""
    return {
        "rerun": starts >= 2,
        "completed": finished is not None,
        "seconds": None if finished is None else finished - restarted,
    }
