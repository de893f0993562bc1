"""``judgestore generate``, ``judge`` and ``pairs``.

Contract:

* :func:`register` adds the three commands to the app :mod:`inference.cli.app`
  assembles; ``generate`` and ``judge`` take the model and run options of
  :mod:`inference.cli.options`.
* ``generate`` and ``judge`` read a JSONL file of requests, print the plan
  (hits, misses, duplicates) before anything runs, show a progress bar while
  the engine generates (on a terminal), write one result line per request,
  and end with the summary of :func:`inference.run.run_requests`: hits,
  misses, rows written, outputs that stopped at ``max_tokens``, wall time,
  and whether the engine was loaded (and vLLM imported). A run that is all
  hits never imports vLLM. Requests that failed (refused by the engine or
  server, or their rows by the store) are listed with their typed reason
  (``failures`` in ``--json``), their result lines carry an ``error``, and
  the command exits 1; every other result is written and stored.
* ``--shared-batch``: jobs started on the same inputs and store share the
  misses (:mod:`inference.cache.shared`); each writes the complete output.
"""

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import orjson
import typer

from inference.backends.vllm.engine_logs import quiet_engine
from inference.cache.accounting import CallStats
from inference.cache.plan import Mode, Plan
from inference.cli.options import (
    RUN_PANEL,
    STDIN,
    RunOptions,
    VerboseOption,
    input_file,
    input_files,
    model_spec,
    run_options,
)
from inference.jsonl import make_pairs, read_completion_requests, read_judgement_requests, write_responses
from inference.judging import OrientationsChoice
from inference.requests import Request
from inference.run import RunResult, run_requests
from inference.spec import HostedSpec, ModelSpec
from store import Settings
from store.cli.common import (
    command_errors,
    emit_json,
    interrupted,
    output_file,
    outside_store,
    progress_bars,
    quantity,
    stderr,
    writable_output,
    writes_stdout,
)
from store.cli.options import JsonOutput, grouped, store_settings
from store.errors import JudgestoreError
from store.roles import Role


def register(app: typer.Typer) -> None:
    app.command("generate")(
        command_errors(grouped(spec=model_spec, run=run_options, settings=store_settings)(generate_command))
    )
    app.command("judge")(
        command_errors(grouped(spec=model_spec, run=run_options, settings=store_settings)(judge_command))
    )
    app.command("pairs")(command_errors(pairs_command))


# ---------------------------------------------------------------- commands


def _run(
    spec: ModelSpec | HostedSpec,
    requests: list[Request],
    role: Role,
    run: RunOptions,
    settings: Settings,
    json_output: bool,
    verbose: bool = False,
) -> None:
    """Run, with the plan and a progress bar on stderr; write the results; print the summary.

    The engine's own log stays out of the output unless ``verbose``
    (:mod:`inference.backends.vllm.engine_logs`). Ctrl-C stops the run with exit status 130 and one line (a JSON object
    with ``--json``) saying how many rows the run stored: they are kept, and
    the same command generates only the rest.
    """
    writable_output(run.output, "--output", [run.input_path])
    if not settings.store_url:  # a folder store: an output among its files wrote over a database (was)
        outside_store(run.output, "--output", settings.store_root)
    err = stderr()
    if not verbose:
        quiet_engine()
    try:
        result = _run_with_progress(spec, requests, role, run, settings, json_output)
    except KeyboardInterrupt as e:
        _interrupted(e, run, json_output)
    except JudgestoreError as e:
        if _stale(run.output):
            e.add_note(_NOT_WRITTEN.format(output=run.output))
        raise
    with output_file(
        run.output, "the results", after=_rerun_note(run.mode, failed=bool(result.summary.failures))
    ) as out:
        write_responses(out, result.responses, spec.display_name)
    summary = result.summary
    if json_output:
        emit_json(summary.as_dict(), beside_stdout_results=writes_stdout(run.output))
    else:
        err.print(summary.line(), soft_wrap=True)
        if (saved := summary.savings_line()) is not None:
            err.print(saved, soft_wrap=True)
        if (truncated := summary.truncation_note()) is not None:
            err.print(truncated, style="yellow", soft_wrap=True)
        for line in summary.failure_lines():
            err.print(line, style="red", soft_wrap=True)
    if summary.failures:  # every answer is written and stored; the run still did not do all it was asked
        raise typer.Exit(1)


def _rerun_note(mode: Mode, *, failed: bool) -> str:
    """What running the command again gives, after its results could not be written: the rows are stored by now
    (a rerun of the same command is all hits), but for the modes that store nothing or generate again."""
    if mode in ("off", "readonly"):
        return f"--mode {mode} stored nothing, so running the command again generates every answer again"
    again = "with --mode use " if mode == "refresh" else ""  # a refresh would generate them all again
    left = " (but those that failed, which are never stored)" if failed else ""
    return f"the rows are stored, so running the same command again {again}writes them from the store{left}"


def _run_with_progress(
    spec: ModelSpec | HostedSpec,
    requests: list[Request],
    role: Role,
    run: RunOptions,
    settings: Settings,
    json_output: bool,
) -> RunResult:
    err = stderr()
    with progress_bars(json_output) as progress:

        def on_plan(plan: Plan) -> None:
            if not json_output:
                err.print(f"plan: {plan.summary()}", soft_wrap=True)
                if (why := plan.miss_note()) is not None:
                    from inference.drift.explain import explain_command_line  # only a run that misses needs it

                    command = explain_command_line(sys.argv)
                    err.print(f"note: {why}; run `{command}` to see why (new inputs, a run that stopped early, or "
                              "inputs that changed)", soft_wrap=True)  # fmt: skip
            if plan.misses:
                progress("generating", 0, plan.misses)

        result = run_requests(
            spec,
            requests,
            role=role,
            task=run.task,
            settings=settings,
            mode=run.mode,
            chunk_size=run.chunk_size,
            fetch=run.fetch,
            shared=run.shared_batch,
            on_plan=on_plan,
            on_progress=lambda done, total: progress("generating", done, total),
        )
    return result


_NOT_WRITTEN = "{output} was not written: it holds what an earlier run wrote there"


def _stale(output: Path) -> bool:
    """Whether ``output`` is a file an earlier run left, which a run that stopped leaves as it was: one path reused
    from run to run would otherwise look like this run's results."""
    return not writes_stdout(output) and output.is_file()


def _interrupted(interrupt: KeyboardInterrupt, run: RunOptions, json_output: bool) -> NoReturn:
    """Ctrl-C: say how many rows the run kept (the rows its call wrote, carried by the interrupt); exit 130.

    Counted by the call, not by the run id in the store: jobs that share a run id (one SLURM job's processes) write
    rows of the same id at the same time. An interrupt before the call wrote anything carries nothing: no row.
    """
    output = f"; {_NOT_WRITTEN.format(output=run.output)}" if _stale(run.output) else ""
    if run.mode not in ("use", "refresh"):
        interrupted(f"interrupted; mode {run.mode} writes no rows, so nothing was stored{output}", json_output,
                    rows_kept=0)  # fmt: skip
    # A second Ctrl-C (while the first one's rows and run were being recorded) carries nothing: its context does
    call: CallStats | None = None
    cause: BaseException | None = interrupt
    while call is None and cause is not None:
        call, cause = getattr(cause, "call_stats", None), cause.__context__
    kept = 0 if call is None else call.written
    stored = "they are kept" if kept else "nothing of it is kept"  # "stored 0 rows: they are kept" (was)
    message = f"interrupted; this run stored {quantity(kept, 'row')} before it stopped: {stored}, and "
    if run.mode == "use":
        message += "running the same command again generates only the rest"
    else:  # mode use would answer the inputs it did not reach with their old rows, unrefreshed
        message += (
            "the inputs it did not reach still hold their old rows, if they had any (mode use would return those): "
            "run it again with --mode refresh to refresh them"
        )
    interrupted(message + output, json_output, rows_kept=kept)


def generate_command(
    spec: ModelSpec | HostedSpec,
    run: RunOptions,
    settings: Settings,
    json_output: JsonOutput = False,
    verbose: VerboseOption = False,
) -> None:
    """Complete every request of a JSONL file, asking the store first.

    Each input line is {"messages": [...]} or {"text": "..."} with optional
    "benchmark", "instruction_id", "n" (samples) and "model" (label).

    Example: judgestore generate --model Qwen/Qwen3-8B --task mt-bench -i prompts.jsonl -o answers.jsonl
    """
    requests = read_completion_requests(run.input_path, spec.input_mode)
    _run(spec, list(requests), "completions", run, settings, json_output, verbose)


def judge_command(
    spec: ModelSpec,
    run: RunOptions,
    settings: Settings,
    json_output: JsonOutput = False,
    orientation: Annotated[
        OrientationsChoice | None,
        typer.Option("--orientation", help="Orientations of each pair line (default both).", rich_help_panel=RUN_PANEL),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Judge pairs (both orientations by default) or single answers with a judge model.

    Lines are pairs {"question", "model_a", "answer_a", "model_b", "answer_b"},
    single answers {"question", "model_a", "answer_a"} (pointwise), or judge
    conversations already rendered {"messages", "model_a", "model_b", "orientation"}
    (model_a required; optionally "judge": the label recorded for that line
    instead of --label).
    model_a/model_b of the rows are the positional slots of the judge prompt:
    the reversed row of a pair shows model_b's answer first, so it records it
    as model_a.

    Example: judgestore judge --model judge-model --task arena -i pairs.jsonl -o verdicts.jsonl --top-logprobs 5
    """
    requests = read_judgement_requests(
        run.input_path,
        None if orientation is None else orientation.orientations(),
        judge=spec.display_name,
        input_mode=spec.input_mode,
        to_store=True,
    )
    _run(spec, list(requests), "judgements", run, settings, json_output, verbose)


def pairs_command(
    prompts: Annotated[
        Path,
        typer.Option("--prompts", help="The JSONL of requests given to generate ('-': stdin).", callback=input_file),
    ],
    answers: Annotated[
        list[Path],
        typer.Option(
            "--answers",
            help="A result file of generate (repeat, one per model; '-': stdin).",
            callback=input_files,
            metavar="<path>",
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="JSONL file of pairs ('-': stdout).")] = Path("-"),
    json_output: JsonOutput = False,
) -> None:
    """Pair every two models' answers to every prompt, ready for `judgestore judge`.

    Example: judgestore pairs --prompts prompts.jsonl --answers a.jsonl --answers b.jsonl -o pairs.jsonl
    """
    if [prompts, *answers].count(STDIN) > 1:
        raise typer.BadParameter("stdin can be read once: give '-' to one of --prompts and --answers at most")
    writable_output(output, "--output", [prompts, *answers])
    pairs = make_pairs(prompts, answers)
    with output_file(output, "the pairs") as out:
        for pair in pairs:
            out.write(orjson.dumps(pair) + b"\n")
    if json_output:
        emit_json({"pairs": len(pairs)}, beside_stdout_results=writes_stdout(output))
    else:
        stderr().print(f"{len(pairs)} pairs written")
