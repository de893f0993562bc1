"""``judgestore adopt``: audit an older descriptor's rows with this run's engine, then adopt them if they hold up.

Contract:

* Thin: parse, call :func:`inference.drift.adopt.adopt`, render (see
  :mod:`store.cli.common` for the edge and where output goes).
* Takes the model options ``generate``/``judge`` take: :func:`registrar`
  receives that option group from :mod:`inference.cli.app` (no CLI module
  imports another), so the descriptor adopted into is exactly the one a run
  with the same options uses.
* Exit status 1 when the thresholds are not met (nothing is written), and
  for every refusal before the audit (no source, several sources, a source
  that differs in a field ``--across`` does not allow). ``--dry-run`` opens
  the store read-only and writes nothing; the audit still runs the engine.
"""

import os
from collections.abc import Callable
from typing import Annotated

import typer

from inference.backends.vllm.engine_logs import quiet_engine
from inference.cli.options import SEED_MAX, SEED_MIN, VerboseOption, task_name
from inference.drift.adopt import DEFAULT_SAMPLE, AdoptionReport, adopt, check_across
from inference.spec import Spec
from store import Settings, Store
from store.cli.common import command_errors, emit_json, interrupted, stdout
from store.cli.options import JsonOutput, RoleChoice, grouped, non_negative, share, store_settings
from store.errors import InvalidInputError

SpecOptions = Callable[..., Spec]
_WHAT = "What to adopt"
_WHEN = "When to adopt"


def _descriptor_fields(across: list[str]) -> list[str]:
    """``--across`` checked as it is parsed: a name that is no descriptor field is a usage error (exit 2), found
    before the store or the engine is opened."""
    try:
        check_across(across)
    except InvalidInputError as e:
        raise typer.BadParameter(str(e)) from e
    return across


def registrar(spec_options: SpecOptions) -> Callable[[typer.Typer], None]:
    """The ``register`` of ``adopt``, with the model options of ``generate``/``judge``."""

    def register(app: typer.Typer) -> None:
        app.command("adopt")(command_errors(grouped(spec=spec_options, settings=store_settings)(adopt_command)))

    return register


def adopt_command(
    spec: Spec,
    settings: Settings,
    task: Annotated[
        str,
        typer.Option(
            "--task", help="Task name: a folder level of the store.", rich_help_panel=_WHAT, callback=task_name
        ),
    ],
    across: Annotated[
        list[str],
        typer.Option(
            "--across",
            metavar="FIELD",
            help="A descriptor field the source may differ in (repeat): backend_version, engine.SETTING, task...",
            rich_help_panel=_WHAT,
            callback=_descriptor_fields,
        ),
    ],
    role: Annotated[
        RoleChoice, typer.Option("--role", help="completions (generate) or judgements (judge).", rich_help_panel=_WHAT)
    ] = RoleChoice.completions,
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="[TASK/]HASH",
            help="The descriptor to adopt from (its hash or a prefix; TASK/HASH where it is stored under several "
            "tasks); needed when several qualify.",
            rich_help_panel=_WHAT,
        ),
    ] = None,
    sample: Annotated[
        int, typer.Option("--sample", min=1, help="Stored rows to regenerate and compare.", rich_help_panel=_WHEN)
    ] = DEFAULT_SAMPLE,
    sample_seed: Annotated[
        int | None,
        typer.Option(
            "--sample-seed",
            help="Seed of the random choice of rows (default: a new choice).",
            rich_help_panel=_WHEN,
            # the adoption record keeps it in a 64-bit column: a larger one failed after the whole audit (was)
            min=SEED_MIN,
            max=SEED_MAX,
        ),
    ] = None,
    min_exact: Annotated[
        float,
        typer.Option(
            "--min-exact",
            parser=share,
            metavar="SHARE",
            help="Adopt only if at least this share of the sample matches (0-1).",
            rich_help_panel=_WHEN,
        ),
    ] = 1.0,
    max_logprob_delta: Annotated[
        float | None,
        typer.Option(
            "--max-logprob-delta",
            parser=non_negative,
            metavar="NUMBER",
            help="(judgements) Adopt only if no first-token logprob moved by more than this.",
            rich_help_panel=_WHEN,
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Audit and report; write nothing.")] = False,
    json_output: JsonOutput = False,
    verbose: VerboseOption = False,
) -> None:
    """Carry rows of an older descriptor (another vLLM version...) over to this one, after an audit.

    Takes the model options of generate/judge, --task and --across (the
    fields the older descriptor may differ in). Finds the stored descriptor
    of the same model that differs only in those fields (--from when there
    are several), regenerates --sample of its rows with this engine, and
    only when at least --min-exact of them match exactly (default: all; and
    for judgements, with --max-logprob-delta, the verdict logprobs moved no
    more than that) copies its rows into this descriptor's database, each
    marked with the source (`judgestore query --adopted`, `judgestore delete
    --adopted-from HASH`), and records the adoption there. The next run with
    the same options hits them without loading the engine; a run with any
    other setting never sees them. Exits 1 when refused.

    Examples:

        judgestore adopt --model Qwen/Qwen3-8B --task mt-bench --max-tokens 1024 \\
            --across backend_version

        judgestore adopt --model ./judge --role judgements --task arena \\
            --top-logprobs 5 --across backend_version --max-logprob-delta 0.05 \\
            --dry-run
    """
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the report
    if not verbose:
        quiet_engine()
    with Store(settings, readonly=dry_run) as store:
        store.require_present("to adopt rows in")
        try:
            report = adopt(
                store,
                spec,
                role=role.value,  # type: ignore[arg-type]
                task=task,
                across=across,
                source=source,
                sample=sample,
                seed=sample_seed,
                min_exact=min_exact,
                max_logprob_delta=max_logprob_delta,
                dry_run=dry_run,
            )
        except KeyboardInterrupt:  # the rows and their record are written in one transaction, after the audit
            interrupted("interrupted; nothing was adopted: run the same adopt again", json_output, rows_adopted=0)
    if json_output:
        emit_json(report.as_dict())
    else:
        _print(report)
    if not report.met:
        raise typer.Exit(1)


def _print(report: AdoptionReport) -> None:
    out = stdout()
    for line in report.lines():
        out.print(line, soft_wrap=True)
