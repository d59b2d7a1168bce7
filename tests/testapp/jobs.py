"""Module-level job functions for fan-out tests (fan-out jobs must live in an installed app)."""

from .models import SideEffect


def square(n: int) -> int:
    """Record the call and return n squared."""
    SideEffect.objects.create(label="square", key=str(n))
    return n * n


def fail_on(n: int, bad: list[int]) -> int:
    """Raise for the numbers in ``bad``."""
    SideEffect.objects.create(label="fail_on", key=str(n))
    if n in bad:
        raise ValueError(f"job {n} fails on purpose")
    return n


# -- fan-out tests (tests/services/test_fanout*.py) and the fan-out benchmark (bench/fanout.py) -------------

#: Barriers the race tests put here by name: ``meet`` jobs wait on theirs, so they end together.
BARRIERS: dict = {}


def noop(i: int) -> int:
    """Do nothing: what the benchmark measures is the engine, not the job."""
    return i


def record_job(key: str, seconds: float = 0) -> str:
    """Record one run of the job (a SideEffect keyed ``key``) after ``seconds``: duplicates would show."""
    if seconds:
        import time

        time.sleep(seconds)
    SideEffect.objects.create(label="fan-job", key=key)
    return key


def flaky(key: str, failures: int) -> int:
    """Fail the first ``failures`` calls for ``key``; then return the number of the call."""
    calls = SideEffect.objects.filter(label="flaky", key=key).count() + 1
    SideEffect.objects.create(label="flaky", key=key)
    if calls <= failures:
        raise RuntimeError(f"flaky {key} attempt {calls} fails")
    return calls


def sleepy_once(key: str, seconds: float) -> str:
    """Hang for ``seconds`` the first time it runs for ``key`` (a crash victim); return at once later."""
    import time

    first = not SideEffect.objects.filter(label="sleepy-start", key=key).exists()
    SideEffect.objects.create(label="sleepy-start", key=key)
    if first:
        time.sleep(seconds)
    SideEffect.objects.create(label="sleepy-end", key=key)
    return key


def meet(name: str, index: int) -> int:
    """Wait at ``BARRIERS[name]`` (when the test set one) so the jobs of a race end at the same moment."""
    barrier = BARRIERS.get(name)
    if barrier is not None:
        barrier.wait(30)
    return index


def oversized(size: int) -> str:
    """Return a result of ``size`` bytes (over MAX_PAYLOAD_SIZE in the tests)."""
    return "x" * size


def drop_connection_once(key: str) -> str:
    """The first time for ``key``: record the call, then have the server drop this thread's connection."""
    import psycopg
    from django.db import connection

    first = not SideEffect.objects.filter(label="dropped", key=key).exists()
    SideEffect.objects.create(label="dropped", key=key)
    if first:
        keep = ("dbname", "user", "password", "host", "port")
        params = {k: v for k, v in connection.get_connection_params().items() if k in keep and v not in (None, "")}
        with psycopg.connect(**params, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    return key


def nothing(i: int) -> None:
    """Return nothing: results of None must be stored as such."""


def transaction_state() -> dict:
    """Whether the job's body runs inside a transaction (an atomic block, autocommit off)."""
    from django.db import connection

    return {"in_atomic_block": connection.in_atomic_block, "autocommit": connection.get_autocommit()}


def types_of(*args: object) -> dict:
    """The types and values of the arguments the job received (what crossing JSON made of them)."""
    return {"types": [type(arg).__name__ for arg in args], "values": list(args)}


async def async_square(n: int) -> int:
    """An ``async def`` job: awaits the ORM, records the call and returns n squared."""
    await SideEffect.objects.acreate(label="async_square", key=str(n))
    return n * n


# -- durable functions' ctx.map (tests/functions/test_mapping.py) --------------------------------------


def odd_fails(n: int) -> int:
    """Record the call (keyed ``n``); raise for an odd ``n``, else return ``n * 10``."""
    SideEffect.objects.create(label="odd_fails", key=str(n))
    if n % 2:
        raise ValueError(f"{n} is odd")
    return n * 10


def meet_pair(pair: list) -> int:
    """``meet(*pair)``: a ``ctx.map`` item is one argument, here ``[barrier name, index]``."""
    return meet(pair[0], pair[1])


def blocks_until_released(key: str) -> str:
    """Record ``map-blocking`` (keyed ``key``), then wait until a ``release`` row exists (a kill victim's job)."""
    import time

    SideEffect.objects.create(label="map-blocking", key=key)
    while not SideEffect.objects.filter(label="release").exists():
        time.sleep(0.05)
    return key
