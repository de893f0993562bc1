"""Why a run missed: the descriptor it asked for against the stored ones, and each missing input against stored rows.

Contract:

* :func:`descriptor_changes` lists, field by field (dotted paths such as
  ``sampling.temperature``), how a stored descriptor differs from the one a
  run asks for: ``stored -> wanted``.
* :func:`explain_descriptor` says whether the run's database exists and how
  many rows it holds, and lists the stored descriptors of the same role and
  model (any task), nearest first (fewest differing fields, then most rows),
  each with its differences (the task is one too) and row count: the
  nearest differs in the fewest descriptor fields (then: the same task, then
  the most rows).
* :func:`explain_inputs` takes the plan of a batch (:meth:`CachedModel.plan
  <inference.cache.model.CachedModel.plan>`) and, for each missing input, finds
  why: a sample index beyond those stored; the same input stored under
  another descriptor; else the stored row with the same
  ``benchmark``/``instruction_id``, or the nearest rendered input among at
  most ``scan`` rows, with a compact diff of the rendered inputs
  (:func:`input_diffs`: which message, which characters).
* Everything here reads: the store is opened read-only by callers, the engine
  is never prepared, and vLLM is never imported.
* :func:`explain_command_line` turns a ``generate``/``judge`` command line
  into the ``judgestore explain`` command that explains it.
"""

from __future__ import annotations

import difflib
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

import orjson

from inference.cache.plan import Plan
from inference.requests import Request, request_named
from store import Database, Store
from store.descriptor import LOCAL_DIGEST_PREFIX, ModelDescriptor, input_hash
from store.errors import JudgestoreError
from store.layout import Location, Selector
from store.roles import Role
from store.tables.filters import RowFilter
from store.tables.records import Record

EXCERPT = 30  # characters shown on each side of a difference
MAX_EDITS = 3  # edits listed per differing message


# ---------------------------------------------------------------- descriptors


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One field that differs: its dotted path, the stored value and the one asked for (None: absent or null).
    Where both are None, one side holds null and the other lacks the setting: ``absent`` names the one that lacks
    it (``"stored"`` or ``"wanted"``); elsewhere it is None."""

    field: str
    stored: Any
    wanted: Any
    absent: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """``field``, ``stored`` and ``wanted``, and ``absent`` where it is set (``--json``'s change)."""
        shown = {"field": self.field, "stored": self.stored, "wanted": self.wanted}
        return shown if self.absent is None else shown | {"absent": self.absent}

    def text(self, width: int = 16) -> str:
        if self.stored is None and self.wanted is None:  # a setting given as null on one side, absent on the other
            return f"{self.field} (absent) -> null" if self.absent == "stored" else f"{self.field} null -> (absent)"
        stored, wanted = _shown(self.stored), _shown(self.wanted)
        # where they first differ; one the other's prefix: where the shorter ends
        at = next((i for i, (a, b) in enumerate(zip(stored, wanted, strict=False)) if a != b), None)
        at = min(len(stored), len(wanted)) if at is None else at
        return f"{self.field} {_short(self.stored, width, at)} -> {_short(self.wanted, width, at)}"


def _shown(value: Any) -> str:
    return "(none)" if value is None else value if isinstance(value, str) else orjson.dumps(value).decode()


def _short(value: Any, width: int, at: int = 0) -> str:
    """``value`` shown, a long one cut to ``width`` characters around ``at``, where it first differs from the other
    side's (two long values alike in their first characters were shown as the same text)."""
    text = _shown(value)
    hexlike = isinstance(value, str) and len(value) > width and all(c in "0123456789abcdef:sha256" for c in value)
    if hexlike:
        return text[:width] + "…"
    if len(text) <= 3 * width:
        return text
    start = max(0, min(at - width // 2, len(text) - width))
    return ("…" if start else "") + text[start : start + width] + ("…" if start + width < len(text) else "")


_KEY_ORDER = "(key order)"


def _flatten(value: Any, prefix: str = "", depth: int = 0) -> dict[str, Any]:
    """Leaves by dotted path; a field's empty mapping has none (so ``engine`` ``{}`` -> ``{"dtype": ..}`` is one
    added leaf), an empty object inside a setting's value (depth 2 on) is a leaf ``{}`` of its own (not absent:
    :func:`descriptor_changes` leaves it out where the other side has keys under it), a list holding objects or
    lists has its items' (``tools.0.name``). An object inside a setting's value, whose key order the hash keeps,
    also has its keys, in order, as the leaf ``PATH.(key order)``."""
    if isinstance(value, Mapping):
        flat: dict[str, Any] = {}
        if depth >= 2 and not value:  # a setting's empty object is a value of its own: {} is not absent
            return {prefix.rstrip("."): {}}
        if depth >= 2 and len(value) > 1:
            flat[prefix + _KEY_ORDER] = list(value)
        for key in sorted(value):
            flat |= _flatten(value[key], f"{prefix}{key}.", depth + 1)
        return flat
    if isinstance(value, list) and any(isinstance(item, Mapping | list) for item in value):  # tools: their objects
        flat = {}
        for i, item in enumerate(value):
            flat |= _flatten(item, f"{prefix}{i}.", depth + 1)
        return flat
    return {prefix.rstrip("."): value}


def _reordered(old: list[str] | None, new: list[str] | None) -> bool:
    """Whether an object's keys come in another order: the keys both sides hold, in each side's order (a key added
    or dropped is a change of its own leaf, not of the order)."""
    if old is None or new is None:
        return False
    return [key for key in old if key in new] != [key for key in new if key in old]


def descriptor_changes(stored: ModelDescriptor, wanted: ModelDescriptor) -> list[FieldChange]:
    """How ``stored`` differs from ``wanted``, field by field (``0`` and ``0.0`` are equal, as in the hash; ``true``
    and ``1``, a null and an absent setting, and two key orders of an object inside a setting are not: ``PATH.(key
    order)``). ``format`` is left out: it follows from the settings (a key order that counts), whose change is
    listed. Two descriptors the hash tells apart always differ in something listed: where no path names it (or a
    key holding a dot makes paths ambiguous), :data:`DESCRIPTOR_FIELD`, which no ``--across`` allows."""
    old, new = _flatten(stored.model_dump(mode="json")), _flatten(wanted.model_dump(mode="json"))
    changes = []
    for name in sorted((old.keys() | new.keys()) - {"format"}):
        if name.endswith(_KEY_ORDER):
            differs = _reordered(old.get(name), new.get(name))
        elif _filled(name, old, new) or _filled(name, new, old):
            differs = False  # {} on one side, keys under it on the other: those keys are the changes
        else:
            differs = not _alike(old.get(name, _ABSENT), new.get(name, _ABSENT))
        if differs:
            nulls = old.get(name) is None and new.get(name) is None  # a null on one side, absent on the other
            absent = ("stored" if name not in old else "wanted") if nulls else None
            changes.append(FieldChange(name, old.get(name), new.get(name), absent))
    if stored.sha256() != wanted.sha256() and (not changes or _dotted(stored) or _dotted(wanted)):
        # Keyed apart by something the dotted paths cannot name (a key holding a dot reads as another's path):
        # never "no difference", nor only the differences named, which adopt would take for ones --across allows
        changes.append(FieldChange(DESCRIPTOR_FIELD, stored.sha256(), wanted.sha256()))
    return changes


def _filled(name: str, side: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether ``side`` holds ``{}`` at ``name`` where ``other`` holds keys under it (an object that gained keys)."""
    return side.get(name, _ABSENT) == {} and any(key.startswith(name + ".") for key in other)


def _dotted(descriptor: ModelDescriptor) -> bool:
    """Whether a key inside a setting's value holds a dot (its path could be another's)."""

    def walk(value: Any) -> bool:
        if isinstance(value, Mapping):
            return any("." in str(key) or walk(item) for key, item in value.items())
        return isinstance(value, list) and any(walk(item) for item in value)

    dumped = descriptor.model_dump(mode="json")
    return any(walk(dumped[name]) for name in ("sampling", "engine", "chat_template_kwargs", "routing"))


_ABSENT = object()
DESCRIPTOR_FIELD = "(descriptor)"  # the change of two descriptors no field names; no --across allows it


def _alike(a: Any, b: Any) -> bool:
    """Equal as the hash sees them: 0 and 0.0 are, true and 1 are not (JSON writes them apart), a null is not an
    absent setting."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_alike(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@dataclass(frozen=True)
class Neighbour:
    """A stored descriptor of the same role and model, and how it differs from the one asked for."""

    location: Location
    rows: int | None  # None: the database could not be opened (error says why)
    changes: tuple[FieldChange, ...]  # empty when its descriptor could not be read
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**self.location.as_dict(), "rows": self.rows, "changes": [c.as_dict() for c in self.changes],
                "error": self.error}  # fmt: skip


@dataclass(frozen=True)
class DescriptorReport:
    """The run's database (does it exist, how many rows) and the stored descriptors nearest to it."""

    location: Location
    descriptor: ModelDescriptor
    exists: bool
    rows: int
    neighbours: tuple[Neighbour, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.location.as_dict(),
            "exists": self.exists,
            "rows": self.rows,
            "neighbours": [n.as_dict() for n in self.neighbours],
        }


def _rows(database: Database | None) -> int:
    return 0 if database is None else database.count()


def _nearness(n: Neighbour) -> tuple[bool, int, bool, int, str]:
    """Readable first, then fewest descriptor fields changed, the same task, most rows."""
    other_task = any(c.field == "task" for c in n.changes)
    fields = len(n.changes) - other_task
    return (n.error is not None, fields, other_task, -(n.rows or 0), n.location.descriptor_hash16)


def _same_model(stored: str, wanted: str) -> bool:
    """Whether a stored descriptor's model may be the run's: its name, or a path to a folder of that name (0.1.0
    named a local folder by the path given: `/models/tiny`, `models/tiny`, `tiny/`; its name since, so those rows
    missed from then on). A Hub id spelled alike (`org/tiny`) is told apart by its revision, once read."""
    return stored == wanted or ("/" in stored and PurePosixPath(stored.rstrip("/")).name == wanted)


def explain_descriptor(store: Store, role: Role, task: str, descriptor: ModelDescriptor) -> DescriptorReport:
    """See the module docstring; reads metadata.json files and counts rows, nothing else. Every neighbour is
    listed (the first five were, and a miss stored under a sixth was said to be stored nowhere: was)."""
    location = Location.of(role, task, descriptor)
    database = store.find(role, task, descriptor)
    neighbours = []
    local = descriptor.revision is not None and descriptor.revision.startswith(LOCAL_DIGEST_PREFIX)
    # A local folder's: also the descriptors judgestore 0.1.0 named it in, by the path it was given
    selector = Selector(role=location.role, provider=location.provider, model=None if local else location.model)
    for other in store.select(selector):
        if other == location or not _same_model(other.model, location.model):
            continue
        changes: list[FieldChange] = []  # unknown (empty) until its descriptor is read
        try:
            # The descriptor before the database: one whose schema is behind (or ahead) still says what it differs
            # in, beside why its rows cannot be read (adopt then names it, not "none differs")
            stored = store.stored_metadata(other).descriptor
            if other.model != location.model and not (stored.revision or "").startswith(LOCAL_DIGEST_PREFIX):
                continue  # a Hub model whose id ends in the folder's name: another model
            changes = descriptor_changes(stored, descriptor)
            if other.task != task:
                changes.insert(0, FieldChange("task", other.task, task))
            neighbours.append(Neighbour(other, store.open(other).count(), tuple(changes)))
        except JudgestoreError as e:  # what it differs in is kept when only counting its rows failed
            neighbours.append(Neighbour(other, None, tuple(changes), str(e)))
    neighbours.sort(key=_nearness)
    return DescriptorReport(location, descriptor, database is not None, _rows(database), tuple(neighbours))


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class InputDiff:
    """One place where two rendered inputs differ, with excerpts around its first differing character."""

    where: str  # "message 1 (user) content", "message 2", "input type", "text"
    position: int | None  # first differing character of that part, when both have it
    stored: str
    wanted: str
    edits: tuple[str, ...] = ()  # e.g. "replace 'joke' -> 'story' at 8"

    def text(self) -> str:
        at = "" if self.position is None else f" at character {self.position}"
        edits = f" ({'; '.join(self.edits)})" if self.edits else ""
        return f"{self.where}{at}: {self.stored!r} -> {self.wanted!r}{edits}"


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _excerpt(text: str, position: int) -> str:
    start, end = max(position - EXCERPT, 0), position + EXCERPT
    return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")


def _edits(a: str, b: str) -> tuple[str, ...]:
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    edits = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        old, new = _short(a[i1:i2], 20), _short(b[j1:j2], 20)
        edits.append({"replace": f"replace {old!r} -> {new!r}", "delete": f"delete {old!r}",
                      "insert": f"insert {new!r}"}[tag] + f" at {i1}")  # fmt: skip
    return tuple(edits[:MAX_EDITS]) + ((f"{len(edits) - MAX_EDITS} more",) if len(edits) > MAX_EDITS else ())


def _text_diff(where: str, a: str, b: str) -> InputDiff:
    position = _first_difference(a, b)
    return InputDiff(where, position, _excerpt(a, position), _excerpt(b, position), _edits(a, b))


def input_diffs(stored: str, wanted: str) -> list[InputDiff]:
    """Where the rendered input ``wanted`` differs from ``stored``: which message, which characters."""
    old, new = orjson.loads(stored), orjson.loads(wanted)
    if old.get("type") != new.get("type"):
        return [InputDiff("input type", None, str(old.get("type")), str(new.get("type")))]
    if new.get("type") == "text":
        return [] if old["text"] == new["text"] else [_text_diff("text", old["text"], new["text"])]
    diffs = []
    before, after = old.get("messages", []), new.get("messages", [])
    for i in range(max(len(before), len(after))):
        if i >= len(before) or i >= len(after):
            present = after[i] if i >= len(before) else before[i]
            side = "wanted" if i >= len(before) else "stored"
            diffs.append(InputDiff(f"message {i} ({present['role']}) only in the {side} input", None,
                                   "" if side == "wanted" else _excerpt(present["content"], 0),
                                   "" if side == "stored" else _excerpt(present["content"], 0)))  # fmt: skip
            continue
        a, b = before[i], after[i]
        if a["role"] != b["role"]:
            diffs.append(InputDiff(f"message {i} role", None, a["role"], b["role"]))
        if a["content"] != b["content"]:
            diffs.append(_text_diff(f"message {i} ({b['role']}) content", a["content"], b["content"]))
    return diffs


@dataclass(frozen=True)
class MissExplanation:
    """Why one (request, sample) missed."""

    request_index: int
    request: str  # benchmark/instruction id, or the start of the prompt
    sample_index: int
    input_hash: str
    reason: str
    nearest: str | None = None  # input hash of the stored row compared with
    similarity: float | None = None
    diffs: tuple[InputDiff, ...] = ()
    stored_under: tuple[str, ...] = ()  # other descriptors (hash16) holding this very input
    source: str | None = None  # where the request was read from (``prompts.jsonl:5``), if from a file

    def named(self) -> str:
        """The request for people: where it was read from, else its index (``request 3``)."""
        return request_named(self.source, self.request_index)

    def as_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["diffs"] = [asdict(d) for d in self.diffs]
        return values


@dataclass(frozen=True)
class InputReport:
    """The plan of a batch, and why (some of) its misses missed."""

    requested: int
    distinct: int
    hits: int
    misses: int
    explained: tuple[MissExplanation, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "distinct": self.distinct,
            "hits": self.hits,
            "misses": self.misses,
            "explained": [m.as_dict() for m in self.explained],
        }


def _said(rendered: str) -> str:
    """What a rendered input says, without the JSON around it: similarity is of what was said (two unrelated
    prompts shared the rendering's keys, and read "72% similar": was)."""
    try:
        value = orjson.loads(rendered)
        if value.get("type") == "text":
            return str(value["text"])
        # Each message its own, delimited by what no text says: a conversation flattened into one message
        # ("Hi\nassistant: ok\nuser: more") read the same as the three messages, "100% similar" (was)
        return "".join(f"\x00{m.get('role')}\x00{m.get('content')}" for m in value["messages"])
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):  # not a rendering of ours: as it is
        return rendered


def _nearest(wanted: str, candidates: Iterable[Record]) -> tuple[Record, float] | None:
    """The candidate whose rendered input is most similar to ``wanted`` in what it says (:func:`_said`; a cheap
    bound first, then the real ratio)."""
    matcher = difflib.SequenceMatcher(None, autojunk=False)
    matcher.set_seq2(_said(wanted))  # what the matcher indexes, once
    scored = []
    for record in candidates:
        said = _said(record.input_text)
        matcher.set_seq1(said)
        scored.append((matcher.quick_ratio(), said, record))
    scored.sort(key=lambda item: item[0], reverse=True)
    best: tuple[Record, float] | None = None
    for _, said, record in scored[:5]:
        matcher.set_seq1(said)
        ratio = matcher.ratio()
        if best is None or ratio > best[1]:
            best = (record, ratio)
    return best


def explain_inputs(
    store: Store,
    role: Role,
    task: str,
    descriptor: ModelDescriptor,
    plan: Plan,
    requests: Sequence[Request],
    *,
    neighbours: Sequence[Location] = (),
    limit: int = 10,
    scan: int = 2000,
) -> InputReport:
    """Explain up to ``limit`` of ``plan``'s misses (see the module docstring)."""
    database = store.find(role, task, descriptor)
    missing = plan.missing[:limit]
    elsewhere: dict[str, list[Location]] = {}
    for location in neighbours:
        try:
            found = store.open(location).get_many(m.key for m in missing)
        except JudgestoreError:
            continue
        for key in found:
            elsewhere.setdefault(key, []).append(location)
    sample = None
    explained = []
    for miss in missing:
        request = requests[miss.request_index]
        wanted = miss.rendered.decode()
        base = MissExplanation(
            miss.request_index, request.describe(), miss.sample_index, miss.key, "", source=request.source
        )
        if holders := elsewhere.get(miss.key):
            # The task is part of where a row is kept, not of its descriptor: "stored under descriptor X, not this
            # one" named this very descriptor when only the task differed (was)
            named = ", ".join(h.descriptor_hash16 + ("" if h.task == task else f" (task {h.task})") for h in holders)
            under = tuple(h.descriptor_hash16 for h in holders)
            explained.append(_with(base, f"this input is stored under descriptor {named}, not this run's",
                                   stored_under=under))  # fmt: skip
            continue
        if database is None:
            explained.append(_with(base, "nothing is stored under this descriptor"))
            continue
        if miss.sample_index > 0 and database.get_many([input_hash(miss.rendered)]):
            explained.append(_with(base, f"sample {miss.sample_index} of this input was never generated (fewer "
                                         "samples are stored); it will be generated"))  # fmt: skip
            continue
        candidates: list[Record] = []
        how = ""
        if request.benchmark is not None and request.instruction_id is not None:
            flt = RowFilter(benchmark=request.benchmark, instruction_id=request.instruction_id)
            candidates, how = list(database.query(flt, limit=50)), "the stored row of the same benchmark/instruction"
        if not candidates:
            if sample is None:
                sample = list(database.query(limit=scan))
            candidates, how = sample, f"the nearest stored input (of {len(sample)} read)"
        nearest = _nearest(wanted, candidates)
        if nearest is None:
            explained.append(_with(base, "no stored row to compare with"))
            continue
        record, ratio = nearest
        diffs = tuple(input_diffs(record.input_text, wanted))
        # Rounded down: one character changed in a long prompt read "100% similar" (was)
        reason = f"{how} ({math.floor(round(100 * ratio, 6))}% similar) has another rendered input"  # 57.999...: 58
        if not diffs:
            reason = f"{how} has the same rendered input but sample {record.sample_index}"
        explained.append(_with(base, reason, nearest=record.input_hash, similarity=round(ratio, 4), diffs=diffs))
    return InputReport(plan.requested, plan.distinct, plan.hits, plan.misses, tuple(explained))


def _with(base: MissExplanation, reason: str, **values: Any) -> MissExplanation:
    return MissExplanation(**{**asdict(base), "diffs": (), "reason": reason, **values})


# ---------------------------------------------------------------- the hint of generate / judge

# What generate and judge take and explain does not (tests/inference/test_explain.py compares them with the app)
_RUN_ONLY_WITH_VALUE = ("-o", "--output", "--mode", "--chunk-size")
_RUN_ONLY_FLAGS = ("--fetch", "--no-fetch", "--shared-batch", "--verbose", "-v", "--json")


def explain_command_line(argv: Sequence[str]) -> str:
    """The ``judgestore explain`` command for a ``generate``/``judge`` command line (``sys.argv``), to print: a
    ``--store-url`` is shown without its password (``***``), as every message shows it."""
    args = list(argv[1:])
    command = next((i for i, arg in enumerate(args) if arg in ("generate", "judge")), None)
    if command is None:
        return "judgestore explain --help"
    role = ["--role", "judgements"] if args[command] == "judge" else []
    kept: list[str] = []
    rest = iter(args[command + 1 :])
    for arg in rest:
        name = arg.split("=", 1)[0]
        if name in _RUN_ONLY_WITH_VALUE:
            if "=" not in arg:
                next(rest, None)
            continue
        if arg in _RUN_ONLY_FLAGS or (arg.startswith("-o") and not arg.startswith("--")):  # -oFILE: joined
            continue
        if name == "--store-url":  # printed (a log keeps it): never with the URL's password
            from store.backends.postgres.connections import display_url

            if "=" in arg:
                arg = f"--store-url={display_url(arg.split('=', 1)[1])}"
            else:
                kept.append(arg)
                arg = display_url(next(rest, ""))
        kept.append(arg)
    return shlex.join(["judgestore", "explain", *role, *kept])
