"""Hosted and served models behind an OpenAI-compatible API: the spec and its descriptor, the client, the wire format.

Contract: :mod:`inference.backends.hosted.spec` (:class:`HostedSpec`) makes
the descriptor; :mod:`inference.backends.hosted.client` is the client
(imports ``openai`` only when a batch has misses);
:mod:`inference.backends.hosted.wire` maps requests to bodies and answers to
generations.
"""
