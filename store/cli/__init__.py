"""The ``judgestore`` command line: :mod:`store.cli.app` assembles it, :mod:`store.cli.common` is its edge."""
