"""The tables: each declared once, and everything that must follow the declaration.

* :mod:`store.tables.models`: the SQLAlchemy declarative models, the one
  declaration of every table (completions, judgements, runs, adoptions).
* :mod:`store.tables.records`: the frozen records, generated from the models
  by :mod:`store.tables.codegen` (``python -m store.tables.codegen``).
* :mod:`store.tables.deferred`: what a hit leaves unread (the prompt) and
  loads on access.
* :mod:`store.tables.row_checks`: the checks every row passes before any
  store writes it, whatever the backend.
* :mod:`store.tables.filters`: row filters over the models' columns.

Nothing here knows a backend, a path or a URL; the backends
(:mod:`store.backends`) and everything above them import from here.
"""
