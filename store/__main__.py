"""``python -m store``: the data commands of ``judgestore`` (see :mod:`store.cli`)."""

from store.cli.app import main

if __name__ == "__main__":
    main()
