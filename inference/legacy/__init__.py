"""Legacy caches imported under live descriptors: the inference side of ``judgestore import``.

Contract: :mod:`inference.legacy.mapper` decides which descriptor each legacy
source's rows are imported under (the resolver :mod:`store.legacy.importer`
is given); :mod:`inference.legacy.settings` turns a legacy descriptor into the
live run that reproduces it; :mod:`inference.legacy.user_descriptor` reads
``--descriptor FILE``. The store side (detecting and reading the formats) is
:mod:`store.legacy`.
"""
