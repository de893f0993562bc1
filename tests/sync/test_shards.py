"""Shards: byte-deterministic when written, trusted only after every check when read."""

from __future__ import annotations

import gzip
import hashlib
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from inference.judging import pairwise_requests
from store import logprobs
from store.descriptor import canonical_json, input_hash
from store.errors import ShardError
from store.logprobs import PositionLogprobs, TokenLogprob
from store.sync import shards
from store.sync.shards import (
    _SCHEMAS,
    SHARD_FORMAT,
    ShardOrigin,
    build_shards,
    gunzip_capped,
    library_version,
    read_shard,
)
from store.tables.records import RECORD_OF_ROLE, record_fields
from tests.sync.helpers import JUDGE, QWEN, completions, judgements

ORIGIN = ShardOrigin("completions", "mt-bench", "vllm", QWEN.model, QWEN.sha256())
JUDGE_ORIGIN = ShardOrigin("judgements", "arena-hard", "vllm", JUDGE.model, JUDGE.sha256())


def one_shard(tmp_path: Path, records: list[Any] | None = None, origin: ShardOrigin = ORIGIN) -> tuple[str, bytes]:
    (shard,) = build_shards(origin, records or completions(range(5)), tmp_path)
    return shard.name, shard.path.read_bytes()


def rewritten(data: bytes, edit: Any) -> tuple[str, bytes]:
    """A shard whose lines were edited and which was then renamed to its new hash, as a forger would."""
    lines = gzip.decompress(data).splitlines(keepends=True)
    content = b"".join(edit(lines))
    return hashlib.sha256(content).hexdigest(), gzip.compress(content, mtime=0)


def test_the_same_rows_give_the_same_bytes_whatever_their_order(tmp_path: Path) -> None:
    records = completions(range(12))
    a = build_shards(ORIGIN, records, tmp_path / "a", target_bytes=1_500)
    b = build_shards(ORIGIN, list(reversed(records)), tmp_path / "b", target_bytes=1_500)
    assert len(a) > 1
    assert [s.name for s in a] == [s.name for s in b]
    assert [s.path.read_bytes() for s in a] == [s.path.read_bytes() for s in b]
    assert sorted(k for s in a for k in s.keys) == sorted(r.input_hash for r in records)  # each row exactly once


def test_a_shard_is_named_by_its_uncompressed_content_and_starts_with_its_header(tmp_path: Path) -> None:
    name, data = one_shard(tmp_path)
    content = gzip.decompress(data)
    assert hashlib.sha256(content).hexdigest() == name
    assert data[4:8] == b"\0\0\0\0"  # gzip mtime 0
    header = orjson.loads(content.splitlines()[0])
    assert header == {
        "format": SHARD_FORMAT, "role": "completions", "task": "mt-bench", "provider": "vllm",
        "model": "Qwen/Qwen3-8B", "descriptor_sha256": QWEN.sha256(), "rows": 5, "library_version": library_version(),
    }  # fmt: skip
    keys = [orjson.loads(line)["input_hash"] for line in content.splitlines()[1:]]
    assert keys == sorted(keys)


def test_reading_gives_back_exactly_the_records(tmp_path: Path) -> None:
    records = judgements(range(4)) + judgements([9], pointwise=True) + judgements([5], orientation="reversed")
    name, data = one_shard(tmp_path, records, JUDGE_ORIGIN)
    shard = read_shard(data, name, JUDGE_ORIGIN, where="x")
    assert sorted(shard.records, key=lambda r: r.input_hash) == sorted(records, key=lambda r: r.input_hash)
    assert all(r.created_at.tzinfo is not None for r in shard.records)


def test_the_row_schema_names_exactly_the_record_fields() -> None:
    for role, schema in _SCHEMAS.items():
        assert set(schema) == set(record_fields(RECORD_OF_ROLE[role]))


def drop_last_row(lines: list[bytes]) -> list[bytes]:
    return lines[:-1]


def unsort(lines: list[bytes]) -> list[bytes]:
    return [lines[0], *reversed(lines[1:])]


def edit_row(**changes: Any) -> Any:
    def edit(lines: list[bytes]) -> list[bytes]:
        row = orjson.loads(lines[1])
        row.update(changes)
        return [lines[0], canonical_json(row) + b"\n", *lines[2:]]

    return edit


def edit_header(**changes: Any) -> Any:
    def edit(lines: list[bytes]) -> list[bytes]:
        header = orjson.loads(lines[0])
        header.update(changes)
        return [canonical_json(header) + b"\n", *lines[1:]]

    return edit


def spaced(lines: list[bytes]) -> list[bytes]:
    return [lines[0], orjson.dumps(orjson.loads(lines[1]), option=orjson.OPT_INDENT_2).replace(b"\n", b"") + b"\n",
            *lines[2:]]  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (drop_last_row, "header says 5 rows"),
        (unsort, "increasing input_hash order"),
        (spaced, "not canonical JSON"),
        (edit_row(completion="forged"), None),  # allowed by the schema: the hash covers the input, not the output
        (edit_row(input_text='{"text":"other","type":"text"}'), "is not the hash of its input"),
        (edit_row(sample_index=-1), "invalid value for sample_index"),
        (edit_row(created_at="2026-01-01T00:00:00"), "invalid value for created_at"),
        (edit_row(usage=[1, 2]), "invalid value for usage"),
        (edit_row(extra="x"), "needs exactly the fields"),
        (edit_header(task="other-task"), "header says task='other-task'"),
        (edit_header(descriptor_sha256="0" * 64), "header says descriptor_sha256"),
        (edit_header(format="judgestore-shard/v9"), "newer judgestore"),
        (edit_header(rows=0), "positive integer"),
    ],
)
def test_a_renamed_forgery_is_still_rejected_by_its_content(tmp_path: Path, edit: Any, reason: str | None) -> None:
    _, data = one_shard(tmp_path)
    name, forged = rewritten(data, edit)
    if reason is None:
        assert len(read_shard(forged, name, ORIGIN, where="x").records) == 5
        return
    with pytest.raises(ShardError, match=reason):
        read_shard(forged, name, ORIGIN, where="x")


def test_bytes_that_do_not_match_the_name_are_rejected(tmp_path: Path) -> None:
    name, data = one_shard(tmp_path)
    _, forged = rewritten(data, edit_row(completion="forged"))
    with pytest.raises(ShardError, match="not to its name"):
        read_shard(forged, name, ORIGIN, where="x")


def test_a_shard_read_for_another_folder_is_rejected(tmp_path: Path) -> None:
    name, data = one_shard(tmp_path)
    with pytest.raises(ShardError, match="lies in the folder of"):
        read_shard(data, name, replace(ORIGIN, model="other/model"), where="x")


def test_decompression_is_capped_and_checks_the_stream_end() -> None:
    bomb = gzip.compress(b"\n" * 1_000_000, mtime=0)
    with pytest.raises(ShardError, match="more than 1,000 bytes"):
        gunzip_capped(bomb, 1_000, "x")
    data = gzip.compress(b"hello\n", mtime=0)
    assert gunzip_capped(data, 100, "x") == b"hello\n"
    with pytest.raises(ShardError, match="truncated"):
        gunzip_capped(data[:-9], 100, "x")
    with pytest.raises(ShardError, match="after the end"):
        gunzip_capped(data + data, 100, "x")
    with pytest.raises(ShardError, match="not valid gzip"):
        gunzip_capped(b"PK\3\4 not gzip", 100, "x")


def test_a_compressed_file_over_the_cap_is_refused_before_decompressing(tmp_path: Path) -> None:
    name, data = one_shard(tmp_path)
    with pytest.raises(ShardError, match="over the cap"):
        read_shard(data, name, ORIGIN, where="x", max_bytes=len(data) - 1)


def test_nan_and_infinities_travel_in_a_shard_exactly(tmp_path: Path) -> None:
    top = logprobs.encode([PositionLogprobs((TokenLogprob("A", -0.5, 1, 1), TokenLogprob("B", -math.inf, 2, 2)))])
    records = [replace(r, top_logprobs=top, usage={"x": math.nan}) for r in judgements(range(2))]
    (shard,) = build_shards(JUDGE_ORIGIN, records, tmp_path)
    read = read_shard(shard.path.read_bytes(), shard.name, JUDGE_ORIGIN, where="test")
    for record in read.records:
        assert logprobs.decode(record.top_logprobs)[0].candidates[1].logprob == -math.inf
        assert record.usage is not None and math.isnan(record.usage["x"])


def test_reversed_rows_of_0_1_default_judge_prompt_are_read_with_positional_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (reversed_row,) = pairwise_requests(
        question="2+2?", model_a="x", answer_a="4", model_b="y", answer_b="5", orientations=("reversed",)
    )
    text = reversed_row.render("chat")
    old = replace(
        judgements(range(1))[0],
        input_hash=input_hash(text),
        input_text=text,
        model_a="x",
        model_b="y",
        orientation="reversed",
    )  # fmt: skip  (0.1.0 wrote the pair's identity, X first, in both orientations)
    custom = replace(judgements(range(1, 2))[0], model_a="y", model_b="x", orientation="reversed")

    monkeypatch.setattr(shards, "library_version", lambda: "0.1.0")
    (pushed_by_0_1,) = build_shards(JUDGE_ORIGIN, [old, custom], tmp_path / "old")
    read = read_shard(pushed_by_0_1.path.read_bytes(), pushed_by_0_1.name, JUDGE_ORIGIN, where="test")
    slots = {r.input_hash: (r.model_a, r.model_b) for r in read.records}
    assert slots == {old.input_hash: ("y", "x"), custom.input_hash: ("y", "x")}  # only 0.1.0's own prompt is fixed

    monkeypatch.setattr(shards, "library_version", lambda: "0.2.0")
    (pushed_now,) = build_shards(JUDGE_ORIGIN, [replace(old, model_a="y", model_b="x")], tmp_path / "new")
    (row,) = read_shard(pushed_now.path.read_bytes(), pushed_now.name, JUDGE_ORIGIN, where="test").records
    assert (row.model_a, row.model_b) == ("y", "x")  # a shard of today is read as written


def test_adopted_rows_travel_marked_and_other_rows_keep_the_lines_older_libraries_read(tmp_path: Path) -> None:
    source = "ab" * 32  # the full SHA-256 of the descriptor the row was adopted from
    plain, adopted = [*completions([0]), replace(completions([1])[0], adopted_from=source)]
    name, data = one_shard(tmp_path, [plain, adopted])
    rows = {r["input_hash"]: r for r in map(orjson.loads, gzip.decompress(data).splitlines()[1:])}
    assert "adopted_from" not in rows[plain.input_hash]  # byte for byte what revision 0003's library wrote
    assert rows[adopted.input_hash]["adopted_from"] == source
    read = {r.input_hash: r for r in read_shard(data, name, ORIGIN, where="x").records}
    assert (read[plain.input_hash], read[adopted.input_hash]) == (plain, adopted)


@pytest.mark.parametrize("value", [None, "not-a-hash"])
def test_an_adopted_from_that_is_null_or_not_a_hash_is_refused(tmp_path: Path, value: Any) -> None:
    _, data = one_shard(tmp_path)
    name, forged = rewritten(data, edit_row(adopted_from=value))
    with pytest.raises(ShardError, match="adopted_from"):
        read_shard(forged, name, ORIGIN, where="x")
