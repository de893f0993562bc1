"""Sharing caches: push rows to a remote as immutable shards, fetch and validate other people's.

The library surface (the CLI in :mod:`store.cli.hub` and the inference
layer call these):

* :func:`push` / :func:`fetch` with a :class:`~store.layout.Selector`
  (role, task, provider, model, descriptor) return a :class:`PushReport` /
  :class:`FetchReport`.
* ``Selector.of(role, task, descriptor)`` selects exactly one descriptor
  folder: the inference layer fetches the folder of a run with it before
  planning the run.
* :func:`open_remote` builds a :class:`HubRemote` (a Hugging Face dataset
  repository) or a :class:`DirectoryRemote` (a shared folder) from arguments
  or ``JUDGESTORE_HUB_REPO`` / ``JUDGESTORE_SYNC_DIR``.

Importing this package does not import ``huggingface_hub``; building a Hub
remote does. The protocol and its guarantees are in ``docs/sharing.md`` and
the docstrings of :mod:`store.sync.push` and :mod:`store.sync.fetch`.
"""

from __future__ import annotations

from store.settings import SyncSettings
from store.sync.fetch import FetchReport, fetch
from store.sync.hub import HubRemote, RetryPolicy
from store.sync.push import PushReport, push
from store.sync.remote import DirectoryRemote, Remote, open_remote

__all__ = [
    "DirectoryRemote",
    "FetchReport",
    "HubRemote",
    "PushReport",
    "Remote",
    "RetryPolicy",
    "SyncSettings",
    "fetch",
    "open_remote",
    "push",
]
