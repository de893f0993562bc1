"""Where the store's databases live: SQLite files in a folder (:mod:`.sqlite`), schemas on a server (:mod:`.postgres`).

Contract: each backend implements the seam of :mod:`store.backend` (a
``Storage`` of ``Database`` s) and owns everything that differs between the
two: connections, the hot statements, what a driver failure means, schema
checks, upgrades, verification and vacuuming. Nothing above the seam
branches on a dialect or touches a folder or a URL.
"""
