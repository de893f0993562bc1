"""Hosted and served models behind an OpenAI-compatible API: their descriptor, the client, the wire format.

Contract: :mod:`inference.backends.hosted.descriptor` makes the descriptor
(:class:`inference.spec.HostedSpec` is the spec that uses it);
:mod:`inference.backends.hosted.client` is the client (imports ``openai``
only when a batch has misses); :mod:`inference.backends.hosted.wire` maps
requests to bodies and answers to generations.
"""
