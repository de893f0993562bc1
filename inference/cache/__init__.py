"""The cache boundary: a model behind the store, what it plans for a batch, what a call did and cost.

Contract: :mod:`inference.cache.model` (:class:`CachedModel`) plans a batch
against the store and prepares the engine only for misses;
:mod:`inference.cache.plan` is what it decides, :mod:`inference.cache.rows`
what crosses it (engine requests, rows, samples) and
:mod:`inference.cache.accounting` what a call did, cost and saved. One whole
run around it is :mod:`inference.run`. Nothing here imports vLLM, torch or
``openai``, nor any model spec.
"""
