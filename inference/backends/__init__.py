"""What answers the misses: the engine seam (:mod:`inference.backends.base`) and its two sides.

Contract: :mod:`inference.backends.vllm` loads a model in-process (imports
vLLM only when a batch has misses); :mod:`inference.backends.hosted` sends
requests to an OpenAI-compatible server (imports ``openai`` only then). The
cache boundary (:mod:`inference.cache`) sees only :mod:`inference.backends.base`.
"""
