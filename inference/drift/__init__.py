"""When a run no longer hits what is stored: explain why, audit whether stored rows still come out the same, adopt them.

Contract: :mod:`inference.drift.explain` compares a run's descriptor and
inputs with the stored ones (reads only, never loads the engine);
:mod:`inference.drift.audit` regenerates a sample of stored rows without the
store and compares; :mod:`inference.drift.adopt` audits an older descriptor's
rows and carries them over to this run's descriptor.
"""
