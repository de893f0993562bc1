"""The options ``judgestore`` commands share, each declared once as a group that builds one value.

Contract:

* One name per option meaning, across all commands: ``--store-root`` or
  ``--store-url`` (:func:`store_settings`) and ``--json`` everywhere; databases are chosen with ``--role --task
  --provider --model-id --descriptor`` (:func:`selection`); rows are filtered
  with ``--benchmark --instruction-id --model --model-a --model-b --judge
  --orientation --pair --pointwise/--pairwise --run-id --created-by --since
  --until --input-hash --finish-reason --empty/--non-empty --error/--no-error
  --adopted-from --adopted/--not-adopted`` (:func:`row_filter`); ``--model`` names the model of
  the rows (a row filter) in the data commands and the model to run in
  ``generate``/``judge``.
* An option that says what a command acts on (a database selector, a row
  filter, a "What to ..." option: adopt's source, prune's rules) takes one
  value once (:class:`OnceCommand`, the base of every command's class):
  ``--instruction-id 0 --instruction-id 1`` (or ``--empty --non-empty``) is
  a usage error, where click kept the last and a ``delete`` deleted the rows
  of one of them. Other options keep click's rule, the last one given wins,
  so that a script may override what it was given.
* :func:`grouped` lets a command take a whole group of options as one value
  (a :class:`~store.layout.Selector`, a :class:`~store.tables.filters.RowFilter`, the
  :class:`~store.settings.Settings` naming the store): the group is declared
  once, by the function that builds the value.
"""

import enum
import functools
import inspect
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand, TyperOption

from store.backends import check_settings_url
from store.errors import FilterValueError, InvalidInputError, StoreMissingError
from store.layout import Selector
from store.settings import Settings, from_environment, home_expanded, no_url
from store.tables.filters import ERROR_FINISH_REASONS, RowFilter, parse_timestamp

R = TypeVar("R")

STORE_PANEL = "Store"
SELECT_PANEL = "Select databases"
FILTER_PANEL = "Filter rows"


class OnceCommand(TyperCommand):
    """A command whose options that say what it acts on take one value once (see the module docstring): those
    under the panels :data:`SELECT_PANEL`, :data:`FILTER_PANEL` and any "What to ..." (adopt's source, prune's
    rules). A repeatable one (``--input-hash``) may repeat; a flag may, but not with its opposite."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            try:
                values, positional, order = self.make_parser(ctx).parse_args(args=list(args))  # each option as given
            except typer.TyperException:  # a missing value, an unknown option: click's own parse says so
                return super().parse_args(ctx, args)
            if not _asks_help(ctx, order):  # --help still helps (`--model --help` names a model: checked)
                # a token that is an option's value or an argument is not an option given (`--model --non-empty`)
                tokens = [part for token in args for part in (token.split("=", 1) if token[:2] == "--" else [token])]
                given = Counter(tokens) - Counter(_taken(values, order)) - Counter(map(str, positional))
                for param, times in Counter(order).items():
                    if times > 1 and isinstance(param, TyperOption) and not param.multiple and _says_what(param):
                        _refuse_twice(ctx, param, times, given)
        return super().parse_args(ctx, args)


def _asks_help(ctx: Any, order: list[Any]) -> bool:
    return any(set(getattr(param, "opts", ())) & set(ctx.help_option_names) for param in order)


def _taken(values: dict[str, Any], order: list[Any]) -> Iterator[str]:
    """The tokens the options of ``order`` took as their values."""
    for param in set(order):
        if isinstance(param, TyperOption) and not param.is_flag and param.name in values:
            value = values[param.name]
            for item in value if isinstance(value, list | tuple) else [value]:
                yield from map(str, item) if isinstance(item, list | tuple) else [str(item)]


def _says_what(param: TyperOption) -> bool:
    panel = str(getattr(param, "rich_help_panel", None) or "")
    return panel in (SELECT_PANEL, FILTER_PANEL) or panel.startswith("What to ")


def _refuse_twice(ctx: Any, param: TyperOption, times: int, given: Counter[str]) -> None:
    if not param.is_flag:
        raise typer.BadParameter(f"given {times} times; it takes one value: run the command once for each", ctx, param)
    both = [names for names in (param.opts, param.secondary_opts) if any(given[name] for name in names)]
    if len(both) == 2:  # --empty --non-empty: the last won (was); the same flag twice says it once more
        shown = " / ".join(f"'{names[0]}'" for names in both)
        raise typer.BadParameter("give one of them, not both", ctx, param_hint=shown)


MOST_ROWS = 2**63 - 1  # the largest count a SQL LIMIT takes (a 64-bit integer, on SQLite and PostgreSQL)


class RoleChoice(enum.StrEnum):
    completions = "completions"
    judgements = "judgements"


class OrientationChoice(enum.StrEnum):
    direct = "direct"
    reversed = "reversed"


def environment_settings() -> Settings:
    """Settings from the environment; a bad ``JUDGESTORE_*`` value is an :class:`InvalidInputError`."""
    return from_environment(Settings)


def named_store_settings(*, store_root: Path | None = None, store_url: str | None = None) -> Settings:
    """Settings from the environment for a store the command names itself: the environment's store
    (``JUDGESTORE_STORE_ROOT``, ``JUDGESTORE_STORE_URL``) is not read, so a bad one does not stop it (a URL held by
    ``JUDGESTORE_STORE_ROOT`` did, was); the other settings (timeouts, pool sizes) still come from there."""
    folder = store_root if store_root is not None else Settings.model_fields["store_root"].default
    return from_environment(Settings, store_root=folder, store_url=store_url)


def store_server(value: str | None, option: str) -> str | None:
    """A store URL given on the command line, checked before the command's work: an empty one (``--store-url
    "$UNSET"``) is refused (taken for no URL, it silently meant the folder store, the environment's URL dropped
    too), as is one that is no PostgreSQL URL: usage errors (exit 2), as every value wrong whatever the machine
    holds (they exited 1, was)."""
    if value is None:
        return None
    if not value.strip():
        raise typer.BadParameter(
            "is empty: give the server's URL (postgresql+psycopg://...), or leave it out", param_hint=f"'{option}'"
        )
    from store.backends.postgres.connections import checked_store_url

    try:
        checked_store_url(value)
    except InvalidInputError as e:
        raise typer.BadParameter(str(e), param_hint=f"'{option}'") from e
    return value


def store_folder(value: str | None, option: str) -> Path | None:
    """A store folder given on the command line; an empty one (``--store-root "$UNSET"``) is refused (as a path it
    would be the working directory, where databases would be scattered), as is a URL: usage errors (exit 2). A
    file there is what the machine holds: the store's error (exit 1)."""
    if value is None:
        return None
    if not value.strip():
        said = "is empty: give the store's folder ('.' for this one), or leave it out"
        raise typer.BadParameter(said, param_hint=f"'{option}'")
    try:
        no_url(value, "it")
    except InvalidInputError as e:
        said = str(e)
        if option != "--store-root":  # naming this command's URL option: copy's --from-url, --to-url
            said = said.replace("--store-url or JUDGESTORE_STORE_URL", option.replace("-root", "-url"))
        raise typer.BadParameter(said, param_hint=f"'{option}'") from e
    path = home_expanded(Path(value))  # a shell leaves the ~ of --store-root=~/x as it is
    if path.exists() and not path.is_dir():  # as the storage says, with the option this command calls it
        raise StoreMissingError(path, f"it is a file, not a folder: there is no store here; check {option}")
    return path


def store_settings(
    store_root: Annotated[
        str | None,
        typer.Option(
            "--store-root",
            metavar="PATH",
            show_default=False,
            help="Store root folder (default: $JUDGESTORE_STORE_URL's server if set, else $JUDGESTORE_STORE_ROOT, "
            "else ./judgestore-data).",
            rich_help_panel=STORE_PANEL,
        ),
    ] = None,
    store_url: Annotated[
        str | None,
        typer.Option(
            "--store-url",
            metavar="URL",
            show_default=False,
            help="A PostgreSQL store, e.g. postgresql+psycopg://user@host/db (default: $JUDGESTORE_STORE_URL).",
            rich_help_panel=STORE_PANEL,
        ),
    ] = None,
) -> Settings:
    """The ``--store-root`` / ``--store-url`` group: the settings, naming the store a command works on.

    An explicit option wins over the environment: ``--store-root`` means that
    folder even when ``JUDGESTORE_STORE_URL`` is set. Without either, the
    settings decide (``JUDGESTORE_STORE_URL``, else ``JUDGESTORE_STORE_ROOT``,
    else ``./judgestore-data``). ``Store(settings)`` opens it.
    """
    if store_root is not None and store_url is not None:
        raise typer.BadParameter("name two stores; give one", param_hint="'--store-root' / '--store-url'")
    if store_root is not None:
        return named_store_settings(store_root=store_folder(store_root, "--store-root"))
    if store_url is not None:
        return named_store_settings(store_url=store_server(store_url, "--store-url"))
    settings = environment_settings()
    check_settings_url(settings)  # before the command's work, as a bad option is
    return settings


# ---------------------------------------------------------------- option groups


def grouped(**builders: Callable[..., Any]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Replace each named parameter of a command by the options of its builder, and pass the built value.

    ``@grouped(selector=selection)`` gives the command every option
    :func:`selection` declares; the command receives ``selector=selection(...)``.
    """

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        signature = inspect.signature(command, eval_str=True)
        group_params = {
            name: list(inspect.signature(b, eval_str=True).parameters.values()) for name, b in builders.items()
        }
        params = [p for p in signature.parameters.values() if p.name not in builders]
        params += [p for group in group_params.values() for p in group]
        params.sort(key=lambda p: p.default is not inspect.Parameter.empty)  # required ones first, order kept

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> R:
            for name, builder in builders.items():
                kwargs[name] = builder(**{p.name: kwargs.pop(p.name) for p in group_params[name]})
            return command(*args, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


JsonOutput = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout; errors as JSON on stderr.")]


def selection(
    role: Annotated[
        RoleChoice | None, typer.Option("--role", help="Only this role.", rich_help_panel=SELECT_PANEL)
    ] = None,
    task: Annotated[str | None, typer.Option("--task", help="Only this task.", rich_help_panel=SELECT_PANEL)] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="Only this provider (e.g. vllm).", rich_help_panel=SELECT_PANEL)
    ] = None,
    model_id: Annotated[
        str | None,
        typer.Option(
            "--model-id",
            help="Only descriptors of this model (a Hub id, or a local folder's name).",
            rich_help_panel=SELECT_PANEL,
        ),
    ] = None,
    descriptor: Annotated[
        str | None,
        typer.Option(
            "--descriptor", metavar="HASH", help="Descriptor hash or a prefix of it.", rich_help_panel=SELECT_PANEL
        ),
    ] = None,
) -> Selector:
    """The databases chosen by ``--role --task --provider --model-id --descriptor``; one that can name none (an
    empty name, an upper-case descriptor prefix) is a usage error (exit 2) naming its option."""
    given = {"--task": task, "--provider": provider, "--model-id": model_id, "--descriptor": descriptor}
    for option, value in given.items():
        if value is not None and not value.strip():  # would pick nothing, and "no databases" blamed the store
            raise typer.BadParameter(f"{option} is empty: give a name (`judgestore ls` lists them)", param_hint=option)
    try:
        return Selector(
            role=None if role is None else role.value,  # type: ignore[arg-type]
            task=task,
            provider=provider,
            model=model_id,
            descriptor=descriptor,
        )
    except InvalidInputError as e:
        raise typer.BadParameter(str(e), param_hint="--descriptor") from e


def _timestamp(value: str) -> datetime:
    try:
        return parse_timestamp(value)
    except InvalidInputError as e:
        raise typer.BadParameter(str(e)) from e


def share(value: str) -> float:
    """An option's share from 0 to 1 (``--fail-under``, ``--min-exact``); NaN and infinities are refused, with
    what to write (a range check alone lets NaN through or names the wrong bound)."""
    number = _number(value)
    if not 0.0 <= number <= 1.0:
        raise typer.BadParameter(f"{value} is not a share from 0 to 1 (e.g. 0.95)")
    return number


def non_negative(value: str) -> float:
    """An option's number of 0 or more (``--max-logprob-delta``); NaN is refused."""
    number = _number(value)
    if not number >= 0.0:
        raise typer.BadParameter(f"{value} is not a number of 0 or more (e.g. 0.5)")
    return number


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a number") from None


def _filter(name: str, help_text: str | None = None, **kwargs: Any) -> Any:
    return typer.Option(name, help=help_text, rich_help_panel=FILTER_PANEL, **kwargs)


def row_filter(
    benchmark: Annotated[str | None, _filter("--benchmark", "Rows of this benchmark (the input file's field).")] = None,
    instruction_id: Annotated[
        str | None, _filter("--instruction-id", "Rows of this instruction (a prompt's id within its benchmark).")
    ] = None,
    model: Annotated[
        str | None, _filter("--model", "Completions of this model; judgements where it is model_a or model_b.")
    ] = None,
    model_a: Annotated[str | None, _filter("--model-a", "(judgements) The model whose answer is shown first.")] = None,
    model_b: Annotated[str | None, _filter("--model-b", "(judgements) The model whose answer is shown second.")] = None,
    judge: Annotated[str | None, _filter("--judge", "(judgements) Verdicts of this judge model.")] = None,
    orientation: Annotated[
        OrientationChoice | None,
        _filter("--orientation", "(judgements) direct or reversed, relative to the source pair."),
    ] = None,
    pair: Annotated[
        list[str] | None,
        _filter("--pair", "(judgements) Give twice: every judgement of the pair, both orientations.", metavar="MODEL"),
    ] = None,
    pointwise: Annotated[
        bool | None,
        _filter(
            "--pointwise/--pairwise", "Only pointwise (no model_b) or only pairwise judgements.", show_default=False
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        _filter("--run-id", "Rows a run wrote (JUDGESTORE_RUN_ID; by default the SLURM job, else one id per process)."),
    ] = None,
    created_by: Annotated[
        str | None,
        _filter("--created-by", "Rows written by this author (JUDGESTORE_CREATED_BY; by default the user name)."),
    ] = None,
    since: Annotated[
        datetime | None,
        _filter("--since", "created_at >= TIME (ISO-8601; no offset means UTC).", parser=_timestamp, metavar="TIME"),
    ] = None,
    until: Annotated[
        datetime | None,
        _filter("--until", "created_at < TIME (ISO-8601; no offset means UTC).", parser=_timestamp, metavar="TIME"),
    ] = None,
    input_hash: Annotated[list[str] | None, _filter("--input-hash", "This row (repeatable).", metavar="HASH")] = None,
    finish_reason: Annotated[
        list[str] | None,
        _filter(
            "--finish-reason",
            "Rows that finished for this reason (repeatable): length (truncated at max_tokens), stop, ...",
            metavar="REASON",
        ),
    ] = None,
    empty: Annotated[
        bool | None,
        _filter(
            "--empty/--non-empty", "Only empty (or whitespace) completions, or only the others.", show_default=False
        ),
    ] = None,
    error: Annotated[
        bool | None,
        _filter(
            "--error/--no-error",
            f"Only error rows (finish reason {', '.join(ERROR_FINISH_REASONS)}), or only the others.",
            show_default=False,
        ),
    ] = None,
    adopted_from: Annotated[
        str | None,
        _filter(
            "--adopted-from",
            "Rows `judgestore adopt` copied from this descriptor (its hash or a prefix).",
            metavar="HASH",
        ),
    ] = None,
    adopted: Annotated[
        bool | None,
        _filter(
            "--adopted/--not-adopted",
            "Only rows adopted from older descriptors, or only the others.",
            show_default=False,
        ),
    ] = None,
) -> RowFilter:
    """The rows chosen by the row filter options (see the module docstring)."""
    if pair is not None and len(pair) != 2:
        raise typer.BadParameter(f"give --pair exactly twice (the two models), got {len(pair)}", param_hint="--pair")
    try:
        return RowFilter(
            benchmark=benchmark,
            instruction_id=instruction_id,
            model=model,
            model_a=model_a,
            model_b=model_b,
            judge=judge,
            orientation=None if orientation is None else orientation.value,  # type: ignore[arg-type]
            pair=None if pair is None else (pair[0], pair[1]),
            pointwise=pointwise,
            run_id=run_id,
            created_by=created_by,
            created_after=since,
            created_before=until,
            input_hashes=tuple(key.lower() for key in input_hash) if input_hash else None,  # hex digits in any case
            finish_reasons=tuple(finish_reason) if finish_reason else None,
            empty=empty,
            error=error,
            adopted_from=adopted_from,
            adopted=adopted,
        )
    except FilterValueError as e:  # a value no row can hold (a hash prefix, text that is not Unicode): usage
        option = {"input_hashes": "--input-hash", "finish_reasons": "--finish-reason"}.get(e.field)
        raise typer.BadParameter(str(e), param_hint=option or f"--{e.field.replace('_', '-')}") from e
