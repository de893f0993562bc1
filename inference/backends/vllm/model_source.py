"""Where a model's files come from, pinned: a local folder by its content, or a Hub id by its commit.

Contract: :func:`resolve_model` turns the model a user names (as
``vllm.LLM(model=...)`` takes it) into a :class:`ModelSource`: the name and
revision a descriptor records, and the folder holding its small files (configs,
tokenizer, chat template), if any. It never imports vllm, torch or
transformers and never downloads weights.

* **A local folder** (what vLLM would load as a path) is named by its folder
  name and pinned by :func:`local_model_digest` (``"sha256:<hex>"`` of its
  small files and a fingerprint of each weight file). How the path was
  spelled (``./m``, ``m/``, ``/abs/path/m``) and where the folder lies are not
  part of it: a moved folder keeps hitting its rows; a renamed folder starts a
  new descriptor (a spurious miss, which is safe); an edited file starts a new
  one, and weights edited in bytes the fingerprint does not read are refused
  on the machine that saw them before (:mod:`inference.backends.vllm.weights`).
* **A Hugging Face Hub id** is pinned to a 40-hex commit: the given revision
  when it already is one, else the commit the local Hugging Face cache maps the
  branch or tag to, else the one the Hub reports (``HfApi.model_info(...).sha``
  with a short timeout, honouring ``HF_ENDPOINT``, ``HF_TOKEN`` and
  ``HF_HUB_OFFLINE``). With ``need_files``, the tokenizer files that decide the
  chat template (``chat_template.jinja``, ``tokenizer_config.json``) are read
  from the cached snapshot of that commit, or downloaded alone (by commit, into
  the Hugging Face cache, never the weights).
* **A path that is not a folder** (a model named ``./m``, ``../m``, ``/m``,
  ``~/m``, or ``d/m`` where the folder ``d`` exists) is neither: it raises
  :class:`~store.errors.ModelFolderNotFoundError` ("no such model folder"),
  never a Hub lookup (a Hub id has no such spelling, and one whose first part
  names a local folder is taken as a path).
* When neither the cache nor the Hub can answer, :class:`UnpinnedModelError`
  says how to fix it; with ``allow_unpinned`` the source is instead marked
  *unpinned* (revision ``"unpinned:<requested revision>"``), so its rows never
  hit a pinned run and the other way round. A model or revision the Hub does
  not know raises :class:`ModelNotFoundError`.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue

from inference.backends.vllm.weights import WEIGHT_SUFFIXES, check_weights_unchanged
from store.descriptor import LOCAL_DIGEST_PREFIX, UNPINNED_PREFIX, canonical_json, sha256_hex
from store.errors import (
    InvalidInputError,
    JudgestoreError,
    ModelFolderNotFoundError,
    ModelNotFoundError,
    UnpinnedModelError,
)

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
HUB_TIMEOUT_S = 10.0
# The tokenizer files that decide the chat template, in the order transformers reads them.
TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")

# Files that decide what a folder's model computes, besides its weights: every
# top-level JSON (configs, tokenizer, special tokens, weight index, quantization
# and processor configs), templates, tokenizer vocabularies and remote code.
_SMALL_FILE_SUFFIXES = (".json", ".jinja", ".model", ".tiktoken", ".py")
_SMALL_FILE_NAMES = frozenset({"merges.txt", "vocab.txt"})
# Mistral's tokenizers (mistral_common, which vLLM uses for such a folder): tokenizer.model.v3, tokenizer.model.v7m1
_VERSIONED_TOKENIZER = re.compile(r".+\.model\.v\w+")
# A weight fingerprint reads the head of the file (the safetensors header:
# names, dtypes, shapes) and a few evenly spaced blocks: retrained or replaced
# weights change them all, and a 100 GB checkpoint costs a few hundred KiB.
_WEIGHT_HEAD_BYTES = 1 << 16
_WEIGHT_SAMPLES = 16
_WEIGHT_SAMPLE_BYTES = 1 << 12


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model as the descriptor records it, and where its small files lie on this machine."""

    given: str  # as the user named it: what vllm.LLM(model=...) is given
    name: str  # the descriptor's model: the hub id, or the folder's name
    revision: str  # a commit, "sha256:<digest>" for a folder, or "unpinned:<requested>"
    files: Path | None  # the folder (or cached snapshot) holding configs and tokenizer files
    requested_revision: str | None = None  # the branch, tag or commit asked for

    @property
    def is_local(self) -> bool:
        return self.revision.startswith(LOCAL_DIGEST_PREFIX)

    @property
    def pinned(self) -> bool:
        return not self.revision.startswith(UNPINNED_PREFIX)


def model_name(model: str) -> str:
    """The name a descriptor records for ``model``: a local folder's name, else the id as given."""
    return Path(os.path.abspath(model)).name if Path(model).is_dir() else model


# ---------------------------------------------------------------- local folders


def _weight_fingerprint(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(_WEIGHT_HEAD_BYTES))
        if size > _WEIGHT_HEAD_BYTES:
            for i in range(1, _WEIGHT_SAMPLES + 1):
                f.seek(size * i // (_WEIGHT_SAMPLES + 1))
                digest.update(f.read(_WEIGHT_SAMPLE_BYTES))
    return digest.hexdigest()


def local_model_digest(folder: Path) -> str:
    """``"sha256:<hex>"`` naming what a local model folder computes.

    Covers the top-level configs, tokenizer and template files, remote code and
    ``additional_chat_templates/``, by content, plus name, size and a sampled
    fingerprint of each weight file (see ``_weight_fingerprint``). Timestamps
    and the folder's own path are not part of it, so a copied folder keeps
    its digest. Docs (README, LICENSE) are left out.
    """
    folder = Path(folder)
    entries: list[list[JsonValue]] = []
    candidates = sorted(folder.iterdir()) + sorted((folder / "additional_chat_templates").glob("*.jinja"))
    for path in candidates:
        if not path.is_file() or path.name.startswith("."):
            continue
        name = path.relative_to(folder).as_posix()
        if path.name.endswith(WEIGHT_SUFFIXES):
            entries.append(["weights", name, path.stat().st_size, _weight_fingerprint(path)])
        elif (
            path.name.endswith(_SMALL_FILE_SUFFIXES)
            or path.name in _SMALL_FILE_NAMES
            or _VERSIONED_TOKENIZER.fullmatch(path.name)
        ):
            entries.append(["file", name, sha256_hex(path.read_bytes())])
    if not entries:
        raise InvalidInputError(f"{folder}: no model files found (expected config.json, tokenizer and weights)")
    if not any((folder / name).is_file() for name in ("config.json", "params.json")):  # params.json: Mistral's format
        # vLLM would be imported and then refuse it in several lines of its own, blamed on the engine arguments
        raise InvalidInputError(f"{folder}: no config.json, so not a model folder (expected config.json, tokenizer "
                                "and weights)")  # fmt: skip
    return LOCAL_DIGEST_PREFIX + sha256_hex(canonical_json(entries))


# ---------------------------------------------------------------- the Hugging Face cache and Hub


def hub_offline() -> bool:
    """Whether the Hugging Face client is offline (``HF_HUB_OFFLINE``, as the client itself read it)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _cache_repo(repo_id: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    if cache_dir is None:
        from huggingface_hub import constants

        cache_dir = constants.HF_HUB_CACHE
    return Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def cached_commit(repo_id: str, revision: str | None, cache_dir: str | os.PathLike[str] | None) -> str | None:
    """The commit ``revision`` (a commit, or a branch or tag the local cache knows) names; None if unknown here."""
    if revision is not None and COMMIT_RE.match(revision):
        return revision
    ref = _cache_repo(repo_id, cache_dir) / "refs" / (revision or "main")
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return commit if COMMIT_RE.match(commit) else None


def _snapshot(repo_id: str, commit: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    return _cache_repo(repo_id, cache_dir) / "snapshots" / commit


def cached_snapshot(repo_id: str, commit: str, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The folder of ``commit``'s files in the local Hugging Face cache (``cache_dir``: vLLM's ``download_dir``)."""
    snapshot = _snapshot(repo_id, commit, cache_dir)
    return snapshot if snapshot.is_dir() else None


def _has_template_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TEMPLATE_FILES)


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def _hub_failure(repo_id: str, revision: str | None, error: Exception) -> JudgestoreError:
    """A Hub error as judgestore's: not found (typed, final) or unreachable (the caller decides)."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(error, GatedRepoError):
        return ModelNotFoundError(
            f"{repo_id} is gated on the Hub: accept its terms on its page and set HF_TOKEN to a token that may read it"
        )
    if isinstance(error, RevisionNotFoundError):
        return ModelNotFoundError(
            f"{repo_id} has no revision {revision!r} on the Hub; pass an existing branch, tag or commit"
        )
    if isinstance(error, RepositoryNotFoundError):
        return ModelNotFoundError(
            f"{repo_id} is neither a local folder nor a model on the Hub (or it is private: set HF_TOKEN)"
        )
    return UnpinnedModelError(f"{type(error).__name__}: {error}")


def _ask_hub(repo_id: str, revision: str | None) -> tuple[str, frozenset[str]]:
    """The commit the Hub reports for ``revision`` (default: main) and the files at it."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=_endpoint()).model_info(repo_id, revision=revision, timeout=HUB_TIMEOUT_S)
    except Exception as e:  # network, HTTP and offline errors alike: classified by _hub_failure
        raise _hub_failure(repo_id, revision, e) from e
    if info.sha is None or not COMMIT_RE.match(info.sha):
        raise UnpinnedModelError(f"the Hub answered without a commit for {repo_id}@{revision or 'main'}")
    return info.sha, frozenset(s.rfilename for s in info.siblings or ())


def _download_template_files(
    repo_id: str, commit: str, available: frozenset[str] | None, cache_dir: str | os.PathLike[str] | None
) -> Path:
    """Fetch the template files of ``commit`` alone into the HF cache; return the snapshot folder."""
    from huggingface_hub import hf_hub_download

    if available is None:
        _, available = _ask_hub(repo_id, commit)
    snapshot = _snapshot(repo_id, commit, cache_dir)
    for name in TEMPLATE_FILES:
        if name in available and not (snapshot / name).is_file():
            try:
                # By commit: the cache gains the file but no ref, so a branch is never frozen locally by this.
                hf_hub_download(
                    repo_id,
                    name,
                    revision=commit,
                    cache_dir=None if cache_dir is None else os.fspath(cache_dir),
                    endpoint=_endpoint(),
                    etag_timeout=HUB_TIMEOUT_S,
                )
            except Exception as e:
                raise _hub_failure(repo_id, commit, e) from e
    return snapshot


def _unpinned_error(repo_id: str, revision: str | None, cause: str, need_files: bool) -> UnpinnedModelError:
    wanted = "a commit and its tokenizer files" if need_files else "a commit"
    files = " ".join(TEMPLATE_FILES)
    return UnpinnedModelError(
        f"{repo_id}@{revision or 'main'}: cannot pin this Hugging Face model to {wanted}: the local Hugging Face "
        f"cache does not have it and the Hub cannot be asked ({cause}). Fix it by one of: download it first "
        f"(`hf download {repo_id}`, or only `hf download {repo_id} {files}` for the cache key); pass a commit "
        "as --revision (engine kwarg revision=) with its tokenizer files in the cache; or pass --allow-unpinned "
        "(ModelSpec(allow_unpinned=True)) to cache under an explicitly unpinned descriptor, whose rows never "
        "hit a pinned run"
    )


_PATH_PREFIXES = ("./", "../", "/", "~")


def looks_like_path(model: str) -> bool:
    """Whether ``model`` is spelled as a path rather than a Hub id (see the module docstring)."""
    if model in (".", "..") or model.startswith(_PATH_PREFIXES):
        return True
    parent = Path(model).parent
    return parent != Path(".") and parent.is_dir()


def check_folder(model: str) -> None:
    """Raise :class:`ModelFolderNotFoundError` when ``model`` is spelled as a path and is not a folder, or is no
    folder and has whitespace around it (a Hub id never has)."""
    path = Path(model)
    if model != model.strip() and not path.is_dir():  # " /models/m" was taken for a Hub id, and told of its cache
        raise ModelFolderNotFoundError(
            f"no such model folder or Hub id: {model!r} starts or ends with whitespace (a quoting slip?)"
        )
    if path.is_dir() or not looks_like_path(model):
        return
    if path.exists():
        raise ModelFolderNotFoundError(f"{model} is a file, not a model folder: give the folder holding config.json")
    expanded = Path(model).expanduser()
    if model.startswith("~") and expanded.is_dir():
        raise ModelFolderNotFoundError(f"no such model folder: {model} (~ is not expanded here: give {expanded})")
    raise ModelFolderNotFoundError(f"no such model folder: {model}")


def resolve_model(
    model: str,
    revision: str | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    need_files: bool = True,
    allow_unpinned: bool = False,
) -> ModelSource:
    """Pin ``model`` at ``revision``; see the module docstring.

    ``need_files`` asks for the folder holding the tokenizer files (for the
    chat template); ``cache_dir`` is vLLM's ``download_dir`` (default: the
    Hugging Face cache).
    """
    if Path(model).is_dir():
        digest = local_model_digest(Path(model))
        check_weights_unchanged(Path(model), digest)  # an edit the digest's samples miss: refused here
        return ModelSource(model, model_name(model), digest, Path(model), revision)
    check_folder(model)
    commit = cached_commit(model, revision, cache_dir)
    available: frozenset[str] | None = None
    try:
        if commit is None:
            if hub_offline():
                raise UnpinnedModelError("HF_HUB_OFFLINE is set")
            commit, available = _ask_hub(model, revision)
        files: Path | None = None
        if need_files:
            files = _snapshot(model, commit, cache_dir)
            if not _has_template_files(files):
                if hub_offline():
                    raise UnpinnedModelError("HF_HUB_OFFLINE is set")
                files = _download_template_files(model, commit, available, cache_dir)
    except UnpinnedModelError as e:
        if not allow_unpinned:
            raise _unpinned_error(model, revision, str(e), need_files) from e
        return ModelSource(model, model, UNPINNED_PREFIX + (revision or "main"), None, revision)
    return ModelSource(model, model, commit, files, revision)
