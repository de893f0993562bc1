"""Weights edited where a local folder's digest does not read them: caught on this machine before any hit.

Contract:

* A local model folder's key (:func:`~inference.backends.vllm.model_source.local_model_digest`)
  reads each weight file's size, head and sixteen sampled blocks, so that a
  100 GB checkpoint is pinned in milliseconds. An edit of the same size that
  misses those bytes (a few layers fine-tuned in place, a LoRA merged into
  the file) keeps the key, and a run would take the rows the old weights
  wrote: a stale hit.
* :func:`check_weights_unchanged` closes that on the machine where the edit
  happens: it hashes each weight file whole once per state of the file
  (device, inode, size, modification time) and remembers, per key (the
  folder's name and its digest), the whole-file hashes it was first seen
  with (``$XDG_CACHE_HOME/judgestore/weights.json``). The same key with other
  whole-file hashes raises :class:`~store.errors.ModelWeightsChangedError`
  before anything is looked up. A folder of another name is another key,
  even with the same digest (two merges of one base whose sampled bytes
  agree): it was refused, told to take a folder of its own name, which it
  had. A key this machine has no record of yet is checked against the record
  an older judgestore made per digest alone, if there is one, so an edit
  made before the upgrade is still refused; those records are kept (an
  older judgestore on the machine reads them) and no longer written. A
  folder unchanged since it was last hashed costs a ``stat`` per file; the
  first sight of a file costs one read of it.
* The key itself is unchanged (rows stored under it stay usable). What this
  machine cannot know (weights edited elsewhere before this machine ever saw
  them) is not caught; a cache file that cannot be read or written is
  ignored, as the other caches of this machine are.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import orjson

from store.catalog import cache_home
from store.errors import ModelWeightsChangedError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _whole_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_weights_unchanged(folder: Path, digest: str) -> None:
    """Raise :class:`ModelWeightsChangedError` if ``folder``'s weights are not the bytes this machine first saw
    under ``digest`` (see the module docstring); else remember them."""
    record = cache_home() / "weights.json"
    try:
        known: Any = orjson.loads(record.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        known = {}
    if not isinstance(known, dict) or not isinstance(known.get("files"), dict):
        known = {"files": {}}
    for kind in ("models", "digests"):  # "digests": an older judgestore's, which resets a file without them
        if not isinstance(known.get(kind), dict):
            known[kind] = {}
    files: dict[str, str] = known["files"]
    key = f"{Path(os.path.abspath(folder)).name} {digest}"  # as the descriptor names the model: its folder's name
    seen = known["models"].get(key, known["digests"].get(digest))  # see the module docstring
    seen = seen if isinstance(seen, dict) else {}
    now: dict[str, str] = {}
    hashed = False
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.name.endswith(WEIGHT_SUFFIXES) or not path.is_file():
            continue
        stat = path.stat()
        state = f"{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}"
        if state not in files:
            files[state], hashed = _whole_sha256(path), True
        now[path.name] = files[state]
    changed = sorted(name for name, whole in now.items() if seen.get(name, whole) != whole)
    if changed:
        raise ModelWeightsChangedError(
            f"{folder}: {', '.join(changed)} changed since this machine first used this model, in bytes its key "
            f"({digest[:23]}...) does not read (the key samples each weight file): the rows stored under that key "
            "were computed by the weights as they were. Give the edited model a folder of its own name (a new key), "
            f"or delete those rows (`judgestore ls --model {folder.name}` lists their databases; `judgestore delete "
            f"--model {folder.name} --descriptor HASH` deletes them) and then remove {record}, which remembers the "
            "old weights"
        )
    if hashed or now.keys() - seen.keys() or key not in known["models"]:
        known["models"][key] = {**seen, **now}
        with contextlib.suppress(OSError):
            record.parent.mkdir(parents=True, exist_ok=True)
            temp = record.with_name(f".{record.name}.{os.getpid()}")
            temp.write_bytes(orjson.dumps(known))
            os.replace(temp, record)
