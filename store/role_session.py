"""A write session on one descriptor database that refuses the other role's rows.

Contract: every database holds both roles' tables (completions and
judgements), and only its own role's is ever read (queries, ``verify``,
export, sharing): a judgement written into a completions database was
committed and never seen again. :class:`OneRoleSession` refuses such a
write with an :class:`~store.errors.InvalidInputError` before anything of
it is sent, whichever way it comes: an added, changed or deleted object
(checked before each flush), an ``insert``/``update``/``delete`` statement
run through the session, or the bulk calls (``bulk_save_objects``,
``bulk_insert_mappings``, ``bulk_update_mappings``), which neither of the
session's events sees. The session's own connection
(``session.connection().execute(...)``) is the way around it, on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session

from store.errors import InvalidInputError
from store.tables.models import MODEL_OF_ROLE


class OneRoleSession(Session):
    """A ``Session`` writing one database of ``role`` (``where``: how messages name it); see the module
    docstring."""

    def __init__(self, *, role: str, where: str, **options: Any) -> None:
        super().__init__(**options)
        self.role, self.where = role, where
        event.listen(self, "before_flush", self._refuse_rows)
        event.listen(self, "do_orm_execute", self._refuse_statements)

    def bulk_save_objects(self, objects: Iterable[object], *args: Any, **kwargs: Any) -> None:
        objects = list(objects)
        for row in objects:
            self._refuse_model(type(row), f"a {type(row).__name__} row")
        super().bulk_save_objects(objects, *args, **kwargs)

    def bulk_insert_mappings(self, mapper: Any, *args: Any, **kwargs: Any) -> None:
        self._refuse_model(getattr(mapper, "class_", mapper), "rows of a bulk insert")
        super().bulk_insert_mappings(mapper, *args, **kwargs)

    def bulk_update_mappings(self, mapper: Any, *args: Any, **kwargs: Any) -> None:
        self._refuse_model(getattr(mapper, "class_", mapper), "rows of a bulk update")
        super().bulk_update_mappings(mapper, *args, **kwargs)

    def _refuse_rows(self, session: Session, *_: object) -> None:
        for row in (*session.new, *session.dirty, *session.deleted):
            self._refuse_model(type(row), f"a {type(row).__name__} row")

    def _refuse_statements(self, state: ORMExecuteState) -> None:
        if state.is_insert or state.is_update or state.is_delete:
            table = getattr(getattr(state.statement, "table", None), "name", None)
            model = next((m for m in MODEL_OF_ROLE.values() if m.__tablename__ == table), None)
            if model is not None:
                self._refuse_model(model, f"a statement writing {table}")

    def _refuse_model(self, model: object, what: str) -> None:
        role = next((r for r, m in MODEL_OF_ROLE.items() if isinstance(model, type) and issubclass(model, m)), None)
        if role is not None and role != self.role:
            raise InvalidInputError(
                f"{self.where}: {what} in a database of {self.role}, whose {role} table nothing reads; nothing was "
                f"written. Write it through a database of {role}: store.database({role!r}, task, descriptor)"
            )
