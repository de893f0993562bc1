"""A fake Hugging Face Hub for tests: an in-process HTTP server on 127.0.0.1 speaking what huggingface_hub 2.x sends.

The real client library talks to it unchanged (``HfApi(endpoint=hub.endpoint)``
or ``HF_ENDPOINT``, with ``HF_HUB_DISABLE_XET=1`` so uploads use the LFS
protocol instead of Xet). It implements, for dataset, model and space repos
(``{t}`` is ``datasets``, ``models`` or ``spaces``; downloads of model repos
have no type prefix):

==========================================================  =========================================
``POST /api/repos/create``                                  create a repo (409 if it exists)
``GET  /api/{t}/{ns}/{name}[/revision/{rev}]``              repo info (id, sha, private, siblings)
``GET  /api/{t}/{ns}/{name}/tree/{rev}[/{path}]``           listing, ``?recursive=``, paged by ``Link``
``POST /api/{t}/{ns}/{name}/paths-info/{rev}``              info of the paths that exist (form body)
``POST /api/{t}/{ns}/{name}/preupload/{rev}``               upload mode (regular or lfs) and remote oid
``POST /{t}/{ns}/{name}.git/info/lfs/objects/batch``        LFS batch: upload and verify actions
``PUT  /__lfs__/{sha256}`` / ``POST /__lfs__/{sha256}/verify``  LFS upload (hash and size checked), verify
``POST /api/{t}/{ns}/{name}/commit/{branch}``               NDJSON commit: header, file, lfsFile, deletes
``POST /api/{t}/{ns}/{name}/branch/{branch}``               create a branch (JSON ``startingPoint``)
``HEAD|GET /{t}/{ns}/{name}/resolve/{rev}/{path}``          download: X-Repo-Commit, ETag, Range
==========================================================  =========================================

Errors carry the ``X-Error-Code`` headers the client maps to its exceptions
(``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``). A branch is
created as ``HfApi.create_branch`` asks the Hub to: from ``startingPoint`` (a
branch, tag or commit), else from the head of ``main``; 409 ``Reference
refs/heads/{branch} already exists`` when the name is taken, 400 ``Invalid
reference for a branch`` for a ``refs/...`` name (the answers the client
library's own tests expect from the Hub). Here branches and tags share one
namespace (:meth:`FakeHub.tag` points a name that tests use as either). Tokens are
optional: with ``tokens`` set, writes need a ``write`` token (401 without a
valid one, 403 with a read token) and private repos hide from anonymous reads.

Fault injection: :meth:`FakeHub.add_fault` makes the next matching requests
fail with a status (and headers such as ``Retry-After``), apply a commit and
*then* fail, cut a download short, or serve other bytes. :meth:`FakeHub.put_raw`
commits any bytes at any path, ``..`` included, bypassing every check (a
tampered shard, a hostile listing). Every request is logged in ``requests``.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

REPO_TYPES = {"datasets": "dataset", "models": "model", "spaces": "space"}
URL_PREFIX = {"dataset": "datasets/", "model": "", "space": "spaces/"}
GITATTRIBUTES = b"*.gz filter=lfs diff=lfs merge=lfs -text\n*.parquet filter=lfs diff=lfs merge=lfs -text\n"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class StoredFile:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else git_blob_sha1(self.data)

    def tree_entry(self, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": git_blob_sha1(self.data), "size": len(self.data), "path": path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": len(self.data), "pointerSize": 134}
        return entry


@dataclass
class Commit:
    oid: str
    parent: str | None
    message: str
    files: dict[str, StoredFile]


@dataclass
class FakeRepo:
    repo_type: str
    repo_id: str
    private: bool
    commits: list[Commit] = field(default_factory=list)
    branches: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        oid = self.branches.get(revision, revision)
        return next((c for c in self.commits if c.oid == oid), None)


@dataclass
class Fault:
    """The next ``times`` requests whose method matches and whose path contains ``path_contains`` misbehave."""

    method: str
    path_contains: str
    status: int = 500
    times: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    after_apply: bool = False  # commits: apply it, then answer with ``status`` (the reply is "lost")
    truncate: int | None = None  # downloads: send this many body bytes, then drop the connection
    body: bytes | None = None  # downloads: serve these bytes instead (headers consistent with them)
    hits: int = 0


class FakeHub:
    """The server and its state; use as a context manager (see the module docstring)."""

    def __init__(
        self,
        *,
        page_size: int = 1000,
        lfs_patterns: tuple[str, ...] = ("*.gz",),
        tokens: dict[str, str] | None = None,
    ) -> None:
        self.page_size = page_size
        self.lfs_patterns = lfs_patterns
        self.tokens = tokens
        self.repos: dict[tuple[str, str], FakeRepo] = {}
        self.blobs: dict[str, bytes] = {}  # LFS storage by sha256
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []
        self.conflict_when_busy = False  # answer 409 to a commit that arrives while another is being applied
        self.commit_seconds = 0.0  # how long applying a commit takes (widens the window for conflicts)
        self.conflicts = 0
        self._committing = threading.Lock()
        self.lock = threading.RLock()
        self._counter = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-hub", daemon=True
        )  # a short poll: shutting down waits for one poll
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # ------------------------------------------------------------ test-side helpers

    def create_repo(self, repo_id: str, repo_type: str = "dataset", private: bool = False) -> FakeRepo:
        with self.lock:
            repo = FakeRepo(repo_type, repo_id, private)
            self.repos[(repo_type, repo_id)] = repo
            self._commit(repo, "main", "initial commit", {".gitattributes": StoredFile(GITATTRIBUTES, False)}, ())
            return repo

    def repo(self, repo_id: str, repo_type: str = "dataset") -> FakeRepo:
        return self.repos[(repo_type, repo_id)]

    def commits(self, repo_id: str, repo_type: str = "dataset") -> list[Commit]:
        with self.lock:
            return list(self.repo(repo_id, repo_type).commits)

    def files(self, repo_id: str, repo_type: str = "dataset", revision: str = "main") -> dict[str, bytes]:
        with self.lock:
            commit = self.repo(repo_id, repo_type).resolve(revision)
            assert commit is not None
            return {path: f.data for path, f in commit.files.items()}

    def put_raw(self, repo_id: str, files: dict[str, bytes | None], repo_type: str = "dataset") -> str:
        """Commit ``files`` as they are (None deletes), with no validation at all: tampering, hostile paths."""
        with self.lock:
            repo = self.repo(repo_id, repo_type)
            adds = {p: StoredFile(d, self._is_lfs(p, len(d))) for p, d in files.items() if d is not None}
            return self._commit(repo, "main", "raw edit", adds, [p for p, d in files.items() if d is None]).oid

    def tag(self, repo_id: str, tag: str, revision: str = "main", repo_type: str = "dataset") -> str:
        """Point ``tag`` at the commit ``revision`` names now (tags and branches resolve alike on the Hub)."""
        with self.lock:
            repo = self.repo(repo_id, repo_type)
            commit = repo.resolve(revision)
            assert commit is not None
            repo.branches[tag] = commit.oid
            return commit.oid

    def add_fault(self, fault: Fault) -> Fault:
        with self.lock:
            self.faults.append(fault)
        return fault

    def count(self, method: str, path_contains: str) -> int:
        with self.lock:
            return sum(1 for m, p in self.requests if m == method and path_contains in p)

    # ------------------------------------------------------------ internals

    def _is_lfs(self, path: str, size: int) -> bool:
        name = path.rsplit("/", 1)[-1]
        return size > 10 * 1024 * 1024 or any(fnmatch.fnmatch(name, pattern) for pattern in self.lfs_patterns)

    def _commit(self, repo: FakeRepo, branch: str, message: str, adds: dict[str, StoredFile], deletes: Any) -> Commit:
        parent = repo.resolve(branch)
        files = dict(parent.files) if parent else {}
        for path in deletes:
            files.pop(path, None)
            for other in [p for p in files if p.startswith(path.rstrip("/") + "/")]:
                files.pop(other)
        files.update(adds)
        oid = hashlib.sha1(f"{repo.repo_id}:{next(self._counter)}:{message}".encode()).hexdigest()
        commit = Commit(oid, parent.oid if parent else None, message, files)
        repo.commits.append(commit)
        repo.branches[branch] = oid
        return commit

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method == method and fault.path_contains in path and fault.hits < fault.times:
                    fault.hits += 1
                    return fault
        return None


class HTTPError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}
        self.extra = extra or {}


def _valid_repo_path(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes; Nagle would stall each reply
    fake: FakeHub

    def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures, not access logs
        return

    # ------------------------------------------------------------ plumbing

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": "application/json", **(headers or {})}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(value).encode(), headers)

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self.fake.requests.append((method, url.path))
        body = self._body() if method in ("POST", "PUT") else b""
        fault = self.fake._take_fault(method, url.path)
        try:
            if fault is not None and not fault.after_apply and fault.truncate is None and fault.body is None:
                raise HTTPError(fault.status, f"injected {fault.status}", headers=fault.headers)
            self._route(method, url.path, parse_qs(url.query), body, fault)
        except HTTPError as e:
            headers = {"X-Error-Message": e.message, **e.headers}
            if e.code:
                headers["X-Error-Code"] = e.code
            self._json({"error": e.message, **e.extra}, e.status, headers)

    def _route(self, method: str, raw_path: str, query: dict[str, list[str]], body: bytes, fault: Fault | None) -> None:
        segments = [unquote(s) for s in raw_path.split("/")[1:]]
        if raw_path == "/api/repos/create" and method == "POST":
            return self._create_repo(body)
        if segments[:1] == ["__lfs__"] and len(segments) >= 2:
            return self._lfs_object(method, segments[1], segments[2:], body)
        if segments[:1] == ["api"] and len(segments) >= 4 and segments[1] in REPO_TYPES:
            repo_type = REPO_TYPES[segments[1]]
            repo_id = f"{segments[2]}/{segments[3]}"
            return self._api(method, repo_type, repo_id, segments[4:], query, body, fault)
        repo_type = "model"
        if segments and segments[0] in ("datasets", "spaces"):
            repo_type, segments = REPO_TYPES[segments[0]], segments[1:]
        if len(segments) >= 2 and segments[1].endswith(".git") and segments[2:] == ["info", "lfs", "objects", "batch"]:
            return self._lfs_batch(repo_type, f"{segments[0]}/{segments[1].removesuffix('.git')}", body)
        if len(segments) >= 5 and segments[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(repo_type, f"{segments[0]}/{segments[1]}", segments[3], "/".join(segments[4:]), fault)
        raise HTTPError(404, f"no route for {method} {raw_path}")

    # ------------------------------------------------------------ auth and lookup

    def _token_role(self) -> str | None:
        header = self.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else None
        if self.fake.tokens is None:
            return "write"
        if token is None:
            return None
        role = self.fake.tokens.get(token)
        if role is None:
            raise HTTPError(401, "Invalid credentials in Authorization header")
        return role

    def _repo(self, repo_type: str, repo_id: str, *, write: bool = False) -> FakeRepo:
        role = self._token_role()
        repo = self.fake.repos.get((repo_type, repo_id))
        if write and role is None:
            raise HTTPError(401, "You must be authenticated to write")
        if repo is None or (repo.private and role is None):
            raise HTTPError(404, "Repository not found", "RepoNotFound")
        if write and role != "write":
            raise HTTPError(403, "You don't have the rights to write to this repository")
        return repo

    @staticmethod
    def _commit_at(repo: FakeRepo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HTTPError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    # ------------------------------------------------------------ endpoints

    def _create_repo(self, body: bytes) -> None:
        payload = json.loads(body)
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
        role = self._token_role()
        if role is None:
            raise HTTPError(401, "You must be authenticated to create a repo")
        if role != "write":
            raise HTTPError(403, "You don't have the rights to create a repo here")
        with self.fake.lock:
            url = f"{self.fake.endpoint}/{URL_PREFIX[repo_type]}{repo_id}"
            if (repo_type, repo_id) in self.fake.repos:
                raise HTTPError(409, "You already created this repo", extra={"url": url})
            private = payload.get("private") or payload.get("visibility") == "private"
            self.fake.create_repo(repo_id, repo_type, bool(private))
        self._json({"url": url, "name": repo_id})

    def _api(
        self,
        method: str,
        repo_type: str,
        repo_id: str,
        rest: list[str],
        query: dict[str, list[str]],
        body: bytes,
        fault: Fault | None,
    ) -> None:
        if method == "GET" and (not rest or rest[0] == "revision"):
            repo = self._repo(repo_type, repo_id)
            with self.fake.lock:
                commit = self._commit_at(repo, rest[1] if len(rest) > 1 else "main")
            siblings = [{"rfilename": path} for path in sorted(commit.files)]
            return self._json({"id": repo_id, "sha": commit.oid, "private": repo.private, "siblings": siblings,
                               "lastModified": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")})  # fmt: skip
        if method == "GET" and rest[:1] == ["tree"] and len(rest) >= 2:
            return self._tree(repo_type, repo_id, rest[1], "/".join(rest[2:]), query)
        if method == "POST" and rest[:1] == ["paths-info"] and len(rest) == 2:
            return self._paths_info(repo_type, repo_id, rest[1], body)
        if method == "POST" and rest[:1] == ["preupload"] and len(rest) == 2:
            return self._preupload(repo_type, repo_id, rest[1], body)
        if method == "POST" and rest[:1] == ["commit"] and len(rest) == 2:
            return self._commit(repo_type, repo_id, rest[1], body, fault)
        if method == "POST" and rest[:1] == ["branch"] and len(rest) == 2:
            return self._create_branch(repo_type, repo_id, rest[1], body)
        raise HTTPError(404, f"no API route for {method} {rest}")

    def _tree(self, repo_type: str, repo_id: str, revision: str, path: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_type, repo_id)
        recursive = query.get("recursive", ["False"])[0].lower() in ("1", "true")
        cursor = int(query.get("cursor", ["0"])[0])
        with self.fake.lock:
            commit = self._commit_at(repo, revision)
            files = dict(commit.files)
        prefix = f"{path}/" if path else ""
        under = {p: f for p, f in files.items() if p.startswith(prefix)}
        if path and not under:
            raise HTTPError(404, f"{path} does not exist at {revision}", "EntryNotFound",
                            {"X-Repo-Commit": commit.oid})  # fmt: skip
        entries: dict[str, dict[str, Any]] = {}
        for file_path, stored in under.items():
            parts = file_path[len(prefix) :].split("/")
            depth = len(parts) if recursive else 1
            for i in range(1, min(depth, len(parts) - 1) + 1):  # the folders on the way down
                folder = prefix + "/".join(parts[:i])
                entries[folder] = {"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0,
                                   "path": folder}  # fmt: skip
            if recursive or len(parts) == 1:
                entries[file_path] = stored.tree_entry(file_path)
        ordered = [entries[key] for key in sorted(entries)]
        page = ordered[cursor : cursor + self.fake.page_size]
        headers = {}
        if cursor + self.fake.page_size < len(ordered):
            params = urlencode({"recursive": recursive, "expand": query.get("expand", ["False"])[0],
                                "cursor": cursor + self.fake.page_size})  # fmt: skip
            quoted = "/" + quote(path, safe="") if path else ""
            url = f"{self.fake.endpoint}/api/{repo_type}s/{repo_id}/tree/{quote(revision, safe='')}{quoted}?{params}"
            headers["Link"] = f'<{url}>; rel="next"'
        self._json(page, headers=headers)

    def _paths_info(self, repo_type: str, repo_id: str, revision: str, body: bytes) -> None:
        repo = self._repo(repo_type, repo_id)
        paths = parse_qs(body.decode()).get("paths", [])
        with self.fake.lock:
            files = dict(self._commit_at(repo, revision).files)
        found = []
        for path in paths:
            if path in files:
                found.append(files[path].tree_entry(path))
            elif any(p.startswith(path + "/") for p in files):
                found.append({"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0,
                              "path": path})  # fmt: skip
        self._json(found)

    def _preupload(self, repo_type: str, repo_id: str, revision: str, body: bytes) -> None:
        repo = self._repo(repo_type, repo_id, write=True)
        with self.fake.lock:
            files = dict(self._commit_at(repo, revision).files)
        answer = []
        for item in json.loads(body)["files"]:
            path, size = item["path"], item["size"]
            existing = files.get(path)
            answer.append({"path": path, "uploadMode": "lfs" if self.fake._is_lfs(path, size) else "regular",
                           "shouldIgnore": False, "oid": existing.etag if existing else None})  # fmt: skip
        self._json({"files": answer})

    def _lfs_batch(self, repo_type: str, repo_id: str, body: bytes) -> None:
        self._repo(repo_type, repo_id, write=True)
        objects = []
        for obj in json.loads(body)["objects"]:
            oid, size = obj["oid"], obj["size"]
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if oid not in self.fake.blobs:
                base = f"{self.fake.endpoint}/__lfs__/{oid}"
                entry["actions"] = {"upload": {"href": base}, "verify": {"href": f"{base}/verify"}}
            objects.append(entry)
        self._json({"transfer": "basic", "objects": objects})

    def _lfs_object(self, method: str, oid: str, rest: list[str], body: bytes) -> None:
        if method == "PUT" and not rest:
            if hashlib.sha256(body).hexdigest() != oid:
                raise HTTPError(400, "uploaded content does not match its sha256")
            with self.fake.lock:
                self.fake.blobs[oid] = body
            return self._send(200)
        if method == "POST" and rest == ["verify"]:
            claimed = json.loads(body)
            blob = self.fake.blobs.get(oid)
            if blob is None or len(blob) != claimed.get("size"):
                raise HTTPError(404, "LFS object not found")
            return self._json({"success": True})
        raise HTTPError(404, "no such LFS route")

    def _commit(self, repo_type: str, repo_id: str, branch: str, body: bytes, fault: Fault | None) -> None:
        repo = self._repo(repo_type, repo_id, write=True)
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HTTPError(400, "commit payload must start with a header line")
        header = lines[0]["value"]
        adds: dict[str, StoredFile] = {}
        deletes: list[str] = []
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            path = value["path"]
            if not _valid_repo_path(path.rstrip("/")):
                raise HTTPError(400, f"invalid path {path!r}")
            if key == "file":
                adds[path] = StoredFile(base64.b64decode(value["content"]), False)
            elif key == "lfsFile":
                blob = self.fake.blobs.get(value["oid"])
                if blob is None:
                    raise HTTPError(422, f"LFS object {value['oid']} was never uploaded")
                adds[path] = StoredFile(blob, True)
            elif key in ("deletedFile", "deletedFolder"):
                deletes.append(path)
            else:
                raise HTTPError(400, f"unknown commit operation {key!r}")
        if not self.fake._committing.acquire(blocking=not self.fake.conflict_when_busy):
            with self.fake.lock:
                self.fake.conflicts += 1
            raise HTTPError(409, "Cannot commit: another conflicting operation is in progress")
        try:
            time.sleep(self.fake.commit_seconds)
            commit = self._apply(repo, branch, header, adds, deletes)
        finally:
            self.fake._committing.release()
        if fault is not None and fault.after_apply:
            raise HTTPError(
                fault.status, f"injected {fault.status} after the commit was applied", headers=fault.headers
            )
        url = f"{self.fake.endpoint}/{URL_PREFIX[repo_type]}{repo_id}/commit/{commit.oid}"
        self._json(
            {"success": True, "commitOid": commit.oid, "commitUrl": url, "hookOutput": "", "pullRequestUrl": None}
        )

    def _create_branch(self, repo_type: str, repo_id: str, branch: str, body: bytes) -> None:
        repo = self._repo(repo_type, repo_id, write=True)
        payload = json.loads(body) if body.strip() else {}
        if branch.startswith("refs/") or not _valid_repo_path(branch):  # refs/pr/N, refs/convert/...: the Hub's own
            raise HTTPError(400, f"Invalid reference for a branch: {branch}")
        with self.fake.lock:
            if branch in repo.branches:
                raise HTTPError(409, f"Reference refs/heads/{branch} already exists")
            start = self._commit_at(repo, payload.get("startingPoint") or "main")
            repo.branches[branch] = start.oid
        self._json({})  # the client reads nothing of a successful answer

    def _apply(
        self, repo: FakeRepo, branch: str, header: dict[str, Any], adds: dict[str, StoredFile], deletes: list[str]
    ) -> Commit:
        with self.fake.lock:
            if branch not in repo.branches:
                raise HTTPError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            parent = header.get("parentCommit")
            if parent is not None and parent != repo.branches[branch]:
                raise HTTPError(412, "A commit has happened since. Please refresh and try again.")
            return self.fake._commit(repo, branch, header.get("summary", ""), adds, deletes)

    def _resolve(self, repo_type: str, repo_id: str, revision: str, path: str, fault: Fault | None) -> None:
        repo = self._repo(repo_type, repo_id)
        with self.fake.lock:
            commit = self._commit_at(repo, revision)
            stored = commit.files.get(path)
        if stored is None:
            raise HTTPError(404, f"{path} does not exist", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        data = fault.body if fault is not None and fault.body is not None else stored.data
        headers = {"Content-Type": "application/octet-stream", "X-Repo-Commit": commit.oid,
                   "ETag": f'"{stored.etag}"', "Accept-Ranges": "bytes"}  # fmt: skip
        if stored.lfs:
            headers["X-Linked-Etag"] = f'"{stored.sha256}"'
            headers["X-Linked-Size"] = str(len(stored.data))
        status, start = 200, 0
        byte_range = self.headers.get("Range")
        if byte_range and byte_range.startswith("bytes=") and self.command == "GET":
            start = int(byte_range.removeprefix("bytes=").split("-")[0] or 0)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        if fault is not None and fault.truncate is not None and self.command == "GET":
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: fault.truncate])
            self.wfile.flush()
            self.close_connection = True  # the peer sees the connection drop mid-body
            return
        self._send(status, body, headers)


def point_client_at(
    monkeypatch: Any, hf_home: Path, *, endpoint: str | None = None, token: str | None = None, offline: bool = False
) -> None:
    """The real ``huggingface_hub`` client, pointed at ``endpoint``: no Xet, no telemetry, a cache of its own.

    The client reads some settings once, when it is first imported (perhaps by
    an earlier test, perhaps offline), so its constants are set as well as the
    environment.
    """
    for name in ("HF_ENDPOINT", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    if endpoint is not None:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    if token is not None:
        monkeypatch.setenv("HF_TOKEN", token)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants
    from huggingface_hub.utils.tqdm import disable_progress_bars

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    disable_progress_bars()


@contextmanager
def running(**kwargs: Any) -> Iterator[FakeHub]:
    with FakeHub(**kwargs) as hub:
        yield hub
