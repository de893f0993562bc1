"""``judgestore hub push`` and ``judgestore hub fetch``: share caches through the Hub or a shared folder.

Contract:

* Thin, like the other commands (:mod:`store.cli.common`): parse, call
  :func:`store.sync.push` / :func:`store.sync.fetch`, render a table (or
  ``--json``). Progress bars and notes go to stderr, and only on a terminal.
* A selection is required: ``--role/--task/--provider/--model-id/--descriptor``
  or ``--all``, so nobody pushes or downloads a whole team cache by accident.
* Exit status 1 when the report is not ok (a folder not pushed; a shard
  quarantined, rejected or not downloaded) or on a typed error (a rejected
  token, a missing repository); 2 on usage errors. Ctrl-C: 130, with one
  line on stderr saying what the remote confirmed before it (``push``) or
  what was imported (``fetch``) (:func:`~store.cli.common.interrupted`).
* :func:`register` adds the ``hub`` group to the app :mod:`store.cli` builds.
  :mod:`store.sync` is imported when a hub command runs, so that starting
  any other command does not pay for it.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.filesize import decimal
from rich.text import Text

from store.cli.common import (
    command_errors,
    emit_json,
    interrupted,
    location_cells,
    location_table,
    no_databases,
    progress_bars,
    quantity,
    stdout,
)
from store.cli.options import JsonOutput, grouped, selection, store_settings
from store.cli.tables import Column, Fit, FittedTable
from store.errors import InvalidInputError, RemoteError
from store.layout import Selector
from store.settings import Settings, from_environment, home_expanded
from store.store import Store

if TYPE_CHECKING:  # store.sync is imported when a hub command runs, not when any command starts
    from store.sync import FetchReport, PushReport, Remote
    from store.sync.workspace import SyncProblem

_REMOTE = "Remote"

RepoOption = Annotated[
    str | None,
    typer.Option(
        "--repo", metavar="ORG/NAME", rich_help_panel=_REMOTE,
        help="Hugging Face dataset repository (default: $JUDGESTORE_HUB_REPO).",
    ),
]  # fmt: skip
DirOption = Annotated[
    str | None,  # not a Path: typer makes an empty one ".", and the working directory would be the remote
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
AllOption = Annotated[bool, typer.Option("--all", help="Every descriptor folder.", rich_help_panel="Select databases")]


def register(app: typer.Typer) -> None:
    hub_app = typer.Typer(
        name="hub",
        help="Share caches: push rows to a Hugging Face dataset repo (or a shared folder) and fetch others' rows.",
        no_args_is_help=True,
    )
    hub_app.command("push")(command_errors(grouped(settings=store_settings, selector=selection)(push_command)))
    hub_app.command("fetch")(command_errors(grouped(settings=store_settings, selector=selection)(fetch_command)))
    app.add_typer(hub_app, name="hub")


# ---------------------------------------------------------------- helpers


def _required(selector: Selector, all_folders: bool) -> Selector:
    if selector.is_empty() and not all_folders:
        raise typer.BadParameter(
            "choose what to share: --role, --task, --provider, --model-id, --descriptor, or --all for everything",
            param_hint="selection",
        )
    if all_folders and not selector.is_empty():
        raise typer.BadParameter("--all selects everything; drop it or drop the other filters", param_hint="--all")
    return selector


def _remote(repo: str | None, directory: str | None, revision: str | None, token: str | None) -> "Remote":
    from store.sync import HubRemote, check_repo_id, check_token, open_remote

    if directory is not None and not directory.strip():  # as a path, the working directory
        raise typer.BadParameter("is empty: give the shared folder, or leave it out", param_hint="'--dir'")
    folder = None if directory is None else home_expanded(Path(directory))  # a shell leaves the ~ of --dir=~/x

    if repo is not None and directory is not None:  # usage errors (exit 2), before anything is read
        raise typer.BadParameter("name one remote: a Hub repository (--repo) or a folder (--dir), not both")
    if directory is not None and revision is not None:
        raise typer.BadParameter(
            f"a folder remote has no branches or tags: --revision {revision} applies to a Hub repository (--repo)",
            param_hint="--revision",
        )
    if repo is not None:
        try:  # a malformed id is a usage error; one the Hub does not know is the remote's (exit 1)
            check_repo_id(repo)
        except InvalidInputError as e:
            raise typer.BadParameter(str(e)) from e
    try:  # never shown: the client's own refusal quoted the whole token, retried as a network failure
        check_token(None if directory is not None else token)  # a folder remote takes none: an unset one is fine
    except InvalidInputError as e:
        raise typer.BadParameter(str(e), param_hint="--token") from e
    remote = open_remote(repo=repo, directory=folder, revision=revision, token=token)
    if isinstance(remote, HubRemote):
        from huggingface_hub.utils.tqdm import disable_progress_bars

        disable_progress_bars()  # ours are drawn below; the client's would interleave with them
    return remote


def _problems(title: str, groups: "dict[str, list[SyncProblem]]") -> None:
    """Problems on stdout (they are part of the result), one row each, whole paths and reasons."""
    rows = [(kind, p) for kind, problems in groups.items() for p in problems]
    if not rows:
        return
    table = FittedTable(title, [Column("Kind"), Column("Path", fit=Fit.PATH), Column("Reason", fit=Fit.WRAP)])
    for kind, problem in rows:
        reason = problem.reason + (f" (kept in {problem.saved_to})" if problem.saved_to else "")
        table.add_row(Text(kind, style="bold red"), Text(problem.path), Text(reason))
    stdout().print(table)


# ---------------------------------------------------------------- push


def push_command(
    settings: Settings,
    selector: Selector,
    json_output: JsonOutput = False,
    repo: RepoOption = None,
    directory: DirOption = None,
    revision: Annotated[
        str | None,
        typer.Option(
            "--revision",
            metavar="BRANCH",
            help="Branch to commit to, created from main's head if missing (default: main).",
        ),
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
) -> None:
    """Send the remote every selected row it does not have yet, as immutable shards.

    Rows fetched from the remote are never sent back, a push with nothing new
    makes no commit, and an interrupted push loses and duplicates nothing:
    run it again (Ctrl-C exits 130 with one line on stderr saying what the
    remote confirmed before it). Only the rows' shards and each folder's
    metadata.json are sent, never a database file.

    Examples:

        judgestore hub push --repo my-org/judge-cache --all --create-repo \\
            --private

        judgestore hub push --dir /shared/judgestore --role completions \\
            --task mt-bench
    """
    selector = _required(selector, all_folders)
    from store.sync import SyncSettings, push
    from store.sync.remote import check_outside_store

    sync_settings = from_environment(SyncSettings)
    remote = _remote(repo, directory, revision, token)
    if private and not create_repo:
        raise typer.BadParameter("--private only applies with --create-repo", param_hint="--private")
    with Store(settings, readonly=True) as store:
        check_outside_store(remote, store.root)  # before --create-repo makes the folder
        remote, created = _create_remote(remote, private=private, dry_run=dry_run) if create_repo else (remote, False)
        try:
            with progress_bars(json_output) as progress:
                report = push(store, remote, selector, dry_run=dry_run, target_bytes=sync_settings.shard_target_bytes,
                              progress=progress)  # fmt: skip
        except KeyboardInterrupt as e:
            _push_interrupted(getattr(e, "push_report", None), remote.url, json_output)
        report.created_repo = created
        if not report.databases_selected:  # a mistyped --task: say that nothing was selected, not "all there"
            no_databases(store, json_output, selector)
    if json_output:
        emit_json(report.as_dict())
    else:
        _render_push(report)
    if not report.ok:
        raise typer.Exit(1)


def _create_remote(remote: "Remote", *, private: bool, dry_run: bool) -> "tuple[Remote, bool]":
    """``--create-repo``: make the repository (or folder) unless it exists; the remote to push to, and whether it
    was made. A dry run makes nothing: it plans against the empty remote it would make.

    An existing public repository is refused with ``--private``: its visibility is left as it is, and nothing is
    pushed to it (the user asked for rows nobody else can read).
    """
    from store.sync import DirectoryRemote, HubRemote
    from store.sync.remote import NotYetCreated

    if isinstance(remote, DirectoryRemote):
        if remote.root.is_dir():
            return remote, False
        if dry_run:
            return NotYetCreated(remote), True
        try:
            remote.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # the remote's folder, not the store: the store's "read-only" advice would mislead
            raise RemoteError(remote.url, f"cannot create the shared folder ({e.strerror or e})") from e
        return remote, True
    if isinstance(remote, HubRemote):
        private_now = remote.private()
        if private_now is None:
            if dry_run:
                return NotYetCreated(remote), True
            remote.create_repo(private=private)
            return remote, True
        if private and not private_now:
            raise InvalidInputError(
                f"{remote.url}: the repository exists and is public; --private makes private only a repository "
                "--create-repo creates, so nothing was pushed: make it private on the Hub first, or push without "
                "--private"
            )
    return remote, False


def _push_interrupted(report: "PushReport | None", remote: str, json_output: bool) -> NoReturn:
    """Ctrl-C in ``hub push``: what the remote confirmed before it (committed there, recorded here), and that the
    same push run again resumes: it settles the batch the interrupt stopped in (committed or not) and sends the
    rest, losing and duplicating nothing (:mod:`store.sync.push`). Exit 130."""
    shards = 0 if report is None else report.shards_confirmed
    rows = 0 if report is None else report.rows_confirmed
    commits = [] if report is None else report.commits
    if shards:
        on_hub = f" in {quantity(len(commits), 'commit')}" if commits else ""
        done = f"{remote} confirmed {quantity(shards, 'shard')} ({quantity(rows, 'row')}){on_hub} before it"
    else:
        done = f"no shard was confirmed by {remote}"
    message = (
        f"interrupted; {done}; the rest was not sent, or is settled by the next push: run the same push again to "
        "resume (nothing is lost or sent twice)"
    )
    interrupted(message, json_output, remote=remote, shards_pushed=shards, rows_pushed=rows, commits=commits)


def _render_push(report: "PushReport") -> None:
    out = stdout()
    if report.created_repo:
        out.print(f"{'Would create' if report.dry_run else 'Created'} {report.remote}.")
    if (branch := report.created_branch) is not None:
        made = "Would create" if report.dry_run else "Created"
        line = f"{made} the branch {branch.name!r} of {report.remote}, from the default branch at {branch.base[:12]}."
        out.print(line)  # a branch name is the user's: "[x]" is not markup (stdout() reads none)
    if report.folders:
        title = f"{'Would push' if report.dry_run else 'Pushed'} to {report.remote}"
        table = location_table(title, ("Shards", "right"), ("Rows", "right"), ("Bytes", "right"))
        for folder in report.folders:
            table.add_row(
                *location_cells(folder.location), f"{folder.shards:,}", f"{folder.rows:,}", decimal(folder.bytes)
            )
        found = (
            f"; {quantity(report.recovered, 'shard')} of an interrupted push found there" if report.recovered else ""
        )
        present = report.already_present
        table.caption = (
            f"{quantity(report.shards, 'shard')}, {quantity(report.rows, 'row')}, {decimal(report.bytes)}; "
            + (f"{quantity(len(report.commits), 'commit')}; " if report.commits else "")  # a folder remote makes none
            + f"{quantity(report.unchanged, 'folder')} had nothing new"
            # counted among the shards above: the remote had them (another pusher's, or an interrupted push's)
            + (f"; {report.already_present:,} of the shards already there, not sent again" if present else "")
            + found
        )
        out.print(table)
    elif not report.problems and report.databases_selected:
        recovered = f" ({report.recovered} shards of an interrupted push found there)" if report.recovered else ""
        out.print(
            f"Nothing to push to {report.remote}: every selected row is recorded as on it (pushed or fetched), "
            f"or listed there{recovered}."
        )
    _problems("Not pushed", {"not pushed": report.problems})


# ---------------------------------------------------------------- fetch


def fetch_command(
    settings: Settings,
    selector: Selector,
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
) -> None:
    """Import the selected shards of the remote that this store has not imported yet.

    Every shard is validated completely before any of it is imported (size,
    gzip, SHA-256 against its name, header against its folder, every row and
    its input hash); one that fails is kept under
    .judgestore-sync/quarantine and reported, and nothing of it is imported.
    Rows already here are kept as they are. Exits 1 if anything was rejected.
    Ctrl-C exits 130 with one line on stderr saying what was imported before
    it: it is kept, and the same fetch run again imports the rest.

    Examples:

        judgestore hub fetch --repo my-org/judge-cache --task mt-bench

        judgestore hub fetch --dir /shared/judgestore --all --dry-run
    """
    selector = _required(selector, all_folders)
    from store.sync import SyncSettings, fetch

    sync_settings = from_environment(SyncSettings)
    remote = _remote(repo, directory, revision, token)
    report = None
    try:
        with Store(settings) as store, progress_bars(json_output) as progress:
            report = fetch(store, remote, selector, dry_run=dry_run, max_shard_bytes=sync_settings.max_shard_bytes,
                           progress=progress)  # fmt: skip
    except KeyboardInterrupt as e:  # the fetch's report so far; its whole one when it came as the store closed
        _fetch_interrupted(getattr(e, "fetch_report", report), remote.url, json_output)
    if json_output:
        emit_json(report.as_dict())
    else:
        _render_fetch(report)
    if not report.ok:
        raise typer.Exit(1)


def _fetch_interrupted(report: "FetchReport | None", remote: str, json_output: bool) -> NoReturn:
    """Ctrl-C in ``hub fetch``: what was imported before it (each group of shards is one transaction, counted once
    it committed), and that the same fetch run again imports the rest, skipping the shards recorded as imported (a
    group the interrupt caught before it was recorded is imported again, writing nothing). Exit 130."""
    if report is not None and report.dry_run:  # its folders are what it would download
        interrupted("interrupted; a dry run imports nothing", json_output, remote=remote, shards_imported=0,
                    rows_imported=0)  # fmt: skip
    shards = 0 if report is None else report.shards
    rows = 0 if report is None else sum(folder.rows_read for folder in report.folders)
    if shards:
        done = f"imported {quantity(shards, 'shard')} ({quantity(rows, 'row')}) from {remote} before it, kept"
    else:
        done = f"imported no shard from {remote}"
    message = f"interrupted; {done}: run the same fetch again to import the rest"
    interrupted(message, json_output, remote=remote, shards_imported=shards, rows_imported=rows)


def _render_fetch(report: "FetchReport") -> None:
    out = stdout()
    at = f" at {report.revision[:12]}" if report.revision else ""
    if report.folders:
        if report.dry_run:
            table = location_table(f"Would download from {report.remote}{at}", ("Shards", "right"), ("Bytes", "right"))
            for folder in report.folders:
                table.add_row(*location_cells(folder.location), f"{folder.shards:,}", decimal(folder.bytes))
        else:
            table = location_table(
                f"Fetched from {report.remote}{at}",
                ("Shards", "right"),
                ("Rows new", "right"),
                ("Rows read", "right"),
                ("Bytes", "right"),
            )
            for folder in report.folders:
                table.add_row(*location_cells(folder.location), f"{folder.shards:,}", f"{folder.rows_inserted:,}",
                              f"{folder.rows_read:,}", decimal(folder.bytes))  # fmt: skip
        rows = "" if report.dry_run else f"{quantity(report.rows, 'new row')}, "  # a dry run cannot count them
        conflicts = (
            f"; {quantity(report.conflicts, 'row')} not imported: another answer is stored under its key here "
            "(kept)" if report.conflicts else ""
        )  # fmt: skip
        table.caption = (
            f"{quantity(report.shards, 'shard')}, {rows}{decimal(report.bytes)}; "
            f"{quantity(report.skipped, 'shard')} already here; {len(report.quarantined)} quarantined{conflicts}"
        )
        out.print(table)
    elif report.failed or report.quarantined:
        # Shards were listed but none was imported (a local database at another schema revision, a damaged
        # shard...): that is not "nothing new"; the "Not imported" table below says why, path by path.
        verb = "none can be imported" if report.dry_run else "none was imported"
        out.print(
            f"Found new shards at {report.remote}{at} but {verb}: {len(report.failed):,} failed, "
            f"{len(report.quarantined):,} quarantined ({quantity(report.skipped, 'shard')} already here)."
        )
    elif not report.folders_matched:  # a mistyped --task: say that the remote has no such folder, not "nothing new"
        out.print(f"No folder at {report.remote}{at} matches the selection: nothing to fetch.")
    else:
        out.print(f"Nothing new to fetch from {report.remote}{at} ({quantity(report.skipped, 'shard')} already here).")
    _problems(
        "Not imported",
        {"quarantined": report.quarantined, "failed": report.failed, "rejected path": report.rejected_paths},
    )
