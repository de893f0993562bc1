"""``judgestore hub push`` and ``judgestore hub fetch``: share caches through the Hub or a shared folder.

Contract:

* Thin, like :mod:`store.cli`: parse, call :func:`store.sync.push` /
  :func:`store.sync.fetch`, render a table (or ``--json``). Progress bars and
  notes go to stderr, and only on a terminal.
* A selection is required: ``--role/--task/--provider/--model/--descriptor``
  or ``--all``, so nobody pushes or downloads a whole team cache by accident.
* Exit status 1 when the report is not ok (a folder not pushed; a shard
  quarantined, rejected or not downloaded) or on a typed error (a rejected
  token, a missing repository); 2 on usage errors.
* ``hub_app`` is defined before :mod:`store.cli` is imported, so that
  ``store.cli`` may mount it (``app.add_typer(hub_app, name="hub")`` at its end)
  whichever of the two modules is imported first.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

hub_app = typer.Typer(
    name="hub",
    help="Share caches: push rows to a Hugging Face dataset repo (or a shared folder) and fetch others' rows.",
    no_args_is_help=True,
)

import orjson  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.filesize import decimal  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

from store.cli import JsonOutput, RoleChoice, StoreRoot, command_errors, settings_and_root  # noqa: E402
from store.inspect import Selector  # noqa: E402
from store.layout import Location, check_role  # noqa: E402
from store.store import Store  # noqa: E402
from store.sync.fetch import FetchReport, fetch  # noqa: E402
from store.sync.hub import HubRemote  # noqa: E402
from store.sync.push import PushReport, push  # noqa: E402
from store.sync.remote import DirectoryRemote, Remote  # noqa: E402
from store.sync.settings import SyncSettings, open_remote  # noqa: E402
from store.sync.workspace import Problem  # noqa: E402
from store.sync.workspace import Progress as ProgressCallback  # noqa: E402

_REMOTE = "Remote"
_SELECT = "Select descriptor folders"

RepoOption = Annotated[
    str | None,
    typer.Option(
        "--repo", metavar="ORG/NAME", rich_help_panel=_REMOTE,
        help="Hugging Face dataset repository (default: $JUDGESTORE_HUB_REPO).",
    ),
]  # fmt: skip
DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir", metavar="PATH", rich_help_panel=_REMOTE,
        help="A shared folder as the remote instead of the Hub (default: $JUDGESTORE_SYNC_DIR).",
    ),
]  # fmt: skip
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token", metavar="TOKEN", rich_help_panel=_REMOTE,
        help="Hub token (default: $HF_TOKEN, else the token saved by `hf auth login`).",
    ),
]  # fmt: skip
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Only show what would be sent or downloaded.")]
AllOption = Annotated[bool, typer.Option("--all", help="Every descriptor folder.", rich_help_panel=_SELECT)]
RoleOption = Annotated[RoleChoice | None, typer.Option("--role", rich_help_panel=_SELECT)]
TaskOption = Annotated[str | None, typer.Option("--task", rich_help_panel=_SELECT)]
ProviderOption = Annotated[str | None, typer.Option("--provider", rich_help_panel=_SELECT)]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model", "--model-id", help="Descriptors of this model (e.g. Qwen/Qwen3-8B).", rich_help_panel=_SELECT
    ),
]
DescriptorOption = Annotated[
    str | None,
    typer.Option("--descriptor", metavar="HASH", help="Descriptor hash or a prefix of it.", rich_help_panel=_SELECT),
]


# ---------------------------------------------------------------- helpers


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _selection(
    all_folders: bool,
    role: RoleChoice | None,
    task: str | None,
    provider: str | None,
    model: str | None,
    descriptor: str | None,
) -> Selector:
    selector = Selector(
        role=None if role is None else check_role(role.value),
        task=task,
        provider=provider,
        model=model,
        descriptor=descriptor,
    )
    if selector.is_empty() and not all_folders:
        raise typer.BadParameter(
            "choose what to share: --role, --task, --provider, --model, --descriptor, or --all for everything",
            param_hint="selection",
        )
    if all_folders and not selector.is_empty():
        raise typer.BadParameter("--all selects everything; drop it or drop the other filters", param_hint="--all")
    return selector


def _remote(repo: str | None, directory: Path | None, revision: str | None, token: str | None) -> Remote:
    remote = open_remote(repo=repo, directory=directory, revision=revision, token=token)
    if isinstance(remote, HubRemote):
        from huggingface_hub.utils.tqdm import disable_progress_bars

        disable_progress_bars()  # ours are drawn below; the client's would interleave with them
    return remote


@contextmanager
def _bars(json_output: bool) -> Iterator[ProgressCallback]:
    """A progress callback drawing one transient bar per phase on stderr (a terminal only, never with --json)."""
    console = _stderr()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=json_output or not console.is_terminal) as bars:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bars.add_task(phase, total=total)
            bars.update(tasks[phase], completed=done, total=total)

        yield update


def _emit_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def _folder_table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("Role", "Task", "Provider", "Model"):
        table.add_column(name, overflow="fold")
    table.add_column("Descriptor", no_wrap=True, min_width=16)
    for name in columns:
        table.add_column(name, justify="right", no_wrap=True)
    return table


def _cells(location: Location) -> tuple[Text, ...]:
    return (Text(location.role), Text(location.task), Text(location.provider), Text(location.model),
            Text(location.descriptor_hash16))  # fmt: skip


def _problems(title: str, groups: dict[str, list[Problem]]) -> None:
    """Problems on stdout (they are part of the result), one row each, whole paths and reasons."""
    rows = [(kind, p) for kind, problems in groups.items() for p in problems]
    if not rows:
        return
    table = Table(title=title, title_justify="left")
    table.add_column("Kind", no_wrap=True)
    table.add_column("Path", overflow="fold")
    table.add_column("Reason", overflow="fold")
    for kind, problem in rows:
        reason = problem.reason + (f" (kept in {problem.saved_to})" if problem.saved_to else "")
        table.add_row(Text(kind, style="bold red"), Text(problem.path), Text(reason))
    Console(highlight=False).print(table)


# ---------------------------------------------------------------- push


@hub_app.command("push")
@command_errors
def push_command(
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
    repo: RepoOption = None,
    directory: DirOption = None,
    revision: Annotated[
        str | None, typer.Option("--revision", metavar="BRANCH", help="Branch to commit to (default: main).")
    ] = None,
    token: TokenOption = None,
    create_repo: Annotated[
        bool, typer.Option("--create-repo", help="Create the dataset repository (or folder) if it does not exist.")
    ] = False,
    private: Annotated[
        bool, typer.Option("--private", help="With --create-repo: make the repository private.")
    ] = False,
    dry_run: DryRunOption = False,
    all_folders: AllOption = False,
    role: RoleOption = None,
    task: TaskOption = None,
    provider: ProviderOption = None,
    model: ModelOption = None,
    descriptor: DescriptorOption = None,
) -> None:
    """Send the remote every selected row it does not have yet, as immutable shards.

    Rows fetched from the remote are never sent back, a push with nothing new
    makes no commit, and an interrupted push loses and duplicates nothing:
    run it again. Only the rows' shards and each folder's metadata.json are
    sent, never a database file.

    Examples:

        judgestore hub push --repo my-org/judge-cache --all --create-repo --private

        judgestore hub push --dir /shared/judgestore --role completions --task mt-bench
    """
    settings, root = settings_and_root(store_root)
    selector = _selection(all_folders, role, task, provider, model, descriptor)
    sync_settings = SyncSettings()
    remote = _remote(repo, directory, revision, token)
    if private and not create_repo:
        raise typer.BadParameter("--private only applies with --create-repo", param_hint="--private")
    if create_repo and not dry_run:
        if isinstance(remote, HubRemote):
            remote.create_repo(private=private)
        elif isinstance(remote, DirectoryRemote):
            remote.root.mkdir(parents=True, exist_ok=True)
    with Store(settings, root=root, readonly=True) as store, _bars(json_output) as progress:
        report = push(store, remote, selector, dry_run=dry_run, target_bytes=sync_settings.shard_target_bytes,
                      progress=progress)  # fmt: skip
    if json_output:
        _emit_json(report.as_dict())
    else:
        _render_push(report)
    if not report.ok:
        raise typer.Exit(1)


def _render_push(report: PushReport) -> None:
    out = Console(highlight=False)
    if report.folders:
        title = f"{'Would push' if report.dry_run else 'Pushed'} to {report.remote}"
        table = _folder_table(title, "Shards", "Rows", "Bytes")
        for folder in report.folders:
            table.add_row(*_cells(folder.location), f"{folder.shards:,}", f"{folder.rows:,}", decimal(folder.bytes))
        table.caption = (
            f"{report.shards:,} shards, {report.rows:,} rows, {decimal(report.bytes)}; "
            f"{len(report.commits)} commits; {report.unchanged} folders had nothing new"
            + (f"; {report.already_present} shards were already there" if report.already_present else "")
            + (f"; {report.recovered} shards of an interrupted push confirmed" if report.recovered else "")
        )
        out.print(table)
    elif not report.problems:
        recovered = f" ({report.recovered} shards of an interrupted push confirmed)" if report.recovered else ""
        out.print(f"Nothing to push to {report.remote}: it has every selected row{recovered}.")
    _problems("Not pushed", {"not pushed": report.problems})


# ---------------------------------------------------------------- fetch


@hub_app.command("fetch")
@command_errors
def fetch_command(
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
    repo: RepoOption = None,
    directory: DirOption = None,
    revision: Annotated[
        str | None,
        typer.Option("--revision", metavar="REV", help="Branch, tag or commit to fetch (default: main)."),
    ] = None,
    token: TokenOption = None,
    dry_run: DryRunOption = False,
    all_folders: AllOption = False,
    role: RoleOption = None,
    task: TaskOption = None,
    provider: ProviderOption = None,
    model: ModelOption = None,
    descriptor: DescriptorOption = None,
) -> None:
    """Import the selected shards of the remote that this store has not imported yet.

    Every shard is validated completely before any of it is imported (size,
    gzip, SHA-256 against its name, header against its folder, every row and
    its input hash); one that fails is kept under
    .judgestore-sync/quarantine and reported, and nothing of it is imported.
    Rows already here are kept as they are. Exits 1 if anything was rejected.

    Examples:

        judgestore hub fetch --repo my-org/judge-cache --task mt-bench

        judgestore hub fetch --dir /shared/judgestore --all --dry-run
    """
    settings, root = settings_and_root(store_root)
    selector = _selection(all_folders, role, task, provider, model, descriptor)
    sync_settings = SyncSettings()
    remote = _remote(repo, directory, revision, token)
    with Store(settings, root=root) as store, _bars(json_output) as progress:
        report = fetch(store, remote, selector, dry_run=dry_run, max_shard_bytes=sync_settings.max_shard_bytes,
                       progress=progress)  # fmt: skip
    if json_output:
        _emit_json(report.as_dict())
    else:
        _render_fetch(report)
    if not report.ok:
        raise typer.Exit(1)


def _render_fetch(report: FetchReport) -> None:
    out = Console(highlight=False)
    at = f" at {report.revision[:12]}" if report.revision else ""
    if report.folders:
        if report.dry_run:
            table = _folder_table(f"Would download from {report.remote}{at}", "Shards", "Bytes")
            for folder in report.folders:
                table.add_row(*_cells(folder.location), f"{folder.shards:,}", decimal(folder.bytes))
        else:
            table = _folder_table(f"Fetched from {report.remote}{at}", "Shards", "Rows new", "Rows read", "Bytes")
            for folder in report.folders:
                table.add_row(*_cells(folder.location), f"{folder.shards:,}", f"{folder.rows_inserted:,}",
                              f"{folder.rows_read:,}", decimal(folder.bytes))  # fmt: skip
        table.caption = (
            f"{report.shards:,} shards, {report.rows:,} new rows, {decimal(report.bytes)}; "
            f"{report.skipped:,} shards already here; {len(report.quarantined)} quarantined"
        )
        out.print(table)
    else:
        out.print(f"Nothing new to fetch from {report.remote}{at} ({report.skipped:,} shards already here).")
    _problems(
        "Not imported",
        {"quarantined": report.quarantined, "failed": report.failed, "rejected path": report.rejected_paths},
    )
