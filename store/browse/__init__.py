"""``judgestore browse``: a read-only web app to look at answers and verdicts side by side.

Contract:

* The package only reads a store: it opens it with ``Store(readonly=True)``
  (SQLite files opened so that no byte is written, not even a ``-wal``;
  PostgreSQL read-only transactions) and goes through the store's public
  faces (:mod:`store`: ``Store``, ``Selector``, ``RowFilter``, the models,
  ``Database.reading``, and ``Storage.narrowed`` to leave unopened the
  databases a filter cannot match, as the commands do). It never imports
  :mod:`inference`.
* Its parts: :mod:`~store.browse.queries` (every statement it runs: keyset
  pages, bounded scans, a battle's and a judge's rows), :mod:`~store.browse.verdicts`
  (the verdict token's preference and a judge's figures, from stored logprobs),
  :mod:`~store.browse.render` (safe markdown, inputs read back as turns),
  :mod:`~store.browse.browser` (what each page shows), :mod:`~store.browse.app`
  (the Starlette routes and Jinja2 templates), :mod:`~store.browse.server`
  (binding, uvicorn). ``templates/`` and ``static/`` ship in the package:
  nothing is fetched from the network at run time.
* Importing ``store.browse`` imports nothing; the web stack (the ``browse``
  extra: Starlette, Jinja2, uvicorn, markdown-it-py) is imported by the
  modules that need it, which only the ``browse`` command imports.

Why Starlette and not Datasette. Datasette is a fine explorer of SQLite
files, but a store is not a set of tables to explore: one database per
descriptor (hundreds of files, each with the same tables, its meaning in
the ``metadata.json`` beside it and its schema version in Alembic's
table), or the same layout as schemas on a PostgreSQL server, which
Datasette does not read at all. The questions asked of it cross databases
(a battle joins two models' completion databases with a judge's judgement
database by instruction) and need the store's own reading of its values
(the logprobs format, U+0000 escaped on a server, the verdict slots mapped
back to models). And the guarantee that browsing writes nothing is the
store's: its read-only opens write no byte of a WAL database and its
server transactions are read-only, which a tool opening the files itself
would not give. A small Starlette app over the store's API keeps all of
that in one place, with server-rendered pages and no JavaScript.
"""
