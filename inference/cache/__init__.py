"""The cache boundary: a model behind the store, what it plans for a batch, what a call did and cost, a whole run.

Contract: :mod:`inference.cache.model` (:class:`CachedModel`) plans a batch
against the store and prepares the engine only for misses;
:mod:`inference.cache.plan` is what it decides, :mod:`inference.cache.accounting`
what a call cost and saved, :mod:`inference.cache.run` one whole run as the
command line does it. Nothing here imports vLLM, torch or ``openai``.
"""
