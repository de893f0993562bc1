"""One exception hierarchy for judgestore: every error it raises on purpose is imported from here.

Contract:

* Every error is a :class:`JudgestoreError`; the command line prints one as
  a single line (or a JSON object) and exits 1.
* Messages name the file or object at fault, say what is wrong, and, where
  there is one, the next command to run. Callers chain the original
  exception (``raise ... from e``).
* ``path`` is always a :class:`~pathlib.Path` on this machine, or None; a
  path inside a remote is ``remote_path`` (a POSIX string). Errors about a
  descriptor database say ``where`` it is: a file's path, or a PostgreSQL
  server's schema (then ``path`` is None).
* Families, one module each, every name re-exported here: the root and its
  wording (:mod:`~store.errors.base`), bad input (:mod:`~store.errors.inputs`:
  :class:`InvalidInputError`), the store's files (:mod:`~store.errors.files`:
  :class:`DatabaseFileError`, :class:`LayoutError`), a server store
  (:mod:`~store.errors.server`: :class:`ServerError`), sharing
  (:mod:`~store.errors.sync`: :class:`SyncError`), legacy imports
  (:mod:`~store.errors.legacy`: :class:`LegacyError`), and models, engines
  and the cache boundary (:mod:`~store.errors.engines`: :class:`ModelError`,
  :class:`RequestRefusedError`, :class:`CacheMissError`,
  :class:`RequestsFailedError`, :class:`AdoptionError`).
"""

from store.errors import base, engines, files, inputs, legacy, server, sync
from store.errors.base import *  # noqa: F403
from store.errors.engines import *  # noqa: F403
from store.errors.files import *  # noqa: F403
from store.errors.inputs import *  # noqa: F403
from store.errors.legacy import *  # noqa: F403
from store.errors.server import *  # noqa: F403
from store.errors.sync import *  # noqa: F403

__all__ = (
    base.__all__ + inputs.__all__ + files.__all__ + server.__all__ + sync.__all__ + legacy.__all__ + engines.__all__
)
