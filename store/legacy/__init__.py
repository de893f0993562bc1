"""Legacy caches (docs/legacy-formats.md) read, checked and imported into the current layout.

Modules, in the order an import runs through them:

* :mod:`store.legacy.readonly` opens legacy files without changing a byte.
* :mod:`store.legacy.metadata` reads legacy ``metadata.json`` files and trees.
* :mod:`store.legacy.detect` says what each file is, by content.
* :mod:`store.legacy.inputs` reads the user's inputs file (inputs some formats never stored).
* :mod:`store.legacy.formats` streams each variant's rows.
* :mod:`store.legacy.convert` verifies, rehashes and normalises each row into a record.
* :mod:`store.legacy.writer` writes the records in chunks, counting each outcome.
* :mod:`store.legacy.importer` runs an import source by source (the entry point).
* :mod:`store.legacy.report` accounts for every row.

This package never decides which descriptor legacy rows belong to: a resolver
passed to :func:`store.legacy.importer.import_sources` does
(``inference.legacy`` maps legacy descriptors with the live rules; the store
layer imports nothing from ``inference``).
"""
