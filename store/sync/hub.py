"""A Hugging Face Hub dataset repository as a :class:`~store.sync.remote.Remote`.

Contract (on top of the remote contract in :mod:`store.sync.remote`):

* ``huggingface_hub`` is imported when a :class:`HubRemote` is built, never
  when :mod:`store` or :mod:`store.sync` is imported.
* Pushes commit with ``create_commit`` on a branch *without*
  ``parent_commit``: the Hub serialises concurrent commits itself, and since
  every file is new and content addressed, no commit can undo another's.
* Every request is retried with exponential backoff and jitter on 408, 409,
  423, 425, 429 (waiting at least what ``Retry-After`` asks), 5xx, timeouts
  and dropped connections; 401 and 403 raise
  :class:`~store.errors.RemoteAuthError` and 404
  :class:`~store.errors.RemoteNotFoundError` at once.
* :meth:`HubRemote.add_files` is idempotent: each attempt asks the Hub which
  of the paths already exist at the branch head, builds fresh
  ``CommitOperationAdd`` objects (the client mutates them) for the others,
  and commits only those. A commit that was applied although its reply was
  an error (a 500 after the fact, a timeout) is therefore never repeated:
  the next attempt finds its files and commits nothing. Those files count
  as this push's (``added``), not as already there: its commit id is lost.
* Reads go through ``hf_hub_download`` at a pinned commit into a temporary
  cache that is removed at once, so no shard lingers in the user's HF cache.
* A push to a branch that does not exist creates it, as ``hf upload
  --revision`` does: :meth:`HubRemote.missing_branch` asks for the branch
  (``repo_info``; a missing *repository* is still the 404 error) and, when
  the Hub answers "no such revision", pins the default branch's head (a
  missing ``refs/...`` name is the 404 error at once: the Hub makes no such
  branch); :meth:`HubRemote.create_branch` makes the branch there
  (``create_branch`` with that commit as its starting point, so the branch
  holds exactly what the push planned against), only once the push has
  something to send. A 409 (the
  branch exists by now) counts as done if the branch stands at that commit;
  elsewhere (another pusher made it from another commit, or committed to it),
  the push plans again against the branch. 401 and 403 are
  :class:`~store.errors.RemoteAuthError` as everywhere.
"""

from __future__ import annotations

import email.utils
import logging
import math
import os
import random
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from store.errors import (
    InvalidInputError,
    RemoteAuthError,
    RemoteError,
    RemoteNotFoundError,
    RemoteUnavailableError,
    SyncError,
    UntrustedContentError,
)
from store.sync.remote import AddResult, MissingBranch, OutgoingFile, RemoteEntry

if TYPE_CHECKING:
    from huggingface_hub import HfApi

T = TypeVar("T")
log = logging.getLogger("store.sync")

RETRYABLE_STATUS = frozenset({408, 409, 423, 425, 429})
PATHS_PER_REQUEST = 100
DEFAULT_REVISION = "main"  # the branch a repository is created with, and the one pushes and fetches use by default


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to wait: ``attempts`` tries in all, backoff doubling from ``base_delay``."""

    attempts: int = 8
    base_delay: float = 1.0
    max_delay: float = 60.0
    max_retry_after: float = 600.0  # a Retry-After beyond this is taken as this

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based).

        "Equal jitter": half the backoff is fixed, half random, so eight pushers
        rejected at the same moment come back at different moments, yet none
        retries at once. A server's Retry-After is a floor, not a suggestion.
        """
        backoff = min(self.max_delay, self.base_delay * 2.0**attempt)
        wait = backoff / 2 + rng.uniform(0, backoff / 2)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_retry_after))
        return wait


@dataclass(frozen=True, slots=True)
class _Failure:
    status: int | None  # None: no HTTP answer (timeout, dropped connection)
    retryable: bool
    retry_after: float | None
    detail: str


# The client refuses every request while HF_HUB_OFFLINE is set, which vLLM users often set for good.
OFFLINE = (
    "HF_HUB_OFFLINE is set, so huggingface_hub sends no request: unset it for this command to share through the "
    "Hub, or share through a folder (`hub push`/`hub fetch --dir`; JUDGESTORE_SYNC_DIR for a run's --fetch, "
    "instead of JUDGESTORE_HUB_REPO)"
)


def _transport_errors() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = [TimeoutError, ConnectionError]
    for module in ("httpx2", "httpx"):  # huggingface_hub 2.x ships on httpx2; be ready for either
        try:
            kinds.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(kinds)


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


_BEARER = re.compile(r"Bearer\s+[^\s'\"]+")


def _classify(error: BaseException) -> _Failure | None:
    """What a client exception means for retrying; None for exceptions that are not about the network."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:  # the HTTP error may be the cause of another
        seen.add(id(current))
        if isinstance(current, OfflineModeIsEnabled):  # a ConnectionError, but no retry will get through
            return _Failure(None, False, None, OFFLINE)
        response = getattr(current, "response", None)
        if isinstance(current, HfHubHTTPError) and response is not None:
            status = int(response.status_code)
            retryable = status in RETRYABLE_STATUS or status >= 500
            detail = _first_line(str(current)) or f"HTTP {status}"
            return _Failure(status, retryable, _retry_after(response.headers), detail)
        if isinstance(current, _transport_errors()):  # the client's words may quote a header: never the token
            said = _BEARER.sub("Bearer ***", str(current))
            return _Failure(None, True, None, f"{type(current).__name__}: {said}")
        current = current.__cause__ or current.__context__
    if isinstance(error, LocalEntryNotFoundError):  # hf_hub_download could not reach the file
        return _Failure(None, True, None, str(error).splitlines()[0])
    if isinstance(error, OSError) and "Consistency check failed" in str(error):  # a download cut short
        return _Failure(None, True, None, str(error).splitlines()[0])
    return None


def _first_line(message: str) -> str:
    """The first line of an error message, with the next one when it only announces it: the client words a 400 as
    ``Bad request:`` on one line and the server's reason on the next."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


def _caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``error`` or one of its causes is a ``kind`` (the client's typed 404s: a file, a revision)."""
    current: BaseException | None = error
    for _ in range(8):  # the cause chain is short; bound it anyway
        if current is None:
            return False
        if isinstance(current, kind):
            return True
        current = current.__cause__ or current.__context__
    return False


def check_repo_id(repo_id: str, named: str = "--repo") -> None:
    """InvalidInputError, naming where the id came from (``named``), unless ``repo_id`` is a repository's ORG/NAME."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if repo_id.count("/") != 1:
            raise HFValidationError("a dataset repository id is ORG/NAME")
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise InvalidInputError(f"{named} must be ORG/NAME (a dataset repository id), got {repo_id!r}: {e}") from e


def check_token(token: str | bool | None) -> None:
    """Refuse a token no server could take, without showing it: the HTTP client refuses its header locally, an
    error that holds the whole token, and it read as a network failure retried for a minute and a half."""
    if not isinstance(token, str):
        return
    if not token:
        raise InvalidInputError(
            'the token is empty (an unset variable in --token "$VAR"?): pass the token, or leave it out to use '
            "$HF_TOKEN or the saved one"
        )
    if not token.isascii() or any(char.isspace() or not char.isprintable() for char in token):
        raise InvalidInputError(
            "the token holds whitespace, a control character or a character that is not ASCII (a file's \\r\\n "
            'line ending kept by "$(cat file)"?); a token is one word of ASCII letters and digits. It is not shown '
            "here"
        )


class HubRemote:
    """A dataset repository (and branch) on the Hugging Face Hub, or on any server speaking its API."""

    def __init__(
        self,
        repo_id: str,
        *,
        revision: str = DEFAULT_REVISION,
        repo_type: str = "dataset",
        token: str | bool | None = None,
        endpoint: str | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        max_files_per_add: int = 100,
        api: HfApi | None = None,
    ) -> None:
        try:
            from huggingface_hub import HfApi
        except ImportError as e:
            raise SyncError(
                "sharing through the Hugging Face Hub needs huggingface_hub, a dependency of judgestore: "
                "`pip install 'huggingface_hub>=2.4,<3'` (or share through a folder with --dir)"
            ) from e

        check_repo_id(repo_id)  # before anything is asked of the Hub or written to the bookkeeping
        check_token(token)
        self.repo_id = repo_id
        self.revision = revision
        self.repo_type = repo_type
        self.api = api or HfApi(endpoint=endpoint, token=token)
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.max_files_per_add = max_files_per_add

    def __repr__(self) -> str:
        return f"HubRemote({self.url!r}, revision={self.revision!r})"

    @property
    def url(self) -> str:
        # The repository, not the revision: a shard fetched at one branch, tag or commit is skipped by a fetch at
        # another and its rows are never echoed. Whether it was the default branch is recorded beside it
        # (store.sync.remote.at_default), so a push to main still sends the rows main lacks.
        # A mirror's HF_ENDPOINT may carry user:password@: recorded in the sync database and printed, never with them
        endpoint = self.api.endpoint.rstrip("/")
        parts = urlsplit(endpoint)
        if "@" in parts.netloc:  # only then rebuilt: any other endpoint names the remote as it always did
            endpoint = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        return f"hf:{endpoint}/{self.repo_type}s/{self.repo_id}"

    @property
    def pushed_to(self) -> str:
        # A push lands on its branch only: what went to `dev` is still to send to main.
        return self.url if self.revision == DEFAULT_REVISION else f"{self.url}@{self.revision}"

    # ------------------------------------------------------------ the retry edge

    def _call(self, what: str, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` under the retry policy, translating client errors into typed ones."""
        for tries in range(self.retry.attempts):
            try:
                return attempt()
            except Exception as e:
                failure = _classify(e)
                if failure is None:
                    if isinstance(e, ValueError | KeyError | TypeError):  # a malformed answer from the server
                        raise RemoteError(self.url, f"{what}: unexpected answer from the server ({e})") from e
                    raise
                self._raise_if_fatal(what, failure, e)
                if tries == self.retry.attempts - 1:
                    raise RemoteUnavailableError(
                        self.url,
                        f"{what} still failing after {self.retry.attempts} attempts ({failure.detail}); nothing "
                        "unconfirmed was recorded, so running the same command again later is safe",
                    ) from e
                wait = self.retry.delay(tries, failure.retry_after, self.rng)
                log.warning("%s: %s failed (%s); retrying in %.1fs", self.url, what, failure.detail, wait)
                self.sleep(wait)
        raise AssertionError("unreachable")

    def _raise_if_fatal(self, what: str, failure: _Failure, error: Exception) -> None:
        if failure.status in (401, 403):
            hint = (
                # the Hub also answers 401 for a private or missing repository when the request is anonymous
                "no valid token, or the repository is private or missing: run `hf auth login`, set HF_TOKEN or "
                "pass --token, and check --repo"
                if failure.status == 401
                else "the token may not do this (pushing needs a write token with access to the repository)"
            )
            raise RemoteAuthError(self.url, f"{what}: HTTP {failure.status}, {hint}") from error
        from huggingface_hub.errors import RemoteEntryNotFoundError, RevisionNotFoundError

        if failure.status == 404 and _caused_by(error, RemoteEntryNotFoundError):
            raise RemoteNotFoundError(self.url, f"{what}: HTTP 404, no such file at this revision") from error
        if failure.status == 404 and _caused_by(error, RevisionNotFoundError):
            # The repository answered; only the revision is missing. --create-repo would not help: a push to a
            # branch that does not exist makes it.
            raise RemoteNotFoundError(
                self.url,
                f"{what}: HTTP 404, the repository has no revision {self.revision!r}. Check --revision; a push to "
                "a branch that does not exist creates it.",
            ) from error
        if failure.status == 404:
            raise RemoteNotFoundError(
                self.url,
                f"{what}: HTTP 404, the repository or the revision {self.revision!r} does not exist, or the token "
                "cannot see it (a private repository). Check --repo and --revision; to create it, push with "
                "--create-repo.",
            ) from error
        if not failure.retryable:
            raise RemoteError(self.url, f"{what}: {failure.detail}") from error

    # ------------------------------------------------------------ the remote protocol

    def private(self) -> bool | None:
        """Whether the repository is private; None when it does not exist (or this token cannot see it)."""
        try:
            info = self._call(
                "reading the repository", lambda: self.api.repo_info(self.repo_id, repo_type=self.repo_type)
            )
        except RemoteNotFoundError:
            return None
        return bool(info.private)

    def create_repo(self, *, private: bool = False) -> None:
        """Create the repository if it does not exist (an existing one is left as it is)."""
        self._call(
            "creating the repository",
            lambda: self.api.create_repo(self.repo_id, repo_type=self.repo_type, private=private, exist_ok=True),
        )

    def head(self) -> str | None:
        info = self._call(
            f"resolving {self.revision!r}",
            lambda: self.api.repo_info(self.repo_id, repo_type=self.repo_type, revision=self.revision),
        )
        if not info.sha:
            raise RemoteError(self.url, f"the server did not say which commit {self.revision!r} points to")
        return str(info.sha)

    def list(self, prefix: str, *, revision: str | None, recursive: bool) -> list[RemoteEntry]:
        from huggingface_hub import RepoFolder
        from huggingface_hub.errors import RemoteEntryNotFoundError

        def attempt() -> list[RemoteEntry]:
            try:
                items = list(
                    self.api.list_repo_tree(
                        self.repo_id,
                        path_in_repo=prefix or None,
                        recursive=recursive,
                        revision=revision or self.revision,
                        repo_type=self.repo_type,
                    )
                )
            except RemoteEntryNotFoundError:
                return []
            return [
                RemoteEntry(item.path, True)
                if isinstance(item, RepoFolder)
                else RemoteEntry(item.path, False, item.size)
                for item in items
            ]

        return self._call(f"listing {prefix or '/'}", attempt)

    def read(self, path: str, *, revision: str | None, max_bytes: int) -> bytes:
        def attempt() -> bytes:
            with tempfile.TemporaryDirectory(prefix="judgestore-download-") as cache:
                local = self.api.hf_hub_download(
                    self.repo_id, path, repo_type=self.repo_type, revision=revision or self.revision, cache_dir=cache
                )
                if os.path.getsize(local) > max_bytes:
                    raise UntrustedContentError(path, f"is larger than the cap of {max_bytes:,} bytes; refusing it")
                with open(local, "rb") as f:
                    return f.read()

        return self._call(f"downloading {path}", attempt)

    def _existing_now(self, paths: Sequence[str], revision: str | None = None) -> set[str]:
        """The paths among ``paths`` that are files at ``revision``, else the branch head (one request per 100
        paths, no retry)."""
        from huggingface_hub import RepoFile

        found: set[str] = set()
        for start in range(0, len(paths), PATHS_PER_REQUEST):
            chunk = list(paths[start : start + PATHS_PER_REQUEST])
            infos = self.api.get_paths_info(
                self.repo_id, chunk, revision=revision or self.revision, repo_type=self.repo_type
            )
            found.update(info.path for info in infos if isinstance(info, RepoFile))
        return found

    def existing(self, paths: Sequence[str], *, revision: str | None = None) -> set[str]:
        if not paths:
            return set()
        return self._call("checking which files exist", lambda: self._existing_now(paths, revision))

    def missing_branch(self) -> MissingBranch | None:
        from huggingface_hub.errors import RevisionNotFoundError

        def attempt() -> MissingBranch | None:
            try:
                found = self.api.repo_info(self.repo_id, repo_type=self.repo_type, revision=self.revision)
            except RevisionNotFoundError:  # the repository answered: it is there, the branch is not
                pass
            else:
                # A commit resolves too, but a push commits onto a branch: it failed with a 404, after a dry run
                # that said it would push, and left a pending shard recorded (was).
                if found.sha == self.revision:
                    raise RemoteNotFoundError(
                        self.url,
                        f"the revision {self.revision!r} is a commit, not a branch: a push commits onto a branch; "
                        "give its name as --revision (a commit is for hub fetch)",
                    )
                return None
            # No revision: the repository's default branch, the one the Hub makes a branch from by default.
            info = self.api.repo_info(self.repo_id, repo_type=self.repo_type)
            if not info.sha:
                raise RemoteError(self.url, "the server did not say which commit the default branch points to")
            return MissingBranch(self.revision, str(info.sha))

        missing = self._call(f"resolving {self.revision!r}", attempt)
        if missing is not None and missing.name.startswith("refs/"):
            # The Hub refuses these as branch names (400): say so now, before a dry run promises to make it.
            raise RemoteNotFoundError(
                self.url,
                f"the revision {missing.name!r} does not exist, and a push cannot create a refs/ name (the Hub's "
                "own: pull requests, conversions); check --revision, or give a plain branch name",
            )
        return missing

    def create_branch(self, branch: MissingBranch) -> bool:
        from huggingface_hub.errors import HfHubHTTPError

        def attempt() -> bool:
            try:
                # From the pinned commit rather than whatever the default branch holds by now: the push read what
                # to send at that commit, so the branch must start there.
                self.api.create_branch(self.repo_id, branch=branch.name, revision=branch.base, repo_type=self.repo_type)
                return True
            except HfHubHTTPError as e:
                # 409: the branch exists (another pusher made it, or an attempt whose answer was lost did). It is
                # not retried as other 409s are; where it stands says whether it holds what the push planned on.
                if e.response is None or e.response.status_code != 409:
                    raise
            info = self.api.repo_info(self.repo_id, repo_type=self.repo_type, revision=branch.name)
            return info.sha == branch.base

        return self._call(f"creating the branch {branch.name!r}", attempt)

    def add_files(self, files: Sequence[OutgoingFile], *, message: str) -> AddResult:
        from huggingface_hub import CommitOperationAdd

        wanted = [f.path for f in files]
        sent: set[str] = set()  # what an attempt committed: found there on the next, its answer was lost

        def attempt() -> AddResult:
            # Ask again on every attempt: a failed attempt may have been applied all the same.
            present = self._existing_now(wanted)
            todo = [f for f in files if f.path not in present]
            commits: tuple[str, ...] = ()
            if todo:
                sent.update(f.path for f in todo)
                # Fresh operation objects every time: create_commit mutates them and refuses reused ones.
                operations = [CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(f.source)) for f in todo]
                info = self.api.create_commit(
                    self.repo_id, operations, commit_message=message, repo_type=self.repo_type, revision=self.revision
                )
                commits = (str(info.oid),)
            added = tuple(p for p in wanted if p in sent)  # a lost answer's files among them: this push sent them
            return AddResult(added, tuple(p for p in wanted if p in present and p not in sent), commits)

        return self._call(f"committing {len(files)} files", attempt)
