"""An object-level permission backend, as django-guardian provides: grants per run."""

from typing import Any

#: ``{(username, codename, run pk)}`` the backend grants.
GRANTS: set[tuple[str, str, int]] = set()


class PerRunBackend:
    """``has_perm(user, perm, obj)`` is True for the grants in :data:`GRANTS`; never without ``obj``."""

    def authenticate(self, request: Any, **credentials: Any) -> None:
        return None

    def has_perm(self, user: Any, perm: str, obj: Any = None) -> bool:
        return obj is not None and (user.get_username(), perm, obj.pk) in GRANTS
