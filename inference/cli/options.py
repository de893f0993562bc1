"""The option groups the inference layer's commands share: the model, the run, ``-v``.

Contract:

* :func:`model_spec` is the model of a command line: a
  :class:`~inference.spec.ModelSpec` (vLLM, in-process), or with
  ``--provider`` a :class:`~inference.spec.HostedSpec`.
  vLLM settings are named as ``vllm.LLM`` and ``SamplingParams`` name them:
  ``--engine-arg KEY=VALUE`` and ``--sampling KEY=VALUE`` (values are JSON,
  else strings), with options for the common sampling settings. Options left
  out take the library's defaults (:data:`inference.spec.DEFAULT_SAMPLING`).
  ``generate`` and ``judge`` take it, and :mod:`inference.cli.app` gives it
  to ``explain``, ``audit`` and ``adopt``.
* :func:`run_options` is where a run's requests come from and go to, and how
  it uses the store (:class:`RunOptions`), shared with other jobs or not
  (``--shared-batch``).
* :data:`VerboseOption` is the ``-v``/``--verbose`` option of the commands
  that may load vLLM; without it they call
  :func:`~inference.backends.vllm.engine_logs.quiet_engine`.
* Like every module that declares options, this one does not use
  ``from __future__ import annotations`` (see :mod:`store.cli.app`).
"""

import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from inference.backends.hosted.client import DEFAULT_TIMEOUT_S
from inference.cache.plan import Mode
from inference.spec import DEFAULT_SAMPLING, HostedSpec, ModelSpec, malformed_key_value, parse_key_values
from store.errors import InvalidInputError
from store.segments import encode_segment

_MODEL = "Model"
_HOSTED = "Hosted model (an OpenAI-compatible server)"
_SAMPLING = "Sampling"
RUN_PANEL = "Run"
# --sample-seed's range: what an adoption record keeps it in (a signed 64-bit column on both backends)
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


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


VerboseOption = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v", help="Also show the engine's own log (vLLM, torch) on stderr; by default only errors."
    ),
]


def key_values(items: list[str] | None) -> list[str] | None:
    """Refuse a malformed ``KEY=VALUE`` as the usage error it is (exit status 2), before anything runs."""
    if (bad := malformed_key_value(items)) is not None:
        raise typer.BadParameter(f"expects KEY=VALUE, got {bad!r}")
    return items


STDIN = Path("/dev/stdin")


def input_file(path: Path | None) -> Path | None:
    """``-i -`` is stdin, read through ``/dev/stdin`` so an error names it (``/dev/stdin:3: ...``)."""
    return None if path is None else input_files([path])[0]


def input_files(paths: list[Path]) -> list[Path]:
    """:func:`input_file` for an option given more than once."""
    return [STDIN if path == Path("-") else path for path in paths]


def task_name(value: str | None) -> str | None:
    """``--task`` names a folder level of the store: one that names no folder ('', '..') is a usage error (exit 2)
    before anything runs, not a failure of every row."""
    if value is not None:
        try:
            encode_segment(value)
        except InvalidInputError as e:
            raise typer.BadParameter(str(e)) from e
    return value


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
        list[str] | None,
        _model("--engine-arg", "A vllm.LLM kwarg (repeat).", metavar="KEY=VALUE", callback=key_values),
    ] = None,
    chat_template: Annotated[str | None, _model("--chat-template", "Template file or text.")] = None,
    chat_template_kwarg: Annotated[
        list[str] | None,
        _model("--chat-template-kwarg", "Chat template kwarg (repeat).", metavar="KEY=VALUE", callback=key_values),
    ] = None,
    thinking: Annotated[
        bool | None, _model("--enable-thinking/--disable-thinking", "Thinking switch of the template.")
    ] = None,
    temperature: Annotated[
        float | None,
        _sampling("--temperature", f"Default {DEFAULT_SAMPLING['temperature']} (greedy).", show_default=False),
    ] = None,
    max_tokens: Annotated[
        int | None,
        _sampling("--max-tokens", f"Default {DEFAULT_SAMPLING['max_tokens']}.", show_default=False, min=1),
    ] = None,
    seed: Annotated[int | None, _sampling("--seed", "Sampling seed: the same seed gives the same samples.")] = None,
    top_logprobs: Annotated[
        int | None, _sampling("--top-logprobs", "Candidates kept per position (e.g. of the verdict token).", min=0)
    ] = None,
    logprob_positions: Annotated[
        LogprobPositionsChoice,
        _sampling("--logprob-positions", "Keep candidates for the first generated token, or for every one."),
    ] = LogprobPositionsChoice.first,
    sampling: Annotated[
        list[str] | None,
        _sampling("--sampling", "Another SamplingParams kwarg (repeat).", metavar="KEY=VALUE", callback=key_values),
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
        int | None,
        _hosted("--max-concurrency", "Requests in flight at once (default: JUDGESTORE_MAX_CONCURRENCY, 8).", min=1),
    ] = None,
    timeout: Annotated[
        float | None,
        _hosted(
            "--timeout",
            f"Seconds a request may take, its whole answer (default {DEFAULT_TIMEOUT_S:g}); a slow model's long "
            "answers need more.",
            metavar="SECONDS",
        ),
    ] = None,
    routing: Annotated[
        list[str] | None,
        _hosted(
            "--routing",
            'OpenRouter provider routing (repeat), e.g. order=["x"] allow_fallbacks=false.',
            metavar="KEY=VALUE",
            callback=key_values,
        ),
    ] = None,
) -> ModelSpec | HostedSpec:
    """The model of a ``generate``/``judge`` command line; options left out take the library's defaults."""
    if temperature is not None and not 0 <= temperature < math.inf:  # vLLM refused it, after it had loaded
        raise typer.BadParameter("must be a finite number, 0 or more (0 is greedy)", param_hint="--temperature")
    if timeout is not None and not timeout > 0:  # NaN too
        raise typer.BadParameter("must be a number of seconds above 0", param_hint="--timeout")
    given = {"temperature": temperature, "max_tokens": max_tokens, "seed": seed, "logprobs": top_logprobs}
    flags = {k: v for k, v in given.items() if v is not None}
    extra = parse_key_values(sampling, "--sampling")
    if both := [key for key in flags if key in extra]:  # one would silently win over the other, whatever the order
        options = {"temperature": "--temperature", "max_tokens": "--max-tokens", "seed": "--seed",
                   "logprobs": "--top-logprobs"}  # fmt: skip
        raise InvalidInputError(
            "; ".join(f"{options[key]} and --sampling {key}= both given" for key in both) + ": pass each setting once"
        )
    sampling_kwargs = flags | extra
    if provider is not None:
        engine_only = {"--engine-arg": engine_arg, "--chat-template": chat_template, "--allow-unpinned": allow_unpinned}
        refused = [name for name, value in engine_only.items() if value]
        if refused:
            verb = "applies" if len(refused) == 1 else "apply"
            raise InvalidInputError(f"{', '.join(refused)} {verb} to the in-process engine, not to --provider")
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
            timeout_s=DEFAULT_TIMEOUT_S if timeout is None else timeout,
        )
    hosted_only = {"--base-url": base_url, "--api-key-env": api_key_env, "--routing": routing, "--timeout": timeout}
    if given_hosted := [name for name, value in hosted_only.items() if value]:
        verb = "needs" if len(given_hosted) == 1 else "need"
        raise InvalidInputError(f"{', '.join(given_hosted)} {verb} --provider")
    engine_kwargs = parse_key_values(engine_arg, "--engine-arg")
    if allow_unpinned and Path(model).is_dir():  # a folder is pinned by its files' content: the flag would do nothing
        raise InvalidInputError(
            f"--allow-unpinned: {model} is a local folder, which the descriptor pins by its files' content; "
            "--allow-unpinned is for a Hugging Face model id that cannot be pinned to a commit"
        )
    if revision is not None:
        if Path(model).is_dir():  # vLLM loads the folder as it is: the flag would be recorded and do nothing
            raise InvalidInputError(
                f"--revision {revision}: {model} is a local folder, which has no revisions (the descriptor pins its "
                "files by their content); --revision is for a Hugging Face model id"
            )
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
    shared_batch: bool = False


def run_options(
    task: Annotated[
        str,
        typer.Option(
            "--task", help="Task name: a folder level of the store.", rich_help_panel=RUN_PANEL, callback=task_name
        ),
    ],
    input_path: Annotated[
        Path,
        typer.Option(
            "--input", "-i", help="JSONL file of requests ('-': stdin).", rich_help_panel=RUN_PANEL, callback=input_file
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="JSONL file of results ('-': stdout).", rich_help_panel=RUN_PANEL)
    ] = Path("-"),
    mode: Annotated[
        ModeChoice,
        typer.Option(
            "--mode", help="use | refresh | off | replay (misses are errors) | readonly.", rich_help_panel=RUN_PANEL
        ),
    ] = ModeChoice.use,
    chunk_size: Annotated[
        int,
        typer.Option(
            "--chunk-size",
            help="Write finished generations every N (or every 2 s); the engine gets every miss at once (with "
            "--shared-batch, blocks of N: give it what max_num_seqs takes).",
            rich_help_panel=RUN_PANEL,
            min=1,
        ),
    ] = 64,
    fetch: Annotated[
        bool | None,
        typer.Option(
            "--fetch/--no-fetch",
            help="Fetch this model's folder from the shared remote first (JUDGESTORE_HUB_REPO or JUDGESTORE_SYNC_DIR;"
            " default: JUDGESTORE_FETCH_BEFORE_RUN).",
            rich_help_panel=RUN_PANEL,
        ),
    ] = None,
    shared_batch: Annotated[
        bool,
        typer.Option(
            "--shared-batch",
            help="Share this batch's misses with the other jobs started on the same inputs and store (a SLURM array, "
            "one process per GPU): each generates only the blocks it claims, and every one writes the whole output.",
            rich_help_panel=RUN_PANEL,
        ),
    ] = False,
) -> RunOptions:
    return RunOptions(task, input_path, output, mode.value, chunk_size, fetch, shared_batch)  # type: ignore[arg-type]
