"""Where a descriptor's database lives: percent-encoded segments, metadata.json, walking a root."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from urllib.parse import quote, unquote

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from store.backends.sqlite.info import database_info
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, MetadataMismatchError, MetadataMissingError
from store.layout import (
    METADATA_FILE,
    Location,
    Selector,
    check_location_metadata,
    metadata_bytes,
    read_location_metadata,
    read_metadata,
    select,
    walk,
    write_metadata,
)
from store.schema import DatabaseState
from store.segments import NAME_MAX_BYTES, SHORT_PREFIX_BYTES, ShortName, decode_segment, encode_segment
from store.settings import Settings
from store.store import Store
from store.sync.remote_layout import verify_remote_metadata
from tests.factories import QWEN, completion_record, current_database, file_digests

segments = st.text(min_size=1, max_size=40).filter(lambda s: s not in (".", ".."))


# ---------------------------------------------------------------- segments


@settings(max_examples=300, deadline=None)
@given(segments)
@example("\U00010000" * 40)  # 480 bytes encoded: always shortened
@example("0000000::::::" + "\x80" * 15 + "\u0800" + "\U00010000" * 11)  # found by hypothesis: 288 bytes encoded
def test_any_segment_round_trips_and_stays_one_path_component(value: str) -> None:
    encoded = encode_segment(value)
    decoded = decode_segment(encoded)
    if len(quote(value, safe="")) <= NAME_MAX_BYTES:
        assert decoded == value
    else:  # 40 characters of up to 12 bytes encoded: too long for a file name, so shortened (a ShortName)
        assert isinstance(decoded, ShortName) and decoded == encoded
    assert len(encoded) <= NAME_MAX_BYTES
    assert "/" not in encoded and "\x00" not in encoded
    assert encoded not in ("", ".", "..")
    assert Path("root", encoded).parent == Path("root")


def test_model_ids_with_slashes_are_one_segment(descriptor: ModelDescriptor) -> None:
    location = Location.of("completions", "mt-bench", descriptor)
    assert location.relative_folder() == Path("completions", "mt-bench", "vllm", "Qwen%2FQwen3-8B", descriptor.hash16())
    assert location.db_path(Path("/r")) == Path("/r/completions/mt-bench/vllm/Qwen%2FQwen3-8B", descriptor.hash16(),
                                                "completions.db")  # fmt: skip


@pytest.mark.parametrize("bad", ["", ".", "..", "\ud800", None, 3])
def test_empty_dot_dotdot_and_non_text_segments_are_refused(bad: object) -> None:
    with pytest.raises(InvalidInputError):
        encode_segment(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", ".", "..", "%2e", "%2E%2E", "a/b", "%2f", "Qwen%2fx", "%41", "caf\u00e9"])
def test_non_canonical_or_forbidden_encodings_are_refused(bad: str) -> None:
    with pytest.raises(InvalidInputError):
        decode_segment(bad)


@pytest.mark.parametrize("task", ["", ".", ".."])
def test_location_refuses_bad_task_segments(task: str, descriptor: ModelDescriptor) -> None:
    with pytest.raises(InvalidInputError):
        Location.of("completions", task, descriptor)


def test_location_refuses_unknown_roles(descriptor: ModelDescriptor) -> None:
    with pytest.raises(InvalidInputError, match="role"):
        Location.of("battles", "t", descriptor)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["completions", "judgements"]), segments, segments, segments)
def test_location_round_trips_through_its_db_path(role: str, task: str, provider: str, model: str) -> None:
    provider, model = provider.strip() or "p", model.strip() or "m"
    if provider in (".", "..") or model in (".", ".."):
        return
    descriptor = ModelDescriptor(provider=provider, model=model)
    location = Location.of(role, task, descriptor)
    root = Path("/store")
    parsed = Location.from_db_path(root, location.db_path(root))
    if any(isinstance(name, ShortName) for name in (parsed.task, parsed.provider, parsed.model)):
        # too long for a file name: the whole name is read back from metadata.json, which this root has not
        # (test_a_name_longer_than_a_file_name_may_be_gets_a_short_segment_and_keeps_its_folder)
        assert parsed.relative_folder() == location.relative_folder()
        return
    assert parsed == location


@pytest.mark.parametrize(
    "relative",
    [
        "completions/t/p/m/0123456789abcdef/judgements.db",  # file named after the other role
        "completions/t/p/0123456789abcdef/completions.db",  # one level short
        "other/t/p/m/0123456789abcdef/other.db",
        "completions/t/p/a%2fb/0123456789abcdef/completions.db",  # non-canonical encoding
    ],
)
def test_paths_that_are_not_locations_are_refused(relative: str) -> None:
    with pytest.raises(InvalidInputError):
        Location.from_db_path(Path("/r"), Path("/r") / relative)


# ---------------------------------------------------------------- names longer than a file name may be

LONG_NAMES = {
    "a 300-character model id": "org/" + "m" * 296,
    "40 CJK characters": "模型名" * 14,
    "a deep local path given as a model": "/" + "/".join(["very-deep-folder"] * 20) + "/model",
    "emoji": "🙂" * 30,
}


@pytest.mark.parametrize("name", list(LONG_NAMES.values()), ids=list(LONG_NAMES))
def test_a_name_longer_than_a_file_name_may_be_gets_a_short_segment_and_keeps_its_folder(
    name: str, store_root: Path
) -> None:
    segment = encode_segment(name)
    assert len(segment.encode()) <= NAME_MAX_BYTES and "/" not in segment
    prefix, mark, digest = segment.partition("+")
    assert mark == "+" and digest == hashlib.sha256(name.encode()).hexdigest()
    assert name.startswith(unquote(prefix, errors="strict")) and len(prefix) <= SHORT_PREFIX_BYTES  # whole characters
    assert isinstance(decode_segment(segment), ShortName) and encode_segment(decode_segment(segment)) == segment
    descriptor = ModelDescriptor(provider="vllm", model=name)
    with Store(root=store_root) as store:  # on a real filesystem: no "File name too long"
        store.database("completions", name, descriptor).put_many([completion_record(1)])
    (location,) = walk(store_root)
    assert (location.task, location.model) == (name, name)  # whole names, read from metadata.json
    assert select(store_root, Selector(model=name, task=name)) == [location]
    assert select(store_root, Selector(model=name + "x")) == []


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=400).filter(lambda s: s not in (".", "..")))
def test_any_name_gets_one_segment_a_filesystem_takes_and_decodes_back_or_to_its_short_name(value: str) -> None:
    segment = encode_segment(value)
    assert len(segment.encode()) <= NAME_MAX_BYTES and Path("root", segment).parent == Path("root")
    decoded = decode_segment(segment)
    assert decoded == value if len(quote(value, safe="")) <= NAME_MAX_BYTES else isinstance(decoded, ShortName)
    assert encode_segment(decoded) == segment


@pytest.mark.parametrize("length", [NAME_MAX_BYTES - 1, NAME_MAX_BYTES])
def test_every_name_a_filesystem_takes_keeps_the_segment_it_always_had(length: int) -> None:
    assert encode_segment("m" * length) == "m" * length
    assert encode_segment("%" * (length // 3)) == "%25" * (length // 3)
    assert len(encode_segment("m" * (length + 2))) < NAME_MAX_BYTES  # just over: shortened


def test_two_long_names_with_the_same_beginning_get_different_folders() -> None:
    first, second = "x" * 400 + "a", "x" * 400 + "b"
    assert encode_segment(first) != encode_segment(second)
    assert encode_segment(first)[:SHORT_PREFIX_BYTES] == encode_segment(second)[:SHORT_PREFIX_BYTES]


@pytest.mark.parametrize(
    "bad", ["a+" + "0" * 64, "x" * SHORT_PREFIX_BYTES + "+" + "0" * 63, "x" * SHORT_PREFIX_BYTES + "+" + "G" * 64,
            "%2" + "x" * (SHORT_PREFIX_BYTES - 2) + "+" + "0" * 64, "a+b",
            "%E6%A8" + "x" * (SHORT_PREFIX_BYTES - 6) + "+" + "0" * 64, "%41" * 40 + "+" + "0" * 64],
)  # fmt: skip
def test_a_segment_with_a_plus_that_this_library_would_not_write_is_refused(bad: str) -> None:
    with pytest.raises(InvalidInputError):
        decode_segment(bad)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="aZ09_.~-%2F", min_size=1, max_size=NAME_MAX_BYTES + 2))
def test_a_folder_name_decodes_exactly_when_it_is_the_name_encoded(segment: str) -> None:
    # Names of unescaped characters take a shorter path through decode_segment: it must agree with the encoding.
    try:
        canonical = encode_segment(unquote(segment)) == segment
    except InvalidInputError:
        canonical = False
    if canonical:
        assert decode_segment(segment) == unquote(segment)
    else:
        with pytest.raises(InvalidInputError):
            decode_segment(segment)


def test_a_long_named_folder_whose_metadata_is_unreadable_is_listed_and_reported_not_hidden(
    store_root: Path, settings: Settings
) -> None:
    descriptor = ModelDescriptor(provider="vllm", model=LONG_NAMES["a 300-character model id"])
    with Store(root=store_root) as store:
        path = store.database("completions", "t", descriptor).path
    (path.parent / METADATA_FILE).unlink()
    (location,) = walk(store_root)
    assert isinstance(location.model, ShortName) and location.model == encode_segment(descriptor.model)
    assert select(store_root, Selector(model=descriptor.model)) == [location]
    info = database_info(store_root, location, settings)
    assert info.state is DatabaseState.METADATA_MISSING


# ---------------------------------------------------------------- metadata.json


def test_metadata_round_trips_and_its_bytes_are_deterministic(tmp_path: Path, descriptor: ModelDescriptor) -> None:
    folder = Location.of("judgements", "arena", descriptor).folder(tmp_path)
    data = metadata_bytes("judgements", "arena", descriptor, ("template guessed",))
    assert data == metadata_bytes("judgements", "arena", descriptor, ("template guessed",))
    write_metadata(folder, data)
    assert (folder / METADATA_FILE).read_bytes() == data
    stored = read_metadata(folder)
    assert (stored.role, stored.task, stored.descriptor) == ("judgements", "arena", descriptor)
    assert stored.descriptor_sha256 == descriptor.sha256()
    assert stored.assumptions == ("template guessed",)
    assert sorted(p.name for p in folder.iterdir()) == [METADATA_FILE]  # no temporary file left behind


def test_a_settings_key_order_survives_its_metadata_and_a_remote_check(tmp_path: Path) -> None:
    """Written sorted, a descriptor whose schema lists the score first read back as another descriptor: its hash
    no longer its folder's. Written before that order counted, a metadata.json keeps its bytes."""
    schema = {"type": "object", "properties": {"score": {"type": "integer"}, "reasoning": {"type": "string"}}}
    descriptor = ModelDescriptor(provider="vllm", model="m", sampling={"structured_outputs": {"json": schema}})
    location = Location.of("judgements", "arena", descriptor)
    data = metadata_bytes("judgements", "arena", descriptor)
    write_metadata(location.folder(tmp_path), data)
    stored = read_metadata(location.folder(tmp_path))  # checks the hash against the folder's name
    assert stored.descriptor == descriptor and stored.descriptor_sha256 == descriptor.sha256()
    properties = orjson.loads(stored.descriptor.canonical_json())["sampling"]["structured_outputs"]["json"]
    assert list(properties["properties"]) == ["score", "reasoning"]
    assert verify_remote_metadata(data, location).descriptor_sha256 == descriptor.sha256()
    plain = ModelDescriptor(provider="vllm", model="m")
    as_before = orjson.dumps(
        {**json.loads(metadata_bytes("completions", "t", plain))}, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2
    )
    assert metadata_bytes("completions", "t", plain) == as_before + b"\n"


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_metadata_write_is_atomic(
    failing: str, tmp_path: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that dies before the rename leaves the old file whole and no temporary file."""
    folder = Location.of("completions", "t", descriptor).folder(tmp_path)
    old = metadata_bytes("completions", "t", descriptor)
    write_metadata(folder, old)

    def crash(*_args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, failing, crash)
    with pytest.raises(OSError, match="disk full"):
        write_metadata(folder, old.replace(b'"task": "t"', b'"task": "other"'))
    monkeypatch.undo()
    assert (folder / METADATA_FILE).read_bytes() == old
    assert sorted(p.name for p in folder.iterdir()) == [METADATA_FILE]


def test_metadata_gets_the_mode_any_file_of_the_user_gets(tmp_path: Path, descriptor: ModelDescriptor) -> None:
    """Colleagues sharing a store (a group folder) must be able to read it: not a temporary file's 0600."""
    umask = os.umask(0o022)
    try:
        folder = Location.of("completions", "t", descriptor).folder(tmp_path)
        write_metadata(folder, metadata_bytes("completions", "t", descriptor))
    finally:
        os.umask(umask)
    assert (folder / METADATA_FILE).stat().st_mode & 0o777 == 0o644


def test_a_failed_metadata_write_leaves_no_folder_it_created(
    tmp_path: Path, descriptor: ModelDescriptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        write_metadata(Location.of("completions", "t", descriptor).folder(tmp_path / "root"), b"{}")
    assert list(tmp_path.iterdir()) == []


def _edit_json(path: Path, edit: object) -> None:
    doc = json.loads(path.read_bytes())
    edit(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d["descriptor"]["sampling"].update(temperature=0.9), id="descriptor-edited"),
        pytest.param(lambda d: d.update(descriptor_sha256="0" * 64), id="recorded-hash-edited"),
        pytest.param(lambda d: d.pop("descriptor"), id="descriptor-removed"),
        pytest.param(lambda d: d.update(role="battles"), id="unknown-role"),
    ],
)
def test_edited_metadata_is_refused_naming_the_file(
    edit: object, store_root: Path, descriptor: ModelDescriptor
) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor, [completion_record(1)])
    metadata = db_path.parent / METADATA_FILE
    _edit_json(metadata, edit)
    before = file_digests(store_root)
    with pytest.raises(MetadataMismatchError) as caught:
        read_metadata(db_path.parent)
    assert str(metadata) in str(caught.value)
    with Store(root=store_root) as s, pytest.raises(MetadataMismatchError):
        s.database("completions", "t", descriptor)
    assert file_digests(store_root) == before


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: None, id="as-written"),
        pytest.param(lambda d: d["descriptor"].pop("format"), id="a-default-left-out"),
        pytest.param(lambda d: d["descriptor"]["sampling"].update(temperature=1), id="an-integral-float-as-int"),
        pytest.param(lambda d: d["descriptor"]["sampling"].update(top_k=0.0), id="an-int-as-float"),
        pytest.param(lambda d: d["descriptor"].update(surprise=1), id="an-unknown-field"),
        pytest.param(lambda d: d["descriptor"]["sampling"].update(temperature=0.9), id="descriptor-edited"),
        pytest.param(lambda d: d.update(task="other"), id="task-edited"),
        pytest.param(lambda d: d.update(role="judgements"), id="role-edited"),
        pytest.param(lambda d: d.update(descriptor_sha256="0" * 64), id="recorded-hash-edited"),
    ],
)
def test_opening_checks_metadata_as_reading_it_does(edit: object, store_root: Path) -> None:
    """Opening accepts a metadata.json in the form it writes by hashing it as it stands; any other file, valid
    or not, gets the full check, so opening accepts and refuses exactly what read_location_metadata does."""
    descriptor = ModelDescriptor(provider="vllm", model="org/m", sampling={"temperature": 1.0, "max_tokens": 8})
    location = Location.of("completions", "t", descriptor)
    current_database(store_root, "completions", "t", descriptor, [completion_record(1)])
    _edit_json(location.metadata_path(store_root), edit)
    try:
        read_location_metadata(store_root, location)
        expected: type[Exception] | None = None
    except MetadataMismatchError as e:
        expected = type(e)
    if expected is None:
        check_location_metadata(store_root, location)
        with Store(root=store_root) as s:
            assert s.open(location).count() == 1
    else:
        with pytest.raises(expected):
            check_location_metadata(store_root, location)
        with Store(root=store_root) as s, pytest.raises(expected):
            s.open(location)


def test_metadata_that_is_not_json_is_refused(store_root: Path, descriptor: ModelDescriptor) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor)
    (db_path.parent / METADATA_FILE).write_bytes(b"{not json")
    with pytest.raises(MetadataMismatchError, match="not valid JSON"):
        read_metadata(db_path.parent)


def test_missing_metadata_is_refused(store_root: Path, descriptor: ModelDescriptor) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor)
    (db_path.parent / METADATA_FILE).unlink()
    with pytest.raises(MetadataMissingError, match=METADATA_FILE):
        read_metadata(db_path.parent)
    before = file_digests(store_root)
    with Store(root=store_root) as s, pytest.raises(MetadataMissingError):
        s.open(Location.of("completions", "t", descriptor))
    assert file_digests(store_root) == before


def test_a_renamed_descriptor_folder_is_refused(store_root: Path, descriptor: ModelDescriptor) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor, [completion_record(1)])
    renamed = db_path.parent.with_name("0123456789abcdef")
    db_path.parent.rename(renamed)
    with pytest.raises(MetadataMismatchError, match="0123456789abcdef"):
        read_metadata(renamed)
    (location,) = walk(store_root)
    before = file_digests(store_root)
    with Store(root=store_root) as s, pytest.raises(MetadataMismatchError):
        s.open(location)
    assert file_digests(store_root) == before


@pytest.mark.parametrize("level", ["model", "provider", "task"])
def test_a_folder_moved_under_another_model_provider_or_task_is_refused(
    level: str, store_root: Path, descriptor: ModelDescriptor
) -> None:
    """The hash still matches, but the tree would misreport what the database holds."""
    db_path = current_database(store_root, "completions", "t", descriptor, [completion_record(1)])
    folder = db_path.parent
    moved_level = {"model": folder.parent, "provider": folder.parent.parent, "task": folder.parent.parent.parent}[level]
    moved_level.rename(moved_level.with_name("elsewhere"))
    (location,) = walk(store_root)
    assert getattr(location, level) == "elsewhere"
    before = file_digests(store_root)
    with Store(root=store_root) as s, pytest.raises(MetadataMismatchError, match="moved") as caught:
        s.open(location)
    assert METADATA_FILE in str(caught.value)
    assert file_digests(store_root) == before


# ---------------------------------------------------------------- walking a root


def test_walk_lists_every_database_and_skips_strays(store_root: Path) -> None:
    made = set()
    for role, task, provider, model in [
        ("completions", "mt-bench", "vllm", "Qwen/Qwen3-8B"),
        ("completions", "mt-bench", "vllm", "meta-llama/Llama-3.1-8B"),
        ("completions", ".hidden task", "openai", "gpt-4o"),
        ("judgements", "arena-hard", "vllm", "Qwen/Qwen3-8B"),
        ("judgements", "ünïcödé ✓", "vllm", "100%/weird?#"),
    ]:
        d = ModelDescriptor(provider=provider, model=model)
        current_database(store_root, role, task, d)
        made.add(Location.of(role, task, d))
    # Strays: a file beside the roles, a database at the wrong depth, one in a non-canonical folder.
    (store_root / "completions" / "README").write_text("notes")
    (store_root / "completions" / "mt-bench" / "completions.db").write_bytes(b"")
    stray = store_root / "judgements" / "t" / "p" / "a%2fb" / "0123456789abcdef"
    stray.mkdir(parents=True)
    (stray / "judgements.db").write_bytes(b"")
    found = list(walk(store_root))
    assert set(found) == made
    assert len(found) == len(made)
    assert found == sorted(found, key=lambda loc: (loc.role != "completions", str(loc.relative_folder())))


def test_walk_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    assert list(walk(tmp_path / "nowhere")) == []
    assert not (tmp_path / "nowhere").exists()


# ---------------------------------------------------------------- selecting databases


def test_selector_picks_databases_by_location(filled: Path) -> None:
    assert len(select(filled)) == 3
    assert {loc.model for loc in select(filled, Selector(role="completions"))} == {
        "Qwen/Qwen3-8B",
        "meta-llama/Llama-3.1-8B",
    }
    assert [loc.model for loc in select(filled, Selector(model="judge-1"))] == ["judge-1"]
    assert [loc.task for loc in select(filled, Selector(task="arena-hard"))] == ["arena-hard"]
    assert select(filled, Selector(provider="openai")) == []
    prefix = QWEN.hash16()[:6]
    assert [loc.descriptor_hash16 for loc in select(filled, Selector(descriptor=prefix))] == [QWEN.hash16()]
    assert [loc.descriptor_hash16 for loc in select(filled, Selector(descriptor=QWEN.sha256()))] == [QWEN.hash16()]


def test_selector_rejects_a_bad_role_or_hash() -> None:
    with pytest.raises(InvalidInputError):
        Selector(role="completion")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        Selector(descriptor="not-hex")
