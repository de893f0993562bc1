"""JSONL files of requests and results, as the command line reads and writes them.

Contract:

* Completion request lines: ``{"messages": [...]}`` or ``{"text": "..."}``,
  with optional ``benchmark``, ``instruction_id``, ``n`` (null: 1; 2.0: 2) and
  ``model`` (the label recorded on the row). A file may open with UTF-8's
  byte order mark.
* Judgement lines come in three shapes: already rendered (``messages`` or
  ``text`` plus ``model_a``, which ``judge`` requires, ``model_b``,
  ``orientation`` and, like a
  completion's ``model``, an optional ``judge``: the label recorded on that
  line's row instead of the run's); a pair to judge
  (``question``, ``model_a``, ``answer_a``, ``model_b``, ``answer_b``), which
  becomes one request per orientation asked for; or one answer to rate
  pointwise (``question``, ``model_a``, ``answer_a``, no ``model_b``).
* A bad line raises :class:`~store.errors.InvalidInputError` naming the file
  and line; nothing is generated before the whole file has parsed. An
  integer ``benchmark``, ``instruction_id`` or model name (MT-Bench's
  ``question_id``) is read as its decimal text, which is what the row keeps,
  every digit of it (past 64 bits too).
* Result lines carry the request's metadata, the text (sample 0), every
  sample when ``n > 1``, logprobs, finish reason, usage (sample 0's),
  ``cached`` (every sample a hit) and ``error`` (the first failed sample's):
  null for an answer; for a request that failed (nothing of it
  stored), ``{"type": ..., "message": ...}``, its typed reason on one line.
  A failed sample's ``completion`` (and ``top_logprobs``) is null. NaN and
  infinities in ``usage`` and ``top_logprobs`` (vLLM's ``-inf`` logprob of a
  masked token) are the tag ``{"$float": "-Infinity"}``, as ``query`` and
  ``export`` write them (JSON has no number for them; orjson wrote null).
* :func:`make_pairs` refuses an answers file whose line for a prompt is an
  error: judging a failure would judge nothing.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import orjson

from inference.judging import pairwise_requests, pointwise_request
from inference.requests import CompletionRequest, JudgementRequest, Response, Sample
from store.caller import warn_the_caller
from store.descriptor import InputMode, input_hash, render_messages_bytes, render_text_bytes
from store.errors import InvalidInputError, JudgestoreError
from store.jsonvalues import to_plain
from store.tables.models import Orientation

_REQUEST_KEYS = {"messages", "text", "benchmark", "instruction_id", "n"}
_RENDERED_JUDGEMENT_KEYS = _REQUEST_KEYS | {"model_a", "model_b", "judge", "orientation"}
_PAIR_KEYS = {"question", "model_a", "answer_a", "model_b", "answer_b", "benchmark", "instruction_id"}
_TEXT_KEYS = ("benchmark", "instruction_id", "model", "model_a", "model_b", "judge")  # kept as text (docstring)


def read_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a bad line names file and line."""
    try:
        handle = path.open("rb")
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot read ({e.strerror})") from e
    with handle:
        for number, line in enumerate(handle, 1):
            if number == 1:  # a byte order mark (Windows PowerShell's and Notepad's UTF-8) is no JSON: refused (was)
                line = line.removeprefix(codecs.BOM_UTF8)
            if not line.strip():
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                try:
                    line.decode()
                except UnicodeDecodeError as bad:  # orjson's words would speak of surrogates and column 1
                    raise InvalidInputError(
                        f"{path}:{number}: not UTF-8 text (byte {line[bad.start]:#04x} at byte {bad.start + 1} of the "
                        "line); save the file as UTF-8"
                    ) from e
                if "infinity" not in e.msg:  # orjson's "number is infinity when parsed as double", no other
                    said = f"{e.msg} at character {e.pos + 1}"
                    raise InvalidInputError(f"{path}:{number}: not valid JSON ({said})") from e
                value = _exact_integers(path, number, line)  # past a double's range: valid JSON orjson cannot hold
            if not isinstance(value, dict):
                raise InvalidInputError(f"{path}:{number}: each line must be a JSON object")
            if any(type(value.get(key)) is float for key in _TEXT_KEYS):
                value = _exact_integers(path, number, line)
            for key in _TEXT_KEYS:
                if type(value.get(key)) is int:
                    value[key] = str(value[key])
            yield number, value


def _exact_integers(path: Path, number: int, line: bytes) -> Any:
    """A line read again with integers kept whole: orjson reads one past 64 bits as a float, which would lose digits,
    and refuses one past a double's range (was: "not valid JSON" of a 400-digit id)."""
    try:
        return json.loads(line, parse_constant=_no_constant)
    except (_NotJson, json.JSONDecodeError) as e:
        raise InvalidInputError(f"{path}:{number}: not valid JSON ({e})") from e
    except ValueError as e:  # an integer of more digits than Python converts
        raise InvalidInputError(f"{path}:{number}: {e}; give a long id as text") from e


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJson(f"{name} is no JSON value")


def _build(path: Path, number: int, factory: Any, values: dict[str, Any], input_mode: InputMode | None) -> Any:
    """What ``factory`` makes of a line's values (a request, or a list of them); a bad line names itself."""
    n = values.get("n", 1)
    if n is None:  # a table's empty cell (pandas writes null): the default, one sample
        values = {key: value for key, value in values.items() if key != "n"}
    elif isinstance(n, float) and n.is_integer():  # the column's other cells then (pandas writes 2.0)
        values = {**values, "n": int(n)}
    try:
        if "messages" in values:
            render_messages_bytes(values["messages"])  # checked here too, so a bad message names its line
        if "text" in values:
            render_text_bytes(values["text"])
        built = factory(**values)
        if input_mode is not None:
            for request in built if isinstance(built, list) else [built]:
                request.check_shape(input_mode)
        source = f"{path}:{number}"
        if isinstance(built, list):
            return [replace(request, source=source) for request in built]
        return replace(built, source=source)
    except (InvalidInputError, TypeError) as e:
        raise InvalidInputError(f"{path}:{number}: {e}") from e


def _check_keys(path: Path, number: int, row: dict[str, Any], allowed: set[str], hint: str = "") -> None:
    unknown = set(row) - allowed
    if unknown:
        raise InvalidInputError(f"{path}:{number}: unknown keys {sorted(unknown)} (allowed: {sorted(allowed)}){hint}")


def read_completion_requests(path: Path, input_mode: InputMode | None = None) -> list[CompletionRequest]:
    """Completion requests, one per line; with ``input_mode``, a line of the other shape is refused by name."""
    requests = []
    for number, row in read_lines(path):
        judged = set(row) & (_PAIR_KEYS | _RENDERED_JUDGEMENT_KEYS) - _REQUEST_KEYS
        hint = "; a line to judge is read by `judgestore judge` (and `explain --role judgements`)" if judged else ""
        _check_keys(path, number, row, _REQUEST_KEYS | {"model"}, hint)
        requests.append(_build(path, number, CompletionRequest, row, input_mode))
    return requests


class OrientationUnusedWarning(UserWarning):
    """Orientations were asked for, but the file has no pair line for them to apply to."""


class UnpairedAnswersWarning(UserWarning):
    """Answers to prompts the prompts file does not hold: ``pairs`` leaves them out."""


class FirstSampleWarning(UserWarning):
    """``pairs`` met answers of several samples (``n`` > 1): it pairs each line's first, its ``completion``."""


def read_judgement_requests(
    path: Path,
    orientations: Sequence[Orientation] | None = None,
    judge: str | None = None,
    input_mode: InputMode | None = None,
    *,
    to_store: bool = False,
) -> list[JudgementRequest]:
    """Judgement requests from rendered, pair or pointwise lines (see the module docstring); with ``input_mode``,
    a line whose requests a judge of that mode cannot take is refused by name. ``to_store`` (``judge``, whose
    verdicts become rows) refuses a rendered line without ``model_a``: its row would name no model.

    ``orientations`` are those of each pair line (None: both); asked for on a file without a pair line, they change
    nothing, and an :class:`OrientationUnusedWarning` says so.
    """
    requests: list[JudgementRequest] = []
    pair_lines = 0
    asked: Sequence[Orientation] = ("direct", "reversed") if orientations is None else orientations
    for number, row in read_lines(path):
        if "messages" in row or "text" in row:
            _check_keys(path, number, row, _RENDERED_JUDGEMENT_KEYS)
            request = _build(path, number, JudgementRequest, {"judge": judge, **row}, input_mode)
            if to_store and request.model_a is None:  # a prompts file given to judge: its verdicts would name no model
                raise InvalidInputError(
                    f"{path}:{number}: a judge conversation needs model_a (the model whose answer it shows first; "
                    "model_b for a pair); a line of only a prompt is read by `judgestore generate`"
                )
            requests.append(request)
            continue
        _check_keys(path, number, row, _PAIR_KEYS)
        if input_mode == "text":  # was: "give `text`, not `messages`", of a line that has neither
            raise InvalidInputError(
                f"{path}:{number}: a pair or pointwise line is judged as chat messages (the judge prompt is built "
                "from it), which a judge of --input-mode text does not take: give judge conversations with `text`, "
                "or --input-mode chat"
            )
        missing = {"question", "model_a", "answer_a"} - set(row)
        if row.get("model_b") is not None:
            missing |= {"answer_b"} - set(row)
        if missing:
            raise InvalidInputError(f"{path}:{number}: missing keys {sorted(missing)}")
        for key in ("question", "model_a", "answer_a", "model_b", "answer_b"):
            if key in row and not isinstance(row[key], str) and (row[key] is not None or key != "model_b"):
                raise InvalidInputError(f"{path}:{number}: {key} must be a string, got {row[key]!r:.40}")
        if row.get("model_b") is None and "answer_b" in row:  # a pair whose second model is not named
            raise InvalidInputError(
                f"{path}:{number}: answer_b without model_b: name the model of answer_b (a pointwise line has neither)"
            )
        if row.get("model_b") is None:
            requests.append(
                _build(
                    path,
                    number,
                    pointwise_request,
                    {
                        "question": row["question"],
                        "model": row["model_a"],
                        "answer": row["answer_a"],
                        "benchmark": row.get("benchmark"),
                        "instruction_id": row.get("instruction_id"),
                        "judge": judge,
                    },
                    input_mode,
                )
            )
        else:
            pair_lines += 1
            requests.extend(
                _build(path, number, pairwise_requests, {**row, "orientations": asked, "judge": judge}, input_mode)
            )
    if orientations is not None and requests and not pair_lines:
        warn_the_caller(
            f"{path} has no pair lines, so the orientations asked for ({', '.join(orientations)}) change nothing: "
            "a rendered line carries its own orientation, and a pointwise one has none",
            OrientationUnusedWarning,
        )
    return requests


def response_row(response: Response, label: str | None = None) -> dict[str, Any]:
    """One result line: the request's metadata, then what was generated or found.

    ``label`` is the name of the model that answered (recorded as ``model`` or
    ``judge`` when the request does not name one).
    """
    request = response.request
    row: dict[str, Any] = {"benchmark": request.benchmark, "instruction_id": request.instruction_id}
    if isinstance(request, JudgementRequest):
        row |= {
            "model_a": request.model_a,
            "model_b": request.model_b,
            "judge": request.judge or label,
            "orientation": request.orientation,
        }
    else:
        row["model"] = request.model or label
    first = response.samples[0]
    row |= {
        "input_hash": first.input_hash,
        "completion": _completion(first),
        "finish_reason": first.finish_reason,
        "usage": to_plain(_ordered(first.usage)),  # as a hit's reads back from the store: a rerun's line is the same
        "top_logprobs": None if first.error is not None else to_plain(first.top_logprobs),
        "cached": response.cached,
        "error": _error(response.error),
    }
    if len(response.samples) > 1:  # each with what the top level gives of the first (they are stored alike)
        row["samples"] = [
            {
                "sample_index": s.sample_index,
                "completion": _completion(s),
                "finish_reason": s.finish_reason,
                "usage": to_plain(_ordered(s.usage)),
                "top_logprobs": None if s.error is not None else to_plain(s.top_logprobs),
                "cached": s.cached,
                "error": _error(s.error),
            }
            for s in response.samples
        ]
    return row


def _ordered(value: Any) -> Any:
    """``value`` with the keys of every object in sorted order (the store keeps JSON canonical, so hits read so)."""
    if isinstance(value, dict):
        return {key: _ordered(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_ordered(item) for item in value]
    return value


def _completion(sample: Sample) -> str | None:
    """The text; None for a failed sample (even one generated and refused by the store: it may not be JSON text)."""
    return None if sample.error is not None else sample.text


def _error(error: JudgestoreError | None) -> dict[str, str] | None:
    return None if error is None else {"type": type(error).__name__, "message": " ".join(str(error).split())}


def write_responses(out: IO[bytes], responses: Iterable[Response], label: str | None = None) -> int:
    count = 0
    for response in responses:
        out.write(orjson.dumps(response_row(response, label)) + b"\n")
        count += 1
    return count


def _question(request: CompletionRequest) -> str:
    """What the judge is shown as the question: a text prompt, or a chat's one user message; a chat of more
    messages (a system prompt, earlier turns) as its whole transcript, ``Role: content`` per message, so the
    judge reads the answers in the context the models had (its last user message alone dropped the rest)."""
    if request.text is not None:
        return request.text
    messages = orjson.loads(request.render_bytes("chat"))["messages"]  # checked: {role, content} strings, not empty
    if len(messages) == 1:
        return str(messages[0]["content"])
    return "\n\n".join(f"{str(m['role']).capitalize()}: {m['content']}" for m in messages)


def make_pairs(prompts: Path, answers: Sequence[Path]) -> list[dict[str, Any]]:
    """Pair lines for every two models' answers to every prompt, joined on (benchmark, instruction_id).

    ``answers`` are result files of ``judgestore generate`` (one model each).
    The join key must name one prompt: prompts that share it (no ids at all,
    or the turns of one question) and a model answering one key twice raise,
    since joining them would pair a question with another one's answers. So
    does an answer whose ``input_hash`` is not its prompt's (the prompt was
    edited after that model answered it). A prompt that a model did not answer
    raises: judging half a benchmark silently would bias the comparison.
    """
    named = [path for path in answers if str(path) != "-"]
    for i, path in enumerate(named):  # was: "answers ... a second time", of its own first line
        if any(path.exists() and other.exists() and path.samefile(other) for other in named[:i]):
            raise InvalidInputError(f"{path} is given twice as --answers: give each model's answers once")
    # model -> (benchmark, instruction_id) -> (completion, file, line, input_hash)
    by_model: dict[str, dict[tuple[Any, Any], tuple[str, Path, int, Any]]] = {}
    files: dict[str, set[Path]] = {}  # model -> the answers files holding its lines
    sampled: list[str] = []  # lines answering with several samples (n > 1), as path:number
    for path in answers:
        for number, row in read_lines(path):
            model, key = row.get("model"), (row.get("benchmark"), row.get("instruction_id"))
            if not isinstance(model, str) or "completion" not in row:
                raise InvalidInputError(f"{path}:{number}: not a result line (needs model and completion)")
            if row.get("error"):
                error = row["error"]
                reason = f"{error.get('type')}: {error.get('message')}" if isinstance(error, dict) else error
                raise InvalidInputError(
                    f"{path}:{number}: {model} failed on this request ({reason}); run generate again once it is "
                    "fixed, or drop the prompt"
                )
            if not isinstance(row["completion"], str):
                raise InvalidInputError(f"{path}:{number}: completion must be a string, got {row['completion']!r:.40}")
            answered = by_model.setdefault(model, {})
            if key in answered and answered[key][1] != path:  # two models run under one name (two folders `tiny`)
                raise InvalidInputError(
                    f"{path}:{number}: {answered[key][1]} and {path} both answer benchmark={key[0]!r} "
                    f"instruction_id={key[1]!r} as {model!r}: two models run under one name (give each its own "
                    '--label when it runs generate, and no "model" in the prompt lines, which names a line\'s '
                    "answer instead: pairs tells the models apart by it), or one model's answers given twice"
                )
            if key in answered:
                raise InvalidInputError(
                    f"{path}:{number}: {model} answers benchmark={key[0]!r} instruction_id={key[1]!r} a second "
                    "time; pairs joins answers to prompts on these ids, so each must name one prompt"
                )
            answered[key] = (row["completion"], path, number, row.get("input_hash"))
            files.setdefault(model, set()).add(path)
            if isinstance(row.get("samples"), list) and len(row["samples"]) > 1:
                sampled.append(f"{path}:{number}")
    if sampled:  # the others were dropped without a word (was)
        warn_the_caller(
            f"{len(sampled)} answer line{'s hold' if len(sampled) > 1 else ' holds'} several samples (n > 1; first "
            f"{sampled[0]}): each is paired by its first sample, its completion; the others are not judged",
            FirstSampleWarning,
        )
    if len(by_model) < 2:
        raise InvalidInputError(f"answers of at least two models are needed, found {sorted(by_model)}")
    pairs = []
    models = sorted(by_model)
    seen: set[tuple[Any, Any]] = set()
    for request in read_completion_requests(prompts):
        key = (request.benchmark, request.instruction_id)
        if key in seen:
            raise InvalidInputError(
                f"{prompts}: two prompts share benchmark={key[0]!r} instruction_id={key[1]!r}; pairs joins answers "
                "to prompts on these ids, so give each prompt (each turn) its own instruction_id"
            )
        seen.add(key)
        prompt_hash = input_hash(request.render_bytes("chat" if request.messages is not None else "text"))
        for model in models:
            if key not in by_model[model]:
                raise InvalidInputError(
                    f"{model} ({', '.join(sorted(map(str, files[model])))}) has no answer for {prompts}'s "
                    f"{request.describe()}: run generate on the prompts it lacks, or drop the prompt"
                )
            _, path, number, answer_hash = by_model[model][key]
            if answer_hash is not None and answer_hash != prompt_hash:  # a hand-made line may not carry one
                raise InvalidInputError(
                    f"{path}:{number}: {model} answered another prompt than {prompts}'s {request.describe()} (its "
                    "input_hash is not the prompt's: was the prompt edited since?); run generate again on these "
                    "prompts, or pair the prompts file it answered"
                )
        for i, model_a in enumerate(models):
            for model_b in models[i + 1 :]:
                pairs.append(
                    {
                        "question": _question(request),
                        "benchmark": request.benchmark,
                        "instruction_id": request.instruction_id,
                        "model_a": model_a,
                        "answer_a": by_model[model_a][key][0],
                        "model_b": model_b,
                        "answer_b": by_model[model_b][key][0],
                    }
                )
    unpaired = [(path, number) for answered in by_model.values() for key, (_, path, number, _) in answered.items()
                if key not in seen]  # fmt: skip
    if unpaired:  # judging a subset is fine; an empty or wrong prompts file dropped every answer unsaid (was)
        path, number = min(unpaired)
        warn_the_caller(
            f"{len(unpaired)} answer line{'s name' if len(unpaired) > 1 else ' names'} no prompt of {prompts} "
            f"(first {path}:{number}) and {'are' if len(unpaired) > 1 else 'is'} not paired",
            UnpairedAnswersWarning,
        )
    return pairs
