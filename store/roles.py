"""The two kinds of rows a store keeps: completions and judgements.

Contract: a :data:`Role` names both a table (:mod:`store.tables.models`) and
the top folder of a descriptor database's path (:mod:`store.layout`); every
descriptor database holds rows of one role. :func:`check_role` turns a name
given by a user into a role, or raises
:class:`~store.errors.InvalidInputError`.
"""

from __future__ import annotations

from typing import Literal, get_args

from store.errors import InvalidInputError

Role = Literal["completions", "judgements"]
ROLES: tuple[Role, ...] = get_args(Role)


def check_role(role: str) -> Role:
    """``role`` as a :data:`Role`; :class:`~store.errors.InvalidInputError` when it names neither."""
    if role not in ROLES:
        raise InvalidInputError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role  # type: ignore[return-value]
