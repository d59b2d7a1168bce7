"""JSON payloads (arguments, outputs, signal payloads) and subject references."""

from __future__ import annotations

import json
import re
from typing import Any

from django.apps import apps
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Model

from ..conf import settings
from ..exceptions import PayloadNotSerializable, PayloadTooLarge


def encode_payload(value: Any, what: str) -> Any:
    """Return ``value`` as it will read back from the database, checking type and size.

    Raises :class:`PayloadNotSerializable` when ``DjangoJSONEncoder`` cannot encode it or
    PostgreSQL's ``jsonb`` cannot store it (a NUL character, a lone surrogate), and
    :class:`PayloadTooLarge` (naming the size and the limit) when it is over
    ``MAX_PAYLOAD_SIZE`` bytes.
    """
    try:
        # ensure_ascii=False: the limit counts UTF-8 bytes, not the \u escapes of non-ASCII text.
        text = json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as error:
        raise PayloadNotSerializable(f"{what} must be JSON-serialisable (DjangoJSONEncoder): {error}") from error
    except RecursionError as error:
        raise PayloadNotSerializable(f"{what} is nested too deeply to be stored as JSON") from error
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise PayloadNotSerializable(
            f"{what} contains a NUL character (\\x00), which PostgreSQL cannot store in JSON: remove it, "
            "or encode binary data (base64)"
        )
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as error:
        raise PayloadNotSerializable(
            f"{what} contains a lone surrogate ({error.object[error.start : error.end]!r}), which is not valid "
            "UTF-8 and cannot be stored"
        ) from error
    limit = settings.MAX_PAYLOAD_SIZE
    if size > limit:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over MAX_PAYLOAD_SIZE ({limit} bytes): store the data in your own "
            "table and pass its id, or raise PGBUS_WORKFLOWS['MAX_PAYLOAD_SIZE']"
        )
    return json.loads(text)


#: JSON's escape of a NUL character, not preceded by an escaped backslash (``"\\\\u0000"`` is text).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def storable_text(text: str) -> str:
    """``text`` as a text column can hold it: NUL and lone surrogates replaced by U+FFFD.

    For what the engine records on its own (error messages, tracebacks, reasons): refusing
    those would lose the record of what went wrong, so they are kept, readable.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if 0xD800 <= ord(char) <= 0xDFFF else char for char in text)
    return text


def subject_reference(subject: Model | None) -> tuple[str | None, str | None]:
    """``("app_label.model", "pk")`` for a saved model instance, ``(None, None)`` for None."""
    if subject is None:
        return None, None
    if not isinstance(subject, Model):
        raise TypeError(f"A workflow subject must be a saved model instance or None, got {type(subject).__name__}")
    if subject.pk is None:
        raise ValueError(f"A workflow subject must be saved first: {subject!r} has no primary key")
    return subject._meta.label_lower, str(subject.pk)


def load_subject(subject_type: str | None, subject_id: str | None) -> Any:
    """The subject instance, or None when the run has none or the row is gone."""
    if not subject_type or subject_id is None:
        return None
    try:
        model = apps.get_model(subject_type)
    except LookupError:
        return None
    return model._default_manager.filter(pk=subject_id).first()
