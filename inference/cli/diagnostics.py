"""``judgestore explain`` and ``judgestore audit``: why a run missed, and whether stored rows still come out the same.

Contract:

* Thin: parse, call :mod:`inference.drift.explain` and :mod:`inference.drift.audit`,
  render (see :mod:`store.cli.common` for the edge and where output goes).
* Both take the model options ``generate``/``judge`` take: :func:`registrar`
  receives that option group from :mod:`inference.cli.app` (so no CLI module
  imports another, and an option added there reaches these commands too).
  ``explain`` also takes ``--descriptor-file FILE`` (a descriptor or a
  metadata.json) instead of a model.
* ``explain`` never loads the engine nor imports vLLM, and never writes.
  ``audit`` loads the engine and writes nothing to the store; it exits 1 when
  the exact-match rate is under ``--fail-under`` (default 1.0), for CI.
"""

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args

import orjson
import typer
from pydantic import ValidationError
from rich.text import Text

from inference.backends.vllm.engine_logs import quiet_engine
from inference.cache.model import CachedModel
from inference.cli.options import SEED_MAX, SEED_MIN, VerboseOption, input_file, task_name
from inference.jsonl import read_completion_requests, read_judgement_requests
from inference.judging import OrientationsChoice
from inference.requests import Request
from inference.spec import Spec
from store import Settings, Store
from store.cli.common import command_errors, emit_json, interrupted, stderr, stdout
from store.cli.options import JsonOutput, RoleChoice, grouped, share, store_settings
from store.descriptor import ModelDescriptor
from store.errors import DatabaseMissingError, InvalidInputError
from store.roles import ROLES, Role

if TYPE_CHECKING:  # imported when the command runs: starting `judgestore generate` does not pay for them
    from inference.drift.audit import AuditReport
    from inference.drift.explain import DescriptorReport, InputReport

SpecOptions = Callable[..., Spec]
_WHAT = "What to explain"
NEIGHBOURS_SHOWN = 5  # stored descriptors listed in the text output; --json lists every one
_AUDITED = "What to audit"


def registrar(spec_options: SpecOptions) -> Callable[[typer.Typer], None]:
    """The ``register`` of ``explain`` and ``audit``, with the model options of ``generate``/``judge``."""

    def register(app: typer.Typer) -> None:
        app.command("explain")(
            command_errors(grouped(spec=optional_model(spec_options), settings=store_settings)(explain_command))
        )
        app.command("audit")(command_errors(grouped(spec=spec_options, settings=store_settings)(audit_command)))

    return register


def optional_model(spec_options: SpecOptions) -> Callable[..., Spec | None]:
    """``spec_options`` with ``--model`` optional: None when it is not given."""
    signature = inspect.signature(spec_options, eval_str=True)

    def build(**values: Any) -> Spec | None:
        return None if values.get("model") is None else spec_options(**values)

    params = []
    for param in signature.parameters.values():
        if param.name == "model":
            _, *info = get_args(param.annotation)
            param = param.replace(annotation=Annotated[(str | None, *info)], default=None)
        params.append(param)
    build.__signature__ = signature.replace(parameters=params, return_annotation=Any)  # type: ignore[attr-defined]
    return build


# ---------------------------------------------------------------- explain


def _descriptor_file(path: Path) -> tuple[ModelDescriptor, Role | None]:
    """The descriptor a file holds, and the role its database is of when it is a metadata.json."""
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise InvalidInputError(f"{path}: cannot read a descriptor ({e})") from e
    metadata = isinstance(doc, dict) and "descriptor" in doc
    role = doc.get("role") if metadata and doc.get("role") in ROLES else None
    try:
        return ModelDescriptor.model_validate(doc["descriptor"] if metadata else doc), role
    except ValidationError as e:
        raise InvalidInputError(
            f"{path}: not a judgestore descriptor or metadata.json ({e.error_count()} errors)"
        ) from e


def _requests(path: Path, role: Role, orientation: OrientationsChoice | None, label: str) -> list[Request]:
    if role == "completions":
        return list(read_completion_requests(path))
    return list(read_judgement_requests(path, None if orientation is None else orientation.orientations(), label))


def _never_loaded() -> Any:
    raise AssertionError("explain never prepares an engine")


def explain_command(
    spec: Spec | None,
    settings: Settings,
    task: Annotated[
        str,
        typer.Option(
            "--task", help="Task name: a folder level of the store.", rich_help_panel=_WHAT, callback=task_name
        ),
    ],
    role: Annotated[
        RoleChoice | None,
        typer.Option(
            "--role",
            help="completions (generate) or judgements (judge); default: a metadata.json's role, else completions.",
            rich_help_panel=_WHAT,
        ),
    ] = None,
    input_path: Annotated[
        Path | None,
        typer.Option(
            "--input",
            "-i",
            help="The JSONL of requests ('-': stdin): explain each miss.",
            rich_help_panel=_WHAT,
            callback=input_file,
        ),
    ] = None,
    orientation: Annotated[
        OrientationsChoice | None,
        typer.Option(
            "--orientation",
            help="(judgements) Orientations of each pair line, as given to judge (default both).",
            rich_help_panel=_WHAT,
        ),
    ] = None,
    descriptor_file: Annotated[
        Path | None,
        typer.Option(
            "--descriptor-file",
            metavar="FILE",
            help="A descriptor (or a metadata.json) instead of --model.",
            rich_help_panel=_WHAT,
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Explain at most N misses.")] = 10,
    json_output: JsonOutput = False,
) -> None:
    """Why a run misses: its descriptor against the stored ones, and each missing input against stored rows.

    Takes the model options of generate/judge (or --descriptor-file) and
    --task; with -i, the request file too. Lists the stored descriptors of
    the same model nearest first, each with the fields that differ (e.g.
    sampling.temperature 0.0 -> 0.7, backend_version 0.11.0 -> 0.32.0), and
    for each missing request the stored row it should have matched and where
    the rendered inputs differ. Never loads the model and never writes.

    Examples:

        judgestore explain --model Qwen/Qwen3-8B --temperature 0.7 --task mt-bench

        judgestore explain --model ./judge --role judgements --task arena \\
            -i pairs.jsonl --top-logprobs 5

        judgestore explain --descriptor-file old/metadata.json --task mt-bench
    """
    if spec is None and descriptor_file is None:  # "not both" said of neither misled (was)
        raise typer.BadParameter("give the model (--model and its options) or --descriptor-file")
    if spec is not None and descriptor_file is not None:
        raise typer.BadParameter("give the model (--model and its options) or --descriptor-file, not both")
    if spec is not None:
        descriptor, recorded = spec.descriptor, None
    else:
        descriptor, recorded = _descriptor_file(descriptor_file)  # type: ignore[arg-type]
    if role is not None and recorded is not None and role.value != recorded:
        raise InvalidInputError(f"{descriptor_file} is the metadata.json of {recorded}, not {role.value}")
    role_value: Role = role.value if role is not None else recorded or "completions"  # type: ignore[assignment]
    label = spec.display_name if spec is not None else descriptor.model
    requests = None if input_path is None else _requests(input_path, role_value, orientation, label)
    from inference.drift.explain import explain_descriptor, explain_inputs

    with Store(settings, readonly=True) as store:
        store.require_present("to explain against")
        report = explain_descriptor(store, role_value, task, descriptor)
        inputs = None
        if requests is not None:
            model = CachedModel(store, descriptor, task=task, backend_factory=_never_loaded, mode="readonly")
            plan = model.plan(role_value, requests)
            inputs = explain_inputs(
                store,
                role_value,
                task,
                descriptor,
                plan,
                requests,
                limit=limit,
                neighbours=[n.location for n in report.neighbours if n.error is None],
            )
    if json_output:
        emit_json({"descriptor": report.as_dict(), "inputs": None if inputs is None else inputs.as_dict()})
        return
    _print_descriptor(report)
    if inputs is not None:
        _print_inputs(inputs)


def _print_descriptor(report: "DescriptorReport") -> None:
    out = stdout()
    where = f"{report.location.role}/{report.location.task}/{report.location.model}"
    held = f"holds {report.rows:,} rows" if report.exists else "is not in the store"
    out.print(Text(f"descriptor {report.location.descriptor_hash16} ({where}) {held}", style="bold"), soft_wrap=True)
    if not report.neighbours:
        if not report.exists:
            out.print("no descriptor of this model is stored (a first run, or another --model / --provider?)")
        return
    out.print("stored descriptors of this model, nearest first (stored -> this run):")
    for n in report.neighbours[:NEIGHBOURS_SHOWN]:
        head = f"  {n.location.descriptor_hash16} ({n.location.task}, "
        if n.error is not None:
            out.print(head + f"unreadable): {n.error}", soft_wrap=True)
            continue
        changes = "; ".join(c.text() for c in n.changes) or "no difference"
        out.print(head + f"{n.rows:,} rows): {changes}", soft_wrap=True)
    if (more := len(report.neighbours) - NEIGHBOURS_SHOWN) > 0:
        out.print(f"  ... and {more:,} more (--json lists them all)")


def _print_inputs(inputs: "InputReport") -> None:
    out = stdout()
    out.print(
        f"inputs: {inputs.requested} requested, {inputs.distinct} distinct, {inputs.hits} hits, {inputs.misses} misses"
    )
    for miss in inputs.explained:
        sample = f", sample {miss.sample_index}" if miss.sample_index else ""
        out.print(f"  {miss.named()} ({miss.request}{sample}): {miss.reason}", soft_wrap=True)
        for diff in miss.diffs:
            out.print(f"    {diff.text()}", soft_wrap=True)
    if inputs.misses > len(inputs.explained):
        out.print(f"  ... and {inputs.misses - len(inputs.explained)} more misses (--limit N shows more)")


# ---------------------------------------------------------------- audit


def audit_command(
    spec: Spec,
    settings: Settings,
    task: Annotated[
        str,
        typer.Option(
            "--task", help="Task name: a folder level of the store.", rich_help_panel=_AUDITED, callback=task_name
        ),
    ],
    role: Annotated[
        RoleChoice,
        typer.Option("--role", help="completions (generate) or judgements (judge).", rich_help_panel=_AUDITED),
    ] = RoleChoice.completions,
    sample: Annotated[int, typer.Option("--sample", min=1, help="How many stored rows to regenerate.")] = 20,
    sample_seed: Annotated[
        int | None,
        typer.Option(
            "--sample-seed",
            help="Seed of the random choice of rows (default: a new choice).",
            min=SEED_MIN,
            max=SEED_MAX,
        ),
    ] = None,
    fail_under: Annotated[
        float,
        typer.Option(
            "--fail-under", parser=share, metavar="SHARE", help="Exit 1 when the exact-match rate is below this (0-1)."
        ),
    ] = 1.0,
    json_output: JsonOutput = False,
    verbose: VerboseOption = False,
) -> None:
    """Regenerate a random sample of stored rows with the engine and compare: do they still come out the same?

    Takes the model options of generate/judge and --task. Reports the
    exact-match rate, for each mismatch the first differing character, and,
    with top logprobs stored, the change of the first token's logprobs (the
    verdict token of a judgement). Writes nothing to the store; exits 1 when
    the exact-match rate is under --fail-under (default 1.0: every row).

    Examples:

        judgestore audit --model Qwen/Qwen3-8B --task mt-bench --sample 50

        judgestore audit --model ./judge --role judgements --task arena \\
            --top-logprobs 5 --json
    """
    from inference.drift.audit import audit_database

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the report
    if not verbose:
        quiet_engine()
    with Store(settings, readonly=True) as store:
        store.require_present("to audit")
        try:
            database = store.find(role.value, task, spec.descriptor)
        except DatabaseMissingError:
            database = None
        if database is None or not database.count():  # an audit of nothing would pass any --fail-under
            raise InvalidInputError(
                f"nothing is stored for {spec.display_name} ({role.value}, task {task}, descriptor "
                f"{spec.descriptor.hash16()}); `judgestore explain` with the same options says what is stored "
                "instead"
            )
        try:
            report = audit_database(database, spec, sample=sample, seed=sample_seed)
        except KeyboardInterrupt:
            interrupted("interrupted before a verdict; an audit only reads, so nothing was changed", json_output)
    if json_output:
        emit_json(report.as_dict())
    else:
        _print_audit(report)
    if report.exact_rate < fail_under:
        if not json_output:
            stderr().print(f"exact-match rate {report.exact_rate:.1%} is under --fail-under {fail_under:.1%}")
        raise typer.Exit(1)


def _print_audit(report: "AuditReport") -> None:
    out = stdout()
    for line in report.lines():
        out.print(line, soft_wrap=True)
