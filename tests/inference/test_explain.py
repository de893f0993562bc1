"""`explain` without an engine: descriptor differences, nearest descriptors, input diffs, the hint's command line."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import typer

from inference.cache.model import CachedModel
from inference.cli.app import app
from inference.drift.explain import (
    FieldChange,
    descriptor_changes,
    explain_command_line,
    explain_descriptor,
    explain_inputs,
    input_diffs,
)
from inference.requests import CompletionRequest
from store.descriptor import ModelDescriptor, render_messages, render_text
from store.settings import Settings
from store.store import Store
from tests.inference.test_cached import CountingBackend, Factory

BASE = ModelDescriptor(provider="vllm", model="tiny", revision="sha256:ab", sampling={"temperature": 0.0},
                       backend_version="0.11.0", chat_template_sha256="ab12" * 16)  # fmt: skip


def with_sampling(descriptor: ModelDescriptor, **sampling: object) -> ModelDescriptor:
    return descriptor.model_copy(update={"sampling": descriptor.sampling.model_copy(update=sampling)})


def ask(i: int, text: str | None = None) -> CompletionRequest:
    content = text if text is not None else f"Tell me fact number {i} about the sea."
    return CompletionRequest(messages=[{"role": "user", "content": content}], benchmark="b", instruction_id=str(i))


def fill(root: Path, descriptor: ModelDescriptor, task: str = "t", n: int = 3) -> None:
    with Store(Settings(), root=root) as store:
        CachedModel(store, descriptor, task=task, backend_factory=Factory(CountingBackend())).complete(
            [ask(i) for i in range(n)]
        )


def test_descriptor_changes_name_each_field_stored_to_wanted() -> None:
    wanted = with_sampling(BASE, temperature=0.7).model_copy(
        update={"backend_version": "0.32.0", "chat_template_sha256": "9f3e" * 16}
    )
    changes = descriptor_changes(BASE, wanted)
    assert [c.field for c in changes] == ["backend_version", "chat_template_sha256", "sampling.temperature"]
    assert changes[2] == FieldChange("sampling.temperature", 0.0, 0.7)
    assert changes[0].text() == "backend_version 0.11.0 -> 0.32.0"
    assert changes[1].text() == "chat_template_sha256 ab12ab12ab12ab12… -> 9f3e9f3e9f3e9f3e…"
    assert descriptor_changes(BASE, with_sampling(BASE, temperature=0)) == []  # 0 and 0.0 hash alike
    engine = descriptor_changes(BASE, BASE.model_copy(update={"engine": {"dtype": "float32"}}))
    assert engine == [FieldChange("engine.dtype", None, "float32")]


def test_a_schema_in_another_property_order_is_a_miss_and_explain_names_the_order(store_root: Path) -> None:
    """The score first or the reasoning first: structured outputs generate in the schema's order, so the two are
    different runs. The second was a hit on the first one's rows (was)."""
    props = {"reasoning": {"type": "string"}, "score": {"type": "integer"}}

    def judge(*order: str) -> ModelDescriptor:
        schema = {"type": "object", "properties": {k: props[k] for k in order}}
        return with_sampling(BASE, structured_outputs={"json": schema})

    fill(store_root, judge("reasoning", "score"))
    with Store(Settings(), root=store_root, readonly=True) as store:
        for order, misses in ((("reasoning", "score"), 0), (("score", "reasoning"), 3)):
            model = CachedModel(store, judge(*order), task="t", backend_factory=Factory(CountingBackend()))
            assert model.plan("completions", [ask(i) for i in range(3)]).misses == misses
    assert descriptor_changes(judge("reasoning", "score"), judge("score", "reasoning")) == [
        FieldChange(
            "sampling.structured_outputs.json.properties.(key order)", ["reasoning", "score"], ["score", "reasoning"]
        )
    ]
    name_first, description_first = (
        BASE.model_copy(update={"chat_template_kwargs": {"tools": [tool]}})
        for tool in ({"name": "f", "description": "d"}, {"description": "d", "name": "f"})
    )
    changes = descriptor_changes(name_first, description_first)
    assert [c.field for c in changes] == ["chat_template_kwargs.tools.0.(key order)"]
    nested = [BASE.model_copy(update={"engine": {"x": [[{"b": 1, "a": 2}]]}}),
              BASE.model_copy(update={"engine": {"x": [[{"a": 2, "b": 1}]]}})]  # fmt: skip
    assert [c.field for c in descriptor_changes(*nested)] == ["engine.x.0.0.(key order)"]  # said none (was)


def test_a_key_added_to_a_settings_object_is_that_keys_change_alone() -> None:
    """Adding a property to a schema also listed the object's key order, which a precise --across did not allow:
    adopt refused a source it took before (was)."""
    props = {"reasoning": {"type": "string"}, "score": {"type": "integer"}}
    old = with_sampling(BASE, structured_outputs={"json": {"properties": props, "type": "object"}})
    new = with_sampling(BASE, structured_outputs={"json": {"properties": {**props, "confidence": {"type": "number"}},
                                                           "type": "object"}})  # fmt: skip
    assert descriptor_changes(old, new) == [
        FieldChange("sampling.structured_outputs.json.properties.confidence.type", None, "number")
    ]
    built = [ModelDescriptor(**{**d.model_dump(), "format": "judgestore-descriptor/v1"}) for d in (old, new)]
    assert built[0].format != built[1].format  # the added key is out of sorted order: v2, which is not listed
    assert descriptor_changes(*built) == descriptor_changes(old, new)


def test_a_local_folder_named_by_its_path_as_0_1_0_did_is_a_neighbour_adopt_can_take(store_root: Path) -> None:
    """judgestore 0.1.0 named a local model folder by the path given; its name since, so those rows missed and
    explain said no descriptor of the model was stored: adopt found nothing to carry over (was)."""
    from inference.drift.adopt import adoption_candidates

    wanted = BASE.model_copy(update={"revision": "sha256:" + "c2" * 32})
    spellings = ["/models/tiny", "models/tiny", "tiny/", "./tiny", "~/m/tiny"]  # as typed: 0.1.0 kept each
    for spelling in spellings:
        fill(store_root, wanted.model_copy(update={"model": spelling}))
    fill(store_root, wanted.model_copy(update={"model": "/models/tinyish"}))  # another folder: not this model's
    fill(store_root, wanted.model_copy(update={"model": "org/tiny", "revision": "ab" * 20}))  # a Hub model's
    with Store(Settings(), root=store_root, readonly=True) as store:
        report = explain_descriptor(store, "completions", "t", wanted)
        assert sorted((n.location.model, n.changes) for n in report.neighbours) == sorted(
            (spelling, (FieldChange("model", spelling, "tiny"),)) for spelling in spellings
        )
        candidates = adoption_candidates(store, "completions", "t", wanted, ["model"])
        assert len(candidates) == len(spellings) and all(c.eligible for c in candidates)
        hub = BASE.model_copy(update={"model": "tiny", "revision": "ab" * 20})  # a Hub model's (a commit): by name
        assert explain_descriptor(store, "completions", "t", hub).neighbours == ()


def test_a_missing_descriptor_lists_the_stored_ones_nearest_first(store_root: Path) -> None:
    fill(store_root, BASE)
    fill(store_root, with_sampling(BASE, temperature=1.0, seed=3), n=5)
    fill(store_root, BASE, task="other", n=2)
    wanted = with_sampling(BASE, temperature=0.7)
    with Store(Settings(), root=store_root, readonly=True) as store:
        report = explain_descriptor(store, "completions", "t", wanted)
    assert not report.exists and report.rows == 0
    assert [(n.rows, [c.text() for c in n.changes]) for n in report.neighbours] == [
        (3, ["sampling.temperature 0.0 -> 0.7"]),
        (2, ["task other -> t", "sampling.temperature 0.0 -> 0.7"]),
        (5, ["sampling.seed 3 -> (none)", "sampling.temperature 1.0 -> 0.7"]),
    ]
    assert report.as_dict()["neighbours"][0]["changes"][0]["field"] == "sampling.temperature"
    with Store(Settings(), root=store_root, readonly=True) as store:
        same = explain_descriptor(store, "completions", "t", BASE)
    assert same.exists and same.rows == 3 and len(same.neighbours) == 2


def test_input_diffs_say_which_message_and_which_characters() -> None:
    stored = render_messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a joke."}]
    )
    edited = render_messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    )
    (diff,) = input_diffs(stored, edited)
    assert (diff.where, diff.position) == ("message 1 (user) content", 10)
    assert (diff.stored, diff.wanted) == ("Tell me a joke.", "Tell me a story.")
    assert diff.edits and "replace" in diff.edits[0]
    longer = render_messages([{"role": "system", "content": "Be brief."}])
    assert [d.where for d in input_diffs(stored, longer)] == ["message 1 (user) only in the stored input"]
    assert [d.where for d in input_diffs(stored, render_text("Tell me a joke."))] == ["input type"]
    assert input_diffs(stored, stored) == []


def test_each_miss_is_explained_against_the_row_it_should_have_matched(store_root: Path) -> None:
    fill(store_root, BASE)
    fill(store_root, with_sampling(BASE, temperature=0.7), n=1)
    requests = [ask(0), ask(1, "Tell me fact number 1 about the SEA."), ask(7), ask(0).__class__(
        messages=[{"role": "user", "content": "Tell me fact number 2 about the sea."}], n=2)]  # fmt: skip
    with Store(Settings(), root=store_root, readonly=True) as store:
        model = CachedModel(store, BASE, task="t", backend_factory=Factory(CountingBackend()), mode="readonly")
        plan = model.plan("completions", requests)
        assert (plan.hits, plan.misses) == (2, 3)
        neighbours = [n.location for n in explain_descriptor(store, "completions", "t", BASE).neighbours]
        report = explain_inputs(store, "completions", "t", BASE, plan, requests, neighbours=neighbours)
    edited, unknown, second_sample = report.explained
    assert edited.request == "b/1" and "same benchmark/instruction" in edited.reason
    assert edited.diffs[0].text().startswith("message 0 (user) content at character 32: ")
    assert "sea" in edited.diffs[0].stored and "SEA" in edited.diffs[0].wanted
    assert unknown.request == "b/7" and "nearest stored input" in unknown.reason and unknown.nearest is not None
    assert second_sample.sample_index == 1 and "never generated" in second_sample.reason
    assert report.as_dict()["misses"] == 3


def test_a_miss_stored_under_another_descriptor_says_which(store_root: Path) -> None:
    other = with_sampling(BASE, temperature=0.7)
    fill(store_root, other, n=2)
    with Store(Settings(), root=store_root, readonly=True) as store:
        model = CachedModel(store, BASE, task="t", backend_factory=Factory(CountingBackend()), mode="readonly")
        plan = model.plan("completions", [ask(0)])
        neighbours = [n.location for n in explain_descriptor(store, "completions", "t", BASE).neighbours]
        (miss,) = explain_inputs(store, "completions", "t", BASE, plan, [ask(0)], neighbours=neighbours).explained
    assert miss.stored_under == (other.hash16(),) and other.hash16() in miss.reason


def test_a_miss_stored_under_a_descriptor_past_the_five_shown_still_says_which(
    store_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the five nearest descriptors were kept: a miss stored under the sixth was "nothing is stored under
    this descriptor", and nothing said more were stored (was)."""
    from inference.cli.diagnostics import _print_descriptor

    wanted = with_sampling(BASE, temperature=0.7)
    fill(store_root, BASE)  # the very inputs, under a temperature of 0: one field away, the fewest rows
    for k in range(1, 6):  # one field away too (top_k), with more rows of other prompts: listed before it
        with Store(Settings(), root=store_root) as store:
            CachedModel(store, with_sampling(wanted, top_k=k), task="t", backend_factory=Factory(CountingBackend())
                        ).complete([ask(100 + i) for i in range(8)])  # fmt: skip
    with Store(Settings(), root=store_root, readonly=True) as store:
        report = explain_descriptor(store, "completions", "t", wanted)
        model = CachedModel(store, wanted, task="t", backend_factory=Factory(CountingBackend()), mode="readonly")
        plan = model.plan("completions", [ask(0)])
        locations = [n.location for n in report.neighbours]
        (miss,) = explain_inputs(store, "completions", "t", wanted, plan, [ask(0)], neighbours=locations).explained
        _print_descriptor(report)

    assert len(report.neighbours) == 6 and report.neighbours[-1].location.descriptor_hash16 == BASE.hash16()
    assert miss.stored_under == (BASE.hash16(),) and BASE.hash16() in miss.reason
    assert "... and 1 more (--json lists them all)" in capsys.readouterr().out


def test_a_miss_stored_under_another_task_names_that_task(store_root: Path) -> None:
    """The same descriptor under another task: "stored under descriptor X, not this one", X being this very
    descriptor's hash (was)."""
    fill(store_root, BASE, task="t")
    with Store(Settings(), root=store_root, readonly=True) as store:
        model = CachedModel(store, BASE, task="t2", backend_factory=Factory(CountingBackend()), mode="readonly")
        plan = model.plan("completions", [ask(0)])
        neighbours = [n.location for n in explain_descriptor(store, "completions", "t2", BASE).neighbours]
        (miss,) = explain_inputs(store, "completions", "t2", BASE, plan, [ask(0)], neighbours=neighbours).explained
    assert f"stored under descriptor {BASE.hash16()} (task t), not this run's" in miss.reason


def test_similarity_is_of_what_was_said_and_never_rounds_up_to_the_whole(store_root: Path) -> None:
    """One character added to a long prompt read "100% similar"; an unrelated prompt, sharing only the
    rendering's JSON keys, read 72% (was)."""
    long = "Tell me fact number 1 about the sea, and about the fish that live in it, at length. " * 3
    with Store(Settings(), root=store_root) as store:
        CachedModel(store, BASE, task="t", backend_factory=Factory(CountingBackend())).complete([ask(1, long)])
    asked = [ask(1, long + "?"), ask(2, "totally different")]
    with Store(Settings(), root=store_root, readonly=True) as store:
        model = CachedModel(store, BASE, task="t", backend_factory=Factory(CountingBackend()), mode="readonly")
        edited, other = explain_inputs(
            store, "completions", "t", BASE, model.plan("completions", asked), asked
        ).explained
    assert "(99% similar)" in edited.reason and edited.similarity is not None and edited.similarity < 1
    assert other.similarity is not None and other.similarity < 0.3, other.reason


def test_a_conversation_flattened_into_one_message_is_not_the_whole_of_it(store_root: Path) -> None:
    """The messages were joined as "role: content" lines: one user message saying "Hi\nassistant: ok\nuser:
    more" said the same, and read "100% similar" (was)."""
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "more"}]  # fmt: skip
    flat = [{"role": "user", "content": "Hi\nassistant: ok\nuser: more"}]
    with Store(Settings(), root=store_root) as store:
        CachedModel(store, BASE, task="t", backend_factory=Factory(CountingBackend())).complete(
            [CompletionRequest(messages=turns, benchmark="b", instruction_id="1")]
        )
    asked = [CompletionRequest(messages=flat, benchmark="b", instruction_id="1")]
    with Store(Settings(), root=store_root, readonly=True) as store:
        model = CachedModel(store, BASE, task="t", backend_factory=Factory(CountingBackend()), mode="readonly")
        (miss,) = explain_inputs(store, "completions", "t", BASE, model.plan("completions", asked), asked).explained
    assert miss.similarity is not None and miss.similarity < 0.95 and "100%" not in miss.reason


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["judgestore", "generate", "--model", "m", "--task", "t", "-i", "p.jsonl", "-o", "out.jsonl", "--json"],
         "judgestore explain --model m --task t -i p.jsonl"),
        (["x", "judge", "--model", "j", "--output=v.jsonl", "--mode", "use", "--orientation", "direct", "--fetch"],
         "judgestore explain --role judgements --model j --orientation direct"),
        (["judgestore", "ls"], "judgestore explain --help"),
        # options explain does not take: the hint failed, "No such option: -v" (was); -oFILE joined was kept
        (["judgestore", "generate", "--model", "m", "-v", "-ox.jsonl", "--shared-batch", "--verbose", "--task", "t"],
         "judgestore explain --model m --task t"),
        (["judgestore", "generate", "--model", "my model", "--chunk-size", "8"],
         "judgestore explain --model 'my model'"),
        # the password never reaches the printed hint (was: printed as given)
        (["judgestore", "generate", "--store-url", "postgresql+psycopg://eval:s3cret@/db?host=/tmp/s", "--model", "m"],
         "judgestore explain --store-url 'postgresql+psycopg://eval:***@/db?host=%2Ftmp%2Fs' --model m"),
        (["judgestore", "generate", "--store-url=postgresql://eval@h/db?password=s3cret", "--model", "m"],
         "judgestore explain '--store-url=postgresql://eval@h/db?password=***' --model m"),
    ],
)  # fmt: skip
def test_the_hint_names_the_explain_command_of_the_same_run(argv: list[str], expected: str) -> None:
    assert explain_command_line(argv) == expected


def test_explain_of_a_metadata_file_looks_in_the_role_it_records(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from inference.cli.app import app
    from store.layout import walk
    from tests.factories import fill_small_store

    root = fill_small_store(tmp_path / "store")
    (judged,) = [loc for loc in walk(root) if loc.role == "judgements"]
    metadata = str(judged.metadata_path(root))
    args = ["explain", "--store-root", str(root), "--descriptor-file", metadata, "--task", judged.task, "--json"]
    found = CliRunner().invoke(app(), args)
    assert found.exit_code == 0, found.output
    report = orjson.loads(found.stdout)["descriptor"]
    assert (report["role"], report["exists"], report["rows"]) == ("judgements", True, 5)  # not "not in the store"
    refused = CliRunner().invoke(app(), [*args, "--role", "completions"])
    assert refused.exit_code == 1 and "is the metadata.json of judgements, not completions" in refused.stderr


def test_explain_prints_a_prompt_holding_brackets_as_written(store_root: Path, tmp_path: Path) -> None:
    """A prompt "[INST] ... [/INST]" was rich markup: its closing tag crashed explain (a traceback, exit 1), and
    "[b]" vanished from the diff it showed (was)."""
    from typer.testing import CliRunner

    fill(store_root, BASE)
    metadata = next(store_root.rglob("metadata.json"))
    prompt = "[INST] Tell me fact number 1 about the sea. [/INST] [b]x"
    inputs = tmp_path / "in[v2].jsonl"
    inputs.write_bytes(orjson.dumps({"messages": [{"role": "user", "content": prompt}], "benchmark": "b",
                                     "instruction_id": "1"}) + b"\n")  # fmt: skip

    args = ["explain", "--store-root", str(store_root), "--descriptor-file", str(metadata), "--task", "t"]
    found = CliRunner().invoke(app(), [*args, "-i", str(inputs)], env={"COLUMNS": "300"})

    assert found.exit_code == 0, found.output
    shown = " ".join(found.stdout.split())
    assert "in[v2].jsonl:1" in shown and "[/INST] [b]x" in shown


def test_explain_given_neither_a_model_nor_a_descriptor_file_asks_for_one(tmp_path: Path) -> None:
    """Given neither, explain said "..., not both" (was)."""
    from typer.testing import CliRunner

    from inference.cli.app import app
    from tests.factories import fill_small_store

    root = fill_small_store(tmp_path / "store")
    neither = CliRunner().invoke(app(), ["explain", "--store-root", str(root), "--task", "mt-bench"])
    assert neither.exit_code == 2 and "or --descriptor-file" in neither.stderr and "not both" not in neither.stderr
    metadata = next(root.rglob("metadata.json"))
    both = CliRunner().invoke(
        app(), ["explain", "--store-root", str(root), "--task", "t", "--model", "m", "--descriptor-file", str(metadata)]
    )
    assert both.exit_code == 2 and "not both" in both.stderr


def test_the_hint_drops_every_option_of_a_run_that_explain_does_not_take() -> None:
    """The lists in inference.drift.explain against the app itself: an option added to generate or judge later and
    not to explain would make the printed command fail."""
    commands = typer.main.get_command(app()).commands  # type: ignore[attr-defined]

    def options(name: str) -> set[str]:
        return {o for p in commands[name].params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}

    for run in ("generate", "judge"):
        for option in sorted(options(run) - options("explain")):
            argv = ["judgestore", run, "--model", "m", option, "value", "--task", "t"]
            assert option not in explain_command_line(argv).split(), option


@pytest.mark.parametrize(
    ("stored", "wanted"),
    [
        ({"engine": {"quantization": None}}, {}),
        ({"engine": {"hf_overrides": {}}}, {}),
        ({"engine": {"trust": True}}, {"engine": {"trust": 1}}),
        ({"chat_template_kwargs": {"docs": [{}]}}, {"chat_template_kwargs": {"docs": [{}, {}]}}),
        ({"engine": {"a.b": 1}}, {"engine": {"a": {"b": 1}}}),
    ],
    ids=["null-vs-absent", "empty-object-vs-absent", "true-vs-1", "list-of-objects-longer", "dotted-key"],
)
def test_every_difference_the_hash_sees_is_a_change_and_adopt_allows_none_it_was_not_told(
    stored: dict[str, object], wanted: dict[str, object]
) -> None:
    """These were "no difference" though the hash told them apart, and adopt --across revision carried rows across
    them (was)."""
    from inference.drift.adopt import allowed

    a = ModelDescriptor(provider="vllm", model="m", **stored)  # type: ignore[arg-type]
    b = ModelDescriptor(provider="vllm", model="m", **wanted)  # type: ignore[arg-type]
    assert a.sha256() != b.sha256()
    changes = descriptor_changes(a, b)
    assert changes and not any(allowed(c.field, ["revision"]) for c in changes)
    assert all(c.text() for c in changes)


def test_a_long_value_is_shown_where_it_differs() -> None:
    """Two stop strings alike in their first characters were shown as the same text (was)."""
    stop = "### End of the answer, reviewer section follows: v"
    a = ModelDescriptor(provider="vllm", model="m", sampling={"stop": [stop + "1"]})
    b = ModelDescriptor(provider="vllm", model="m", sampling={"stop": [stop + "2"]})
    (change,) = descriptor_changes(a, b)
    old, new = change.text().removeprefix("sampling.stop ").split(" -> ")
    assert old != new and "v1" in old and "v2" in new


def test_an_empty_object_that_gains_a_key_is_that_key_added_alone() -> None:
    """The first mend of empty objects listed `engine.hf_overrides {} -> (none)` beside the added key, and adopt
    --across engine.hf_overrides.dtype refused it (was)."""
    a = ModelDescriptor(provider="vllm", model="m", engine={"hf_overrides": {}})
    b = ModelDescriptor(provider="vllm", model="m", engine={"hf_overrides": {"dtype": "bfloat16"}})
    assert [c.field for c in descriptor_changes(a, b)] == ["engine.hf_overrides.dtype"]
    assert [c.field for c in descriptor_changes(b, a)] == ["engine.hf_overrides.dtype"]


def test_a_key_holding_a_dot_always_adds_the_change_no_field_names() -> None:
    """Beside another change, a dotted key's difference was hidden behind it, and --across that field let it pass."""
    a = ModelDescriptor(provider="vllm", model="m", engine={"a.b": 1, "c": 2})
    b = ModelDescriptor(provider="vllm", model="m", engine={"a": {"b": 1}, "c": 3})
    assert [c.field for c in descriptor_changes(a, b)] == ["engine.c", "(descriptor)"]


def test_a_long_value_that_only_grew_is_shown_where_it_grew() -> None:
    short = "You are a helpful assistant who answers briefly and well."
    a = ModelDescriptor(provider="vllm", model="m", chat_template_kwargs={"sys": short})
    b = ModelDescriptor(provider="vllm", model="m", chat_template_kwargs={"sys": short + " Cite sources."})
    (change,) = descriptor_changes(a, b)
    old, new = change.text().removeprefix("chat_template_kwargs.sys ").split(" -> ")
    assert old != new and "Cite" in new


@pytest.mark.parametrize(("stored", "wanted", "shown"), [
    ({"engine": {"quantization": None}}, {}, "engine.quantization null -> (absent)"),
    ({}, {"engine": {"quantization": None}}, "engine.quantization (absent) -> null"),
])  # fmt: skip
def test_a_null_against_an_absent_setting_says_which_side_is_null(
    stored: dict[str, object], wanted: dict[str, object], shown: str
) -> None:
    """Explain said "null on one side, absent on the other" without which, its JSON null for both (was)."""
    a = ModelDescriptor(provider="vllm", model="m", **stored)  # type: ignore[arg-type]
    b = ModelDescriptor(provider="vllm", model="m", **wanted)  # type: ignore[arg-type]
    (change,) = descriptor_changes(a, b)
    assert change.text() == shown
    assert change.absent == ("wanted" if stored else "stored") == change.as_dict()["absent"]  # --json says it too
