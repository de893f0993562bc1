"""The in-process vLLM engine: settings to descriptor, a pinned model source, the engine, what it would refuse.

Contract: nothing in this package imports vLLM or torch at import time; the
engine (:mod:`inference.backends.vllm.backend`) imports them when a batch has
misses. :mod:`inference.backends.vllm.tiny_model` builds the tiny model the
tests and the demo load.
"""
