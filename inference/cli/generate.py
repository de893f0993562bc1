"""``judgestore generate``, ``judge`` and ``pairs``, and the model options they share.

Contract:

* :func:`register` adds the three commands to the app :mod:`inference.cli.app`
  assembles; :func:`model_spec` is the model option group, which that module
  also gives to ``explain``, ``audit`` and ``adopt``.
* ``generate`` and ``judge`` read a JSONL file of requests, print the plan
  (hits, misses, duplicates) before anything runs, show a progress bar while
  the engine generates (on a terminal), write one result line per request,
  and end with the summary of :func:`inference.cache.run.run_requests`: hits,
  misses, rows written, outputs that stopped at ``max_tokens``, wall time,
  and whether the engine was loaded (and vLLM imported). A run that is all
  hits never imports vLLM. Requests that failed (refused by the engine or
  server, or their rows by the store) are listed with their typed reason
  (``failures`` in ``--json``), their result lines carry an ``error``, and
  the command exits 1; every other result is written and stored.
* vLLM settings are named as ``vllm.LLM`` and ``SamplingParams`` name them:
  ``--engine-arg KEY=VALUE`` and ``--sampling KEY=VALUE`` (values are JSON,
  else strings), with options for the common sampling settings. Options left
  out take the library's defaults (:data:`inference.spec.DEFAULT_SAMPLING`).
"""

import enum
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, NoReturn

import orjson
import typer

from inference.backends.hosted.client import DEFAULT_MAX_CONCURRENCY
from inference.backends.hosted.spec import HostedSpec
from inference.backends.vllm.engine_logs import VerboseOption, quiet_engine
from inference.cache.plan import Mode, Plan
from inference.cache.run import RunResult, run_requests
from inference.jsonl import make_pairs, read_completion_requests, read_judgement_requests, write_responses
from inference.judging import OrientationsChoice
from inference.requests import Request
from inference.spec import DEFAULT_SAMPLING, ModelSpec, parse_key_values
from store.cli.common import command_errors, emit_json, progress_bars, stderr
from store.cli.options import JsonOutput, grouped, store_settings
from store.errors import InvalidInputError, JudgestoreError
from store.layout import Role
from store.records import RowFilter
from store.settings import Settings
from store.store import Store

_MODEL = "Model"
_HOSTED = "Hosted model (an OpenAI-compatible server)"
_SAMPLING = "Sampling"
_RUN = "Run"


class ModeChoice(enum.StrEnum):
    use = "use"
    refresh = "refresh"
    off = "off"
    replay = "replay"
    readonly = "readonly"


class InputModeChoice(enum.StrEnum):
    chat = "chat"
    text = "text"


class LogprobPositionsChoice(enum.StrEnum):
    first = "first"
    all = "all"


class ProviderChoice(enum.StrEnum):
    openai = "openai"
    openrouter = "openrouter"
    together = "together"
    vllm_server = "vllm-server"


def register(app: typer.Typer) -> None:
    app.command("generate")(
        command_errors(grouped(spec=model_spec, run=run_options, settings=store_settings)(generate_command))
    )
    app.command("judge")(
        command_errors(grouped(spec=model_spec, run=run_options, settings=store_settings)(judge_command))
    )
    app.command("pairs")(command_errors(pairs_command))


# ---------------------------------------------------------------- option groups


def _model(name: str, help_text: str, **kwargs: object) -> typer.models.OptionInfo:
    return typer.Option(name, help=help_text, rich_help_panel=_MODEL, **kwargs)  # type: ignore[arg-type]


def _hosted(name: str, help_text: str, **kwargs: object) -> typer.models.OptionInfo:
    return typer.Option(name, help=help_text, rich_help_panel=_HOSTED, **kwargs)  # type: ignore[arg-type]


def _sampling(name: str, help_text: str | None = None, **kwargs: object) -> typer.models.OptionInfo:
    return typer.Option(name, help=help_text, rich_help_panel=_SAMPLING, **kwargs)  # type: ignore[arg-type]


def model_spec(
    model: Annotated[
        str, _model("--model", "Hub id or local folder (as vllm.LLM takes it), or the model name a server serves.")
    ],
    label: Annotated[str | None, _model("--label", "Name recorded in the rows (default: the model's).")] = None,
    revision: Annotated[
        str | None, _model("--revision", "Branch, tag or commit of a Hub model (default main); pinned to a commit.")
    ] = None,
    allow_unpinned: Annotated[
        bool,
        _model(
            "--allow-unpinned",
            "When a Hub model can be pinned neither from the local cache nor through the Hub, cache under an "
            "explicitly unpinned descriptor instead of refusing (its rows never hit a pinned run).",
        ),
    ] = False,
    input_mode: Annotated[InputModeChoice, _model("--input-mode", "chat: LLM.chat; text: LLM.generate.")] = (
        InputModeChoice.chat
    ),
    engine_arg: Annotated[
        list[str] | None, _model("--engine-arg", "A vllm.LLM kwarg (repeat).", metavar="KEY=VALUE")
    ] = None,
    chat_template: Annotated[str | None, _model("--chat-template", "Template file or text.")] = None,
    chat_template_kwarg: Annotated[
        list[str] | None, _model("--chat-template-kwarg", "Chat template kwarg (repeat).", metavar="KEY=VALUE")
    ] = None,
    thinking: Annotated[
        bool | None, _model("--enable-thinking/--disable-thinking", "Thinking switch of the template.")
    ] = None,
    temperature: Annotated[
        float | None,
        _sampling("--temperature", f"Default {DEFAULT_SAMPLING['temperature']} (greedy).", show_default=False),
    ] = None,
    max_tokens: Annotated[
        int | None, _sampling("--max-tokens", f"Default {DEFAULT_SAMPLING['max_tokens']}.", show_default=False)
    ] = None,
    seed: Annotated[int | None, _sampling("--seed")] = None,
    top_logprobs: Annotated[
        int | None, _sampling("--top-logprobs", "Candidates kept per position (e.g. of the verdict token).")
    ] = None,
    logprob_positions: Annotated[
        LogprobPositionsChoice,
        _sampling("--logprob-positions", "Keep candidates for the first generated token, or for every one."),
    ] = LogprobPositionsChoice.first,
    sampling: Annotated[
        list[str] | None, _sampling("--sampling", "Another SamplingParams kwarg (repeat).", metavar="KEY=VALUE")
    ] = None,
    provider: Annotated[
        ProviderChoice | None,
        _hosted("--provider", "Send requests to this server instead of loading the model in-process."),
    ] = None,
    base_url: Annotated[str | None, _hosted("--base-url", "The server's URL (default: the provider's).")] = None,
    api_key_env: Annotated[
        str | None,
        _hosted(
            "--api-key-env",
            "Variable holding the API key (default OPENAI_API_KEY, OPENROUTER_API_KEY...).",
            metavar="NAME",
        ),
    ] = None,
    max_concurrency: Annotated[
        int, _hosted("--max-concurrency", "Requests in flight at once.", min=1)
    ] = DEFAULT_MAX_CONCURRENCY,
    routing: Annotated[
        list[str] | None,
        _hosted(
            "--routing",
            'OpenRouter provider routing (repeat), e.g. order=["x"] allow_fallbacks=false.',
            metavar="KEY=VALUE",
        ),
    ] = None,
) -> ModelSpec | HostedSpec:
    """The model of a ``generate``/``judge`` command line; options left out take the library's defaults."""
    given = {"temperature": temperature, "max_tokens": max_tokens, "seed": seed, "logprobs": top_logprobs}
    sampling_kwargs = {k: v for k, v in given.items() if v is not None} | parse_key_values(sampling, "--sampling")
    if provider is not None:
        engine_only = {"--engine-arg": engine_arg, "--chat-template": chat_template, "--allow-unpinned": allow_unpinned}
        refused = [name for name, value in engine_only.items() if value]
        if refused:
            raise InvalidInputError(f"{', '.join(refused)} apply to the in-process engine, not to --provider")
        return HostedSpec(
            model=model,
            provider=provider.value,  # type: ignore[arg-type]
            base_url=base_url,
            api_key_env=api_key_env,
            label=label,
            input_mode=input_mode.value,  # type: ignore[arg-type]
            sampling=sampling_kwargs,
            routing=parse_key_values(routing, "--routing"),
            chat_template_kwargs=parse_key_values(chat_template_kwarg, "--chat-template-kwarg"),
            enable_thinking=thinking,
            logprob_positions=logprob_positions.value,  # type: ignore[arg-type]
            revision=revision,
            max_concurrency=max_concurrency,
        )
    hosted_only = {"--base-url": base_url, "--api-key-env": api_key_env, "--routing": routing}
    if any(hosted_only.values()):
        raise InvalidInputError(f"{', '.join(k for k, v in hosted_only.items() if v)} need --provider")
    engine_kwargs = parse_key_values(engine_arg, "--engine-arg")
    if revision is not None:
        if engine_kwargs.get("revision", revision) != revision:
            raise InvalidInputError("--revision and --engine-arg revision= differ; pass one of them")
        engine_kwargs["revision"] = revision
    return ModelSpec(
        model=model,
        label=label,
        input_mode=input_mode.value,  # type: ignore[arg-type]
        sampling=sampling_kwargs,
        engine_kwargs=engine_kwargs,
        chat_template=chat_template,
        chat_template_kwargs=parse_key_values(chat_template_kwarg, "--chat-template-kwarg"),
        enable_thinking=thinking,
        logprob_positions=logprob_positions.value,  # type: ignore[arg-type]
        allow_unpinned=allow_unpinned,
    )


@dataclass(frozen=True)
class RunOptions:
    """Where a run's requests come from and go to, and how it uses the store (see :func:`run_options`)."""

    task: str
    input_path: Path
    output: Path
    mode: Mode
    chunk_size: int
    fetch: bool | None


def run_options(
    task: Annotated[str, typer.Option("--task", help="Task name: a folder level of the store.", rich_help_panel=_RUN)],
    input_path: Annotated[Path, typer.Option("--input", "-i", help="JSONL file of requests.", rich_help_panel=_RUN)],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="JSONL file of results ('-': stdout).", rich_help_panel=_RUN)
    ] = Path("-"),
    mode: Annotated[
        ModeChoice,
        typer.Option(
            "--mode", help="use | refresh | off | replay (misses are errors) | readonly.", rich_help_panel=_RUN
        ),
    ] = ModeChoice.use,
    chunk_size: Annotated[int, typer.Option("--chunk-size", help="Rows written per chunk.", rich_help_panel=_RUN)] = 64,
    fetch: Annotated[
        bool | None,
        typer.Option(
            "--fetch/--no-fetch",
            help="Fetch this model's folder from the shared remote first (JUDGESTORE_HUB_REPO or JUDGESTORE_SYNC_DIR;"
            " default: JUDGESTORE_FETCH_BEFORE_RUN).",
            rich_help_panel=_RUN,
        ),
    ] = None,
) -> RunOptions:
    return RunOptions(task, input_path, output, mode.value, chunk_size, fetch)  # type: ignore[arg-type]


# ---------------------------------------------------------------- commands


@contextmanager
def _output(path: Path) -> Iterator[IO[bytes]]:
    if str(path) == "-":
        yield sys.stdout.buffer
        sys.stdout.flush()
        return
    with path.open("wb") as handle:
        yield handle


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
    err = stderr()
    if not verbose:
        quiet_engine()
    started = datetime.now(UTC)
    try:
        result = _run_with_progress(spec, requests, role, run, settings, json_output)
    except KeyboardInterrupt:
        _interrupted(spec, role, run, settings, started, json_output)
    with _output(run.output) as out:
        write_responses(out, result.responses, spec.display_name)
    summary = result.summary
    if json_output:
        emit_json(summary.as_dict())
    else:
        err.print(summary.line(), soft_wrap=True)
        if (saved := summary.savings_line()) is not None:
            err.print(saved, soft_wrap=True)
        if (truncated := summary.truncation_note()) is not None:
            err.print(truncated, style="yellow", soft_wrap=True)
        for line in summary.failure_lines():
            err.print(line, style="red", soft_wrap=True, markup=False)
    if summary.failures:  # every answer is written and stored; the run still did not do all it was asked
        raise typer.Exit(1)


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

                    err.print(f"note: {why}; run `{explain_command_line(sys.argv)}` to see why", soft_wrap=True)
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
            on_plan=on_plan,
            on_progress=lambda done, total: progress("generating", done, total),
        )
    return result


def _interrupted(
    spec: ModelSpec | HostedSpec, role: Role, run: RunOptions, settings: Settings, started: datetime, json_output: bool
) -> NoReturn:
    """Ctrl-C: say what the run kept (its rows are those of its run id written since it started); exit 130."""
    kept: int | None = 0
    if run.mode in ("use", "refresh"):
        try:
            with Store(settings, readonly=True) as store:
                database = store.find(role, run.task, spec.descriptor)
                this_run = RowFilter(run_id=settings.run_id, created_after=started)
                kept = 0 if database is None else database.count(this_run)
        except JudgestoreError:
            kept = None
    if run.mode not in ("use", "refresh"):
        message = f"interrupted; mode {run.mode} writes no rows, so nothing was stored"
    elif kept is None:
        message = (
            "interrupted; the rows stored before it are kept, and running the same command again generates only "
            "the rest"
        )
    else:
        message = (
            f"interrupted; this run stored {kept:,} rows before it stopped: they are kept, and running the same "
            "command again generates only the rest"
        )
    if json_output:
        payload = {"error": message, "type": "Interrupted", "rows_kept": kept}
        sys.stderr.write(orjson.dumps(payload).decode() + "\n")
    else:
        stderr().print(message, style="bold yellow", soft_wrap=True)
    raise typer.Exit(130)


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
    _run(spec, list(read_completion_requests(run.input_path)), "completions", run, settings, json_output, verbose)


def judge_command(
    spec: ModelSpec,
    run: RunOptions,
    settings: Settings,
    json_output: JsonOutput = False,
    orientation: Annotated[
        OrientationsChoice, typer.Option("--orientation", help="Orientations of each pair.", rich_help_panel=_RUN)
    ] = OrientationsChoice.both,
    verbose: VerboseOption = False,
) -> None:
    """Judge pairs (both orientations by default) or single answers with a judge model.

    Lines are pairs {"question", "model_a", "answer_a", "model_b", "answer_b"},
    single answers {"question", "model_a", "answer_a"} (pointwise), or judge
    conversations already rendered {"messages", "model_a", "model_b", "orientation"}.
    model_a/model_b of the rows are the positional slots of the judge prompt:
    the reversed row of a pair shows model_b's answer first, so it records it
    as model_a.

    Example: judgestore judge --model judge-model --task arena -i pairs.jsonl -o verdicts.jsonl --top-logprobs 5
    """
    requests = read_judgement_requests(run.input_path, orientation.orientations(), judge=spec.display_name)
    _run(spec, list(requests), "judgements", run, settings, json_output, verbose)


def pairs_command(
    prompts: Annotated[Path, typer.Option("--prompts", help="The JSONL of requests given to generate.")],
    answers: Annotated[
        list[Path], typer.Option("--answers", help="A result file of generate (repeat, one per model).")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="JSONL file of pairs ('-': stdout).")] = Path("-"),
    json_output: JsonOutput = False,
) -> None:
    """Pair every two models' answers to every prompt, ready for `judgestore judge`.

    Example: judgestore pairs --prompts prompts.jsonl --answers a.jsonl --answers b.jsonl -o pairs.jsonl
    """
    pairs = make_pairs(prompts, answers)
    with _output(output) as out:
        for pair in pairs:
            out.write(orjson.dumps(pair) + b"\n")
    if json_output:
        emit_json({"pairs": len(pairs)})
    else:
        stderr().print(f"{len(pairs)} pairs written")
