"""What holds a step back, where an operator looks: the run page, ``workflows show``, the dashboard, the metrics."""

import json

import pytest
from django.test import override_settings
from django.urls import reverse

from pgbus_workflows.services.claims import claim_due_steps
from tests.exposition import samples, value
from tests.management.test_cli import cli, wid
from tests.support import run_page
from tests.testapp.limited_workflows import KeyedSleeper

pytestmark = pytest.mark.django_db


@pytest.fixture
def held():
    """Two runs of one account: the first's step claimed (the key's one slot), the second's held back."""
    KeyedSleeper.start(account="acme")
    second = KeyedSleeper.start(account="acme")
    [claimed] = claim_due_steps(10, queues=["keyed"], claimed_by="test")
    assert claimed.run_id != second.record.pk
    return second


def test_the_run_page_says_which_key_holds_the_step_back(admin_client, held):
    html = admin_client.get(run_page(held)).content.decode()

    assert "Step work is due and held back by concurrency key &#x27;account:acme&#x27; (1 of 1 in use)" in html


def test_a_run_held_back_by_nothing_says_nothing(admin_client):
    free = KeyedSleeper.start(account="free")

    assert "held back" not in admin_client.get(run_page(free)).content.decode()


def test_show_says_which_key_holds_the_step_back_in_text_and_json(held):
    out, _err = cli("show", wid(held))
    assert "held back step work by concurrency key 'account:acme' (1 of 1 in use)" in " ".join(out.split())

    page = json.loads(cli("show", wid(held), "--json")[0])
    assert page["held_back"] == {
        "step": "work",
        "limits": [{"kind": "concurrency", "key": "account:acme", "limit": 1, "in_use": 1}],
    }


def test_the_dashboard_counts_held_back_steps_by_class_and_step(admin_client, held):
    html = admin_client.get(reverse("admin:pgbus_workflows_workflowrun_dashboard")).content.decode()

    section = html.split('id="held-back"', 1)[1].split("</table>", 1)[0]
    assert '<th scope="row">keyed_sleeper</th><td>work</td><td class="pgbus-num">1</td>' in section
    assert '<th scope="row">keyed_sleeper</th><td>again</td><td class="pgbus-num pgbus-zero">0</td>' in section


@override_settings(ROOT_URLCONF="tests.metrics_urls")
def test_the_metrics_count_held_back_steps_by_class_and_step_never_by_key(client, held):
    table = samples(client.get("/metrics/").content.decode())

    assert value(table, "pgbus_workflows_held_back_steps", workflow_class="keyed_sleeper", step="work") == 1
    assert value(table, "pgbus_workflows_held_back_steps", workflow_class="keyed_sleeper", step="again") == 0
    labels = {name for metric, pairs in table if metric == "pgbus_workflows_held_back_steps" for name, _ in pairs}
    assert labels == {"workflow_class", "step"}


def test_the_limiters_list_shows_each_keys_slots_and_finds_a_key_by_its_start(admin_client, held):
    url = reverse("admin:pgbus_workflows_workflowlimiter_changelist")

    html = admin_client.get(url, {"q": "concurrency:account:ac"}).content.decode()

    assert "concurrency:account:acme" in html
    assert admin_client.get(url, {"q": "rate:"}).content.decode().count("concurrency:account:acme") == 0


def test_steps_under_limits_no_code_declares_are_on_the_run_page_in_show_and_in_the_check(admin_client, remove_limits):
    from pgbus_workflows.checks import check_undeclared_limits

    waiting = [KeyedSleeper.start(account="gone") for _ in range(2)]
    assert check_undeclared_limits(databases=["default"]) == []  # the code declares the key
    remove_limits()

    [warning] = check_undeclared_limits(databases=["default"])
    assert warning.id == "pgbus_workflows.W014"
    assert warning.msg == (
        "2 scheduled step(s) of keyed_sleeper.work wait on limiters no code declares any more: "
        "concurrency:account:gone."
    )
    html = admin_client.get(run_page(waiting[0])).content.decode()
    assert "Step work is under limits its code no longer declares (concurrency:account:gone)" in html
    out, _err = cli("show", wid(waiting[0]))
    assert "concurrency:account:gone: no code declares them any more (claimed within their rows)" in out
    assert json.loads(cli("show", wid(waiting[0]), "--json")[0])["undeclared_limits"] == ["concurrency:account:gone"]
    assert "no code declares" not in cli("show", wid(KeyedSleeper.start(account="fresh")))[0]  # scheduled under none
