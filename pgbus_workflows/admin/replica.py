"""The admin's pages that read ``READ_DATABASE``: rendered inside ``reading()``, saying how far behind it is.

The lists, the dashboard and insights only show rows, so a GET of them reads the read
database (a replica) and its template says where the rows came from and how old they may be
(``read_lag``: :class:`~pgbus_workflows.sql.replica.ReadLag`, shown when the alias is not the
primary's). A POST (an action on selected runs) and the run page read the primary: a verb
decides on what is true now, and an operator who just acted sees what the verb did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse

from ..models.reading import reading
from ..sql.replica import read_lag

#: The requests that only read, and so may read a replica.
READING_METHODS = ("GET", "HEAD")


def on_read_database(request: HttpRequest, respond: Callable[[dict[str, Any]], HttpResponse]) -> HttpResponse:
    """``respond(context)`` for a GET, read and rendered from ``READ_DATABASE``, ``read_lag`` in its context.

    The response is rendered inside the block, so the rows its template reads lazily come from
    the same database; any other method runs ``respond({})`` on the primary.
    """
    if request.method not in READING_METHODS:
        return respond({})
    with reading() as alias:
        response = respond({"read_lag": read_lag(alias)})
        if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
            response.render()
    return response
