"""Shared fixtures."""

import pytest

from tests.testapp.models import Order


@pytest.fixture
def order(db):
    """A saved Order to be the subject of a run."""
    return Order.objects.create()
