"""The whole ``judgestore`` command line: the store's data commands plus generate, judge and pairs.

Contract:

* The console script points here, so the dependency runs one way:
  :mod:`store.cli` knows nothing of inference; this module adds its
  commands to ``store.cli.app``.
* ``generate`` and ``judge`` read a JSONL file of requests, print the plan
  (hits, misses, duplicates) before anything runs, show a progress bar while
  the engine generates, write one result line per request, and end with a
  summary: hits, misses, rows written, wall time, and whether the engine was
  loaded (and vLLM imported). A run that is all hits never imports vLLM.
* vLLM settings are named as ``vllm.LLM`` and ``SamplingParams`` name them:
  ``--engine-arg KEY=VALUE`` and ``--sampling KEY=VALUE`` (values are JSON,
  else strings), with options for the common sampling settings.
"""

from __future__ import annotations

import enum
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO, Annotated

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from inference import legacy_cli
from inference.cached import Plan
from inference.jsonl import make_pairs, read_completion_requests, read_judgement_requests, write_responses
from inference.requests import Orientation, Request
from inference.spec import DEFAULT_SAMPLING, ModelSpec, parse_key_values
from store.cli import JsonOutput, StoreRoot, app, command_errors, settings_and_root
from store.errors import InvalidInputError
from store.store import Store
from store.sync.settings import SyncSettings, open_remote

_MODEL = "Model"
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


class OrientationsChoice(enum.StrEnum):
    both = "both"
    direct = "direct"
    reversed = "reversed"


ModelOption = Annotated[
    str,
    typer.Option("--model", help="Model id or local folder, as vllm.LLM(model=...) takes it.", rich_help_panel=_MODEL),
]
LabelOption = Annotated[
    str | None,
    typer.Option("--label", help="Name recorded in the rows (default: --model).", rich_help_panel=_MODEL),
]
TaskOption = Annotated[
    str, typer.Option("--task", help="Task name: a folder level of the store.", rich_help_panel=_RUN)
]
InputOption = Annotated[Path, typer.Option("--input", "-i", help="JSONL file of requests.", rich_help_panel=_RUN)]
OutputOption = Annotated[
    Path, typer.Option("--output", "-o", help="JSONL file of results ('-': stdout).", rich_help_panel=_RUN)
]
InputModeOption = Annotated[
    InputModeChoice, typer.Option("--input-mode", help="chat: LLM.chat; text: LLM.generate.", rich_help_panel=_MODEL)
]
EngineArgOption = Annotated[
    list[str] | None,
    typer.Option("--engine-arg", metavar="KEY=VALUE", help="A vllm.LLM kwarg (repeat).", rich_help_panel=_MODEL),
]
ChatTemplateOption = Annotated[
    str | None, typer.Option("--chat-template", help="Template file or text.", rich_help_panel=_MODEL)
]
TemplateKwargOption = Annotated[
    list[str] | None,
    typer.Option(
        "--chat-template-kwarg", metavar="KEY=VALUE", help="Chat template kwarg (repeat).", rich_help_panel=_MODEL
    ),
]
ThinkingOption = Annotated[
    bool | None,
    typer.Option(
        "--enable-thinking/--disable-thinking", help="Thinking switch of the template.", rich_help_panel=_MODEL
    ),
]
TemperatureOption = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        show_default=False,
        help=f"Default {DEFAULT_SAMPLING['temperature']} (greedy), as in the Python API.",
        rich_help_panel=_SAMPLING,
    ),
]
MaxTokensOption = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        show_default=False,
        help=f"Default {DEFAULT_SAMPLING['max_tokens']}, as in the Python API.",
        rich_help_panel=_SAMPLING,
    ),
]
LogprobPositionsOption = Annotated[
    LogprobPositionsChoice,
    typer.Option(
        "--logprob-positions",
        help="Keep the top logprobs of the first generated token, or of every one (needs --top-logprobs).",
        rich_help_panel=_SAMPLING,
    ),
]
RevisionOption = Annotated[
    str | None,
    typer.Option(
        "--revision",
        help="Branch, tag or commit of a Hub model (default main); it is pinned to a commit either way.",
        rich_help_panel=_MODEL,
    ),
]
AllowUnpinnedOption = Annotated[
    bool,
    typer.Option(
        "--allow-unpinned",
        help="When a Hub model can be pinned neither from the local cache nor through the Hub, cache under an "
        "explicitly unpinned descriptor instead of refusing (its rows never hit a pinned run).",
        rich_help_panel=_MODEL,
    ),
]
SeedOption = Annotated[int | None, typer.Option("--seed", rich_help_panel=_SAMPLING)]
SamplingOption = Annotated[
    list[str] | None,
    typer.Option(
        "--sampling", metavar="KEY=VALUE", help="Another SamplingParams kwarg (repeat).", rich_help_panel=_SAMPLING
    ),
]
ModeOption = Annotated[
    ModeChoice,
    typer.Option("--mode", help="use | refresh | off | replay (misses are errors) | readonly.", rich_help_panel=_RUN),
]
ChunkOption = Annotated[int, typer.Option("--chunk-size", help="Rows written per chunk.", rich_help_panel=_RUN)]
FetchOption = Annotated[
    bool | None,
    typer.Option(
        "--fetch/--no-fetch",
        help="Fetch this model's folder from the shared remote first (JUDGESTORE_HUB_REPO or JUDGESTORE_SYNC_DIR; "
        "default: JUDGESTORE_FETCH_BEFORE_RUN).",
        rich_help_panel=_RUN,
    ),
]


def _spec(
    model: str,
    label: str | None,
    input_mode: InputModeChoice,
    *,
    temperature: float | None,
    max_tokens: int | None,
    seed: int | None,
    top_logprobs: int | None,
    logprob_positions: LogprobPositionsChoice,
    sampling: Sequence[str] | None,
    engine_args: Sequence[str] | None,
    revision: str | None,
    allow_unpinned: bool,
    chat_template: str | None,
    template_kwargs: Sequence[str] | None,
    thinking: bool | None,
) -> ModelSpec:
    """The model spec of a command line; options left out take ModelSpec's (the library's) defaults."""
    given = {"temperature": temperature, "max_tokens": max_tokens, "seed": seed, "logprobs": top_logprobs}
    engine_kwargs = parse_key_values(engine_args, "--engine-arg")
    if revision is not None:
        if engine_kwargs.get("revision", revision) != revision:
            raise InvalidInputError("--revision and --engine-arg revision= differ; pass one of them")
        engine_kwargs["revision"] = revision
    return ModelSpec(
        model=model,
        label=label,
        input_mode=input_mode.value,  # type: ignore[arg-type]
        sampling={k: v for k, v in given.items() if v is not None} | parse_key_values(sampling, "--sampling"),
        engine_kwargs=engine_kwargs,
        chat_template=chat_template,
        chat_template_kwargs=parse_key_values(template_kwargs, "--chat-template-kwarg"),
        enable_thinking=thinking,
        logprob_positions=logprob_positions.value,  # type: ignore[arg-type]
        allow_unpinned=allow_unpinned,
    )


@contextmanager
def _output(path: Path) -> Iterator[IO[bytes]]:
    if str(path) == "-":
        yield sys.stdout.buffer
        sys.stdout.flush()
        return
    with path.open("wb") as handle:
        yield handle


def _run(
    spec: ModelSpec,
    requests: Sequence[Request],
    *,
    role: str,
    task: str,
    output: Path,
    mode: ModeChoice,
    chunk_size: int,
    fetch: bool | None,
    store_root: Path | None,
    json_output: bool,
) -> None:
    """Plan, generate what is missing with a progress bar, write results, print the summary."""
    started = time.perf_counter()
    # stdout carries results (or the --json summary); vLLM logs to stdout unless told otherwise.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    settings, root = settings_and_root(store_root)
    err = Console(stderr=True, highlight=False)
    sync_settings = SyncSettings()
    remote = (
        open_remote(settings=sync_settings) if (sync_settings.fetch_before_run if fetch is None else fetch) else None
    )
    # Replay never writes rows of its own; with a remote it still imports the fetched ones.
    readonly = mode is ModeChoice.readonly or (mode is ModeChoice.replay and remote is None)
    store = None if mode is ModeChoice.off else Store(settings, root=root, readonly=readonly)
    cached = spec.cached(store, task=task, mode=mode.value, chunk_size=chunk_size, remote=remote)  # type: ignore[arg-type]
    columns = (TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        Progress(*columns, console=err, transient=True, disable=json_output or not err.is_terminal) as progress,
        cached,
        store if store is not None else nullcontext(),
    ):
        bar = progress.add_task("generate", total=None, visible=False)

        def on_plan(plan: Plan) -> None:
            if not json_output:
                err.print(f"plan: {plan.summary()}", soft_wrap=True)
            progress.update(bar, total=plan.misses, visible=plan.misses > 0)

        def on_progress(done: int, total: int) -> None:
            progress.update(bar, completed=done)

        run = cached.complete if role == "completions" else cached.judge
        responses = run(requests, on_plan=on_plan, on_progress=on_progress)  # type: ignore[arg-type]
        with _output(output) as out:
            write_responses(out, responses, cached.label)
    plan = cached.last.plan
    assert plan is not None
    summary = {
        "role": role,
        "task": task,
        "model": spec.model,
        "descriptor": spec.descriptor.hash16(),
        "requests": len(requests),
        "requested": plan.requested,
        "hits": plan.hits,
        "misses": plan.misses,
        "duplicates": plan.duplicates,
        "fetched_rows": cached.last.fetched_rows,
        "generated": cached.last.generated,
        "rows_written": cached.last.written,
        "truncated": cached.last.truncated,
        "engine_loaded": cached.last.engine_loaded,
        "vllm_imported": "vllm" in sys.modules,
        "wall_seconds": round(time.perf_counter() - started, 3),
        "mode": mode.value,
    }
    if json_output:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    hit_rate = 100 * plan.hits / plan.distinct if plan.distinct else 100.0
    err.print(
        f"done: {plan.hits} hits ({hit_rate:.0f}%), {plan.misses} misses, {summary['rows_written']} rows written, "
        f"{summary['wall_seconds']} s, engine loaded: {'yes' if summary['engine_loaded'] else 'no'}"
        + (f", {summary['fetched_rows']} rows fetched from {remote.url}" if remote is not None else "")
        + ("" if summary["vllm_imported"] else " (vLLM never imported)"),
        soft_wrap=True,
    )
    if cached.last.truncated:
        err.print(
            f"note: {cached.last.truncated} outputs stopped at max_tokens "
            f"({spec.descriptor.sampling.max_tokens}; finish_reason=length): raise --max-tokens to let them finish",
            style="yellow",
            soft_wrap=True,
        )


@app.command("generate")
@command_errors
def generate_command(
    model: ModelOption,
    task: TaskOption,
    input_path: InputOption,
    output: OutputOption = Path("-"),
    label: LabelOption = None,
    input_mode: InputModeOption = InputModeChoice.chat,
    temperature: TemperatureOption = None,
    max_tokens: MaxTokensOption = None,
    seed: SeedOption = None,
    top_logprobs: Annotated[int | None, typer.Option("--top-logprobs", rich_help_panel=_SAMPLING)] = None,
    logprob_positions: LogprobPositionsOption = LogprobPositionsChoice.first,
    sampling: SamplingOption = None,
    engine_arg: EngineArgOption = None,
    revision: RevisionOption = None,
    allow_unpinned: AllowUnpinnedOption = False,
    chat_template: ChatTemplateOption = None,
    chat_template_kwarg: TemplateKwargOption = None,
    thinking: ThinkingOption = None,
    mode: ModeOption = ModeChoice.use,
    chunk_size: ChunkOption = 64,
    fetch: FetchOption = None,
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
) -> None:
    """Complete every request of a JSONL file, asking the store first.

    Each input line is {"messages": [...]} or {"text": "..."} with optional
    "benchmark", "instruction_id", "n" (samples) and "model" (label).

    Example: judgestore generate --model Qwen/Qwen3-8B --task mt-bench -i prompts.jsonl -o answers.jsonl
    """
    spec = _spec(
        model,
        label,
        input_mode,
        temperature=temperature,
        max_tokens=max_tokens,
        seed=seed,
        top_logprobs=top_logprobs,
        logprob_positions=logprob_positions,
        sampling=sampling,
        engine_args=engine_arg,
        revision=revision,
        allow_unpinned=allow_unpinned,
        chat_template=chat_template,
        template_kwargs=chat_template_kwarg,
        thinking=thinking,
    )
    requests = read_completion_requests(input_path)
    _run(
        spec,
        requests,
        role="completions",
        task=task,
        output=output,
        mode=mode,
        chunk_size=chunk_size,
        fetch=fetch,
        store_root=store_root,
        json_output=json_output,
    )


@app.command("judge")
@command_errors
def judge_command(
    model: ModelOption,
    task: TaskOption,
    input_path: InputOption,
    output: OutputOption = Path("-"),
    label: LabelOption = None,
    orientation: Annotated[
        OrientationsChoice, typer.Option("--orientation", help="Orientations of each pair.", rich_help_panel=_RUN)
    ] = OrientationsChoice.both,
    top_logprobs: Annotated[
        int | None,
        typer.Option(
            "--top-logprobs", help="Candidates kept per position (the verdict token).", rich_help_panel=_SAMPLING
        ),
    ] = None,
    logprob_positions: LogprobPositionsOption = LogprobPositionsChoice.first,
    input_mode: InputModeOption = InputModeChoice.chat,
    temperature: TemperatureOption = None,
    max_tokens: MaxTokensOption = None,
    seed: SeedOption = None,
    sampling: SamplingOption = None,
    engine_arg: EngineArgOption = None,
    revision: RevisionOption = None,
    allow_unpinned: AllowUnpinnedOption = False,
    chat_template: ChatTemplateOption = None,
    chat_template_kwarg: TemplateKwargOption = None,
    thinking: ThinkingOption = None,
    mode: ModeOption = ModeChoice.use,
    chunk_size: ChunkOption = 64,
    fetch: FetchOption = None,
    store_root: StoreRoot = None,
    json_output: JsonOutput = False,
) -> None:
    """Judge pairs (both orientations by default) or single answers with a judge model.

    Lines are pairs {"question", "model_a", "answer_a", "model_b", "answer_b"},
    single answers {"question", "model_a", "answer_a"} (pointwise), or judge
    conversations already rendered {"messages", "model_a", "model_b", "orientation"}.

    Example: judgestore judge --model judge-model --task arena -i pairs.jsonl -o verdicts.jsonl --top-logprobs 5
    """
    spec = _spec(
        model,
        label,
        input_mode,
        temperature=temperature,
        max_tokens=max_tokens,
        seed=seed,
        top_logprobs=top_logprobs,
        logprob_positions=logprob_positions,
        sampling=sampling,
        engine_args=engine_arg,
        revision=revision,
        allow_unpinned=allow_unpinned,
        chat_template=chat_template,
        template_kwargs=chat_template_kwarg,
        thinking=thinking,
    )
    orientations: tuple[Orientation, ...] = (
        ("direct", "reversed") if orientation is OrientationsChoice.both else (orientation.value,)  # type: ignore[assignment]
    )
    requests = read_judgement_requests(input_path, orientations, judge=spec.display_name)
    _run(
        spec,
        requests,
        role="judgements",
        task=task,
        output=output,
        mode=mode,
        chunk_size=chunk_size,
        fetch=fetch,
        store_root=store_root,
        json_output=json_output,
    )


@app.command("pairs")
@command_errors
def pairs_command(
    prompts: Annotated[Path, typer.Option("--prompts", help="The JSONL of requests given to generate.")],
    answers: Annotated[
        list[Path], typer.Option("--answers", help="A result file of generate (repeat, one per model).")
    ],
    output: OutputOption = Path("-"),
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
        sys.stdout.write(orjson.dumps({"pairs": len(pairs)}).decode() + "\n")
    else:
        Console(stderr=True).print(f"{len(pairs)} pairs written")


legacy_cli.register(app)


def main() -> None:
    app()
