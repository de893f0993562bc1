"""Hosted descriptors and specs: what is in the key, what is refused, what is sent.

No server is needed here except for the two runs that show a full hit needs
neither a key nor the ``openai`` library (against the fake in ``tests/fake_openai.py``).
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.backends.base import EngineRequest
from inference.backends.hosted.descriptor import (
    HOSTED_PROTOCOL,
    HostedKeyWarning,
    SamplingKeyWarning,
    hosted_descriptor,
    normalise_endpoint,
)
from inference.backends.hosted.wire import request_body
from inference.requests import CompletionRequest
from inference.spec import DEFAULT_SAMPLING, HostedSpec
from store.errors import InvalidInputError, JudgestoreError, MissingAPIKeyError
from store.store import Store
from tests.fake_openai import FakeOpenAI
from tests.inference.conftest import run_fresh_python

DATED = "gpt-4o-2024-08-06"
PINNED = {"order": ["deepinfra"], "allow_fallbacks": False}


@pytest.fixture(autouse=True)
def _no_keys_or_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "TOGETHER_API_KEY", "VLLM_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def chat(text: str) -> EngineRequest:
    return EngineRequest({"type": "messages", "messages": [{"role": "user", "content": text}]})


# ------------------------------------------------------------------ what is in the key


def test_the_endpoint_is_the_given_url_normalised_else_the_providers_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert normalise_endpoint("vllm-server", "HTTP://GPU-Node-3:8000/v1/") == "http://gpu-node-3:8000/v1"
    # a scheme's default port names the same server: one key (it split the cache, was); another port stays
    assert normalise_endpoint("openai", "https://api.openai.com:443/v1") == "https://api.openai.com/v1"
    assert normalise_endpoint("vllm-server", "http://node:80/v1") == "http://node/v1"
    assert normalise_endpoint("vllm-server", "https://node:80/v1") == "https://node:80/v1"
    assert normalise_endpoint("openai", None) == "https://api.openai.com/v1"
    assert normalise_endpoint("openrouter", None) == "https://openrouter.ai/api/v1"
    assert normalise_endpoint("together", None) == "https://api.together.xyz/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "https://proxy.example.org/openai/v1/")
    assert normalise_endpoint("openai", None) == "https://proxy.example.org/openai/v1"  # honoured for openai
    assert normalise_endpoint("openrouter", None) == "https://openrouter.ai/api/v1"  # and only there
    with pytest.raises(InvalidInputError, match="--base-url"):
        normalise_endpoint("vllm-server", None)  # a served model has no default address


def test_a_trailing_slash_or_a_capital_host_is_the_same_key() -> None:
    one = hosted_descriptor("vllm-server", "judge", base_url="http://Node:8000/v1/")
    two = hosted_descriptor("vllm-server", "judge", base_url="http://node:8000/v1")
    three = hosted_descriptor("vllm-server", "judge", base_url="http://node:8001/v1")
    assert one.sha256() == two.sha256() != three.sha256()


def test_a_hosted_key_holds_provider_model_endpoint_sampling_and_the_request_mapping_version() -> None:
    descriptor = HostedSpec(model=DATED, sampling={"logprobs": 5}).descriptor
    assert (descriptor.provider, descriptor.model, descriptor.endpoint) == (
        "openai",
        DATED,
        "https://api.openai.com/v1",
    )
    assert descriptor.backend_version == HOSTED_PROTOCOL
    assert descriptor.sampling.logprobs == 5
    assert b'"endpoint":"https://api.openai.com/v1"' in descriptor.canonical_json()
    assert b'"routing"' not in descriptor.canonical_json()  # an added field at its default is not hashed


def test_a_hosted_spec_without_sampling_settings_gets_the_same_defaults_as_model_spec() -> None:
    sampling = HostedSpec(model=DATED).descriptor.sampling
    assert (sampling.temperature, sampling.max_tokens) == (
        DEFAULT_SAMPLING["temperature"],
        DEFAULT_SAMPLING["max_tokens"],
    )
    assert HostedSpec(model=DATED, sampling={"max_tokens": 32}).descriptor.sampling.max_tokens == 32


def test_every_sampling_setting_sent_is_in_the_key() -> None:
    base = HostedSpec(model=DATED).descriptor.sha256()
    for change in ({"temperature": 0.7}, {"seed": 1}, {"stop": ["\n"]}, {"logprobs": 2}, {"reasoning_effort": "low"}):
        assert HostedSpec(model=DATED, sampling=change).descriptor.sha256() != base, change


def test_pinned_openrouter_routing_is_another_key_and_unpinned_routing_is_warned_about() -> None:
    model = "meta-llama/llama-3.1-70b-instruct"
    with pytest.warns(HostedKeyWarning, match="not pinned") as caught:
        unpinned = HostedSpec(model=model, provider="openrouter").descriptor
    assert caught[0].filename == __file__
    with pytest.warns(HostedKeyWarning, match="not pinned"):
        fallbacks = HostedSpec(model=model, provider="openrouter", routing={"order": ["deepinfra"]}).descriptor
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pinned = HostedSpec(model=model, provider="openrouter", routing=PINNED).descriptor
    assert len({unpinned.sha256(), fallbacks.sha256(), pinned.sha256()}) == 3
    assert pinned.routing == PINNED
    assert request_body(pinned, chat("hi"))["provider"] == PINNED  # what pins the key is what is sent
    with pytest.raises(InvalidInputError, match="has none"):
        HostedSpec(model="m", provider="together", routing=PINNED).descriptor  # noqa: B018


@pytest.mark.parametrize(
    "routing",
    [{"order": "deepinfra"}, {"only": ["a", 1]}, {"ignore": "azure"}],
    ids=["a-string", "not-names", "ignore"],
)
def test_openrouter_routing_that_names_no_list_of_providers_is_refused(routing: dict[str, object]) -> None:
    """``--routing order=deepinfra`` (a string, not a list) made a key of its own, without a word (was)."""
    with pytest.raises(InvalidInputError, match="must be a list of provider names"):
        HostedSpec(model="m", provider="openrouter", routing=routing).descriptor  # noqa: B018


def test_the_unpinned_routing_warning_gives_the_command_line_form_too() -> None:
    with pytest.warns(HostedKeyWarning) as caught:
        HostedSpec(model="m", provider="openrouter").descriptor  # noqa: B018
    assert "--routing 'order=[\"<provider>\"]' --routing allow_fallbacks=false" in str(caught[0].message)


def test_an_undated_openai_alias_is_warned_about_and_a_dated_snapshot_is_not() -> None:
    with pytest.warns(HostedKeyWarning, match="dated snapshot") as caught:
        HostedSpec(model="gpt-4o").descriptor  # noqa: B018
    assert caught[0].filename == __file__  # the line that asked for it, not judgestore's own
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HostedSpec(model=DATED).descriptor  # noqa: B018
        HostedSpec(model="gpt-4-0613").descriptor  # noqa: B018


SPELT = [("temprature", "temperature"), ("top-p", "top_p"), ("Max_Tokens", "max_tokens")]


@pytest.mark.parametrize(("spelt", "meant"), SPELT)
def test_a_sampling_setting_spelt_almost_like_a_known_one_is_warned_of_and_still_sent(spelt: str, meant: str) -> None:
    """A server ignores a setting it does not know: ``temprature`` was sent and hashed without a word (was)."""
    server = {"model": "m", "provider": "vllm-server", "base_url": "http://h/v1"}
    with pytest.warns(SamplingKeyWarning, match=f"did you mean '{meant}'") as caught:
        descriptor = HostedSpec(**server, sampling={spelt: 0.5}).descriptor
    assert caught[0].filename == __file__
    assert request_body(descriptor, chat("hi"))[spelt] == 0.5  # a provider's own setting may look like one
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a provider's own settings that look like none of judgestore's: no word
        assert HostedSpec(**server, sampling={"min_tokens": 2, "reasoning_effort": "low"}).descriptor


def test_chat_template_kwargs_reach_a_vllm_server_only() -> None:
    spec = HostedSpec(model="m", provider="vllm-server", base_url="http://h:8000/v1", enable_thinking=False)
    assert request_body(spec.descriptor, chat("hi"))["chat_template_kwargs"] == {"enable_thinking": False}
    spelled = HostedSpec(
        model="m", provider="vllm-server", base_url="http://h:8000/v1", chat_template_kwargs={"enable_thinking": False}
    )
    assert spelled.descriptor.sha256() == spec.descriptor.sha256()  # either spelling hashes alike
    with pytest.raises(InvalidInputError, match="vllm-server only"):
        HostedSpec(model=DATED, enable_thinking=False).descriptor  # noqa: B018


# ------------------------------------------------------------------ secrets


SECRET = "sk-proj-THISISASECRETKEY0123456789abcdef"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sampling", {"api_key": "x"}),
        ("sampling", {"extra_headers": {"Authorization": "x"}}),
        ("sampling", {"user": f"Bearer {SECRET}"}),
        ("sampling", {"stop": [SECRET]}),
        ("routing", {"order": ["x"], "allow_fallbacks": False, "token": "abc"}),
        ("base_url", "https://user:pw@api.example.org/v1"),
        ("base_url", f"https://api.example.org/v1?key={SECRET}"),
        ("revision", SECRET),
    ],
)
def test_anything_that_looks_like_a_secret_is_refused_without_being_shown(field: str, value: object) -> None:
    provider = "openrouter" if field == "routing" else "vllm-server"
    kwargs = {"base_url": "http://h:8000/v1", field: value}
    with pytest.raises(InvalidInputError) as caught:
        HostedSpec(model="m", provider=provider, **kwargs).descriptor  # type: ignore[arg-type]  # noqa: B018
    assert SECRET not in str(caught.value) and "pw@" not in str(caught.value)


def test_the_value_of_a_key_in_the_environment_is_refused_wherever_it_appears(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_JUDGE_KEY", "plain-looking-but-secret")
    with pytest.raises(InvalidInputError, match=r"sampling\.stop\[0\] holds what looks like an API key") as caught:
        HostedSpec(model=DATED, api_key_env="MY_JUDGE_KEY", sampling={"stop": ["plain-looking-but-secret"]}).descriptor  # noqa: B018
    assert "plain-looking-but-secret" not in str(caught.value)


def test_the_spec_holds_the_name_of_the_key_never_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    spec = HostedSpec(model=DATED)
    assert spec.key_env == "OPENAI_API_KEY"
    assert SECRET not in repr(spec) and SECRET.encode() not in spec.descriptor.canonical_json()


# ------------------------------------------------------------------ a full hit needs no key and no openai


def test_a_missing_key_is_a_typed_error_naming_the_variable_only_when_something_is_missing(
    store: Store, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openai")
    spec = HostedSpec(model="fake-judge", provider="vllm-server", base_url=fake.base_url, api_key_env="JUDGE_KEY")
    with pytest.raises(MissingAPIKeyError, match="JUDGE_KEY is not set"):
        spec.cached(store, task="t").complete([CompletionRequest(messages=[{"role": "user", "content": "hi"}])])
    monkeypatch.setenv("JUDGE_KEY", "")  # set, to nothing: said as it is (it read "is not set")
    with pytest.raises(MissingAPIKeyError, match="JUDGE_KEY is empty"):
        spec.cached(store, task="t").complete([CompletionRequest(messages=[{"role": "user", "content": "hi"}])])
    assert fake.completions() == []
    monkeypatch.setenv("JUDGE_KEY", "k-123456789")
    spec.cached(store, task="t").complete([CompletionRequest(messages=[{"role": "user", "content": "hi"}])])
    monkeypatch.delenv("JUDGE_KEY")
    (hit,) = spec.cached(store, task="t").complete([CompletionRequest(messages=[{"role": "user", "content": "hi"}])])
    assert hit.cached and len(fake.completions()) == 1


_FULL_HIT_RUN = """
import re
import sys
from inference.spec import HostedSpec
from inference.requests import CompletionRequest
from store.store import Store

spec = HostedSpec(model="fake-judge", provider="vllm-server", base_url=sys.argv[1])
with Store(root=sys.argv[2]) as store, spec.cached(store, task="t") as model:
    responses = model.complete([CompletionRequest(messages=[{"role": "user", "content": f"q{i}"}]) for i in range(3)])
assert all(r.cached for r in responses) and not model.engine_loaded
print("openai imported:", "openai" in sys.modules, "vllm imported:", "vllm" in sys.modules)
"""


def test_a_full_hit_run_never_imports_openai_nor_contacts_the_server(store: Store) -> None:
    pytest.importorskip("openai")  # to fill the store
    with FakeOpenAI() as fake:
        spec = HostedSpec(model="fake-judge", provider="vllm-server", base_url=fake.base_url)
        spec.cached(store, task="t").complete(
            [CompletionRequest(messages=[{"role": "user", "content": f"q{i}"}]) for i in range(3)]
        )
        base_url = fake.base_url
    # The server is gone: a full hit must not need it.
    result = run_fresh_python(
        _FULL_HIT_RUN.replace("sys.argv[1]", repr(base_url)).replace("sys.argv[2]", repr(str(store.root)))
    )
    assert "openai imported: False vllm imported: False" in result.stdout


def test_without_the_openai_library_a_miss_says_how_to_install_it(
    store: Store, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # as if it were not installed
    spec = HostedSpec(model="fake-judge", provider="vllm-server", base_url=fake.base_url)
    with pytest.raises(JudgestoreError, match=r"pip install 'openai>=1.50'` \(judgestore's openai extra"):
        spec.cached(store, task="t").complete([CompletionRequest(messages=[{"role": "user", "content": "hi"}])])


def test_a_run_reports_what_it_sent_not_what_its_spec_ever_sent(fake: FakeOpenAI, store_root: Path) -> None:
    """A spec counts every request its backends sent; a second run of it that is all hits sent nothing."""
    from inference.run import run_requests
    from store.settings import Settings

    spec = HostedSpec(model="fake-judge", provider="vllm-server", base_url=fake.base_url)
    requests = [CompletionRequest(messages=[{"role": "user", "content": f"q{i}"}]) for i in range(3)]
    settings = Settings(store_root=store_root)
    first = run_requests(spec, requests, role="completions", task="t", settings=settings).summary
    again = run_requests(spec, requests, role="completions", task="t", settings=settings).summary
    assert first.sent is not None and first.sent["requests_sent"] == 3 and first.sent["completion_tokens"] > 0
    assert again.sent == {key: 0 for key in first.sent} and again.as_dict()["requests_sent"] == 0
    assert len(fake.completions()) == 3


@pytest.mark.parametrize(
    ("field", "value"), [("max_concurrency", "4"), ("max_concurrency", 2.5), ("timeout_s", -1), ("timeout_s", "9")]
)
def test_a_setting_of_the_wrong_type_is_a_typed_error_when_the_spec_is_made(field: str, value: object) -> None:
    with pytest.raises(InvalidInputError, match=f"{field} must be"):
        HostedSpec(model="m", provider="vllm-server", base_url="http://127.0.0.1:9/v1", **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"model": ""}, "model must name a model"),
        ({"model": "  "}, "model must name a model"),
        ({"model": "m", "sampling": [("max_tokens", 3)]}, "sampling must be a mapping of settings"),
        ({"model": "m", "engine_kwargs": None}, "engine_kwargs must be a mapping of settings"),
        ({"model": "m", "routing": None}, "routing must be a mapping of settings"),
    ],
)
def test_a_spec_refuses_an_empty_model_or_settings_that_are_no_mapping_by_name(
    kwargs: dict[str, object], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ModelSpec(model="") loaded the model in the current folder; engine_kwargs=None and a list of sampling pairs
    failed later with a TypeError (was)."""
    from inference.spec import ModelSpec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text("{}")  # a folder that looks like a model: "" must not name it
    spec = HostedSpec if "routing" in kwargs else ModelSpec
    with pytest.raises(InvalidInputError, match=said):
        spec(**kwargs)  # type: ignore[arg-type]
    if kwargs["model"] == "":
        with pytest.raises(InvalidInputError, match=said):
            HostedSpec(model="")


@pytest.mark.parametrize("given", ["sk-" + "S3cretKey9" * 3, "hf_" + "S3cretKey9" * 3, "S3cretKey9 with a space"])
def test_a_key_given_where_its_variables_name_goes_is_refused_without_showing_it(given: str) -> None:
    """``--api-key-env "$OPENAI_API_KEY"``: the message about the missing variable printed the key (was)."""
    with pytest.raises(InvalidInputError, match=r"api_key_env \(--api-key-env\)") as refused:
        HostedSpec(model=DATED, api_key_env=given)
    assert "S3cretKey9" not in str(refused.value)
    for name in ("MY_TEAM_KEY", "HF_TOKENFORORGANISATION", "XAI_APIKEYFORPRODUCTION", "my-key"):  # names, not keys
        assert HostedSpec(model=DATED, api_key_env=name).key_env == name


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"sampling": {"seed": "sk-" + "S3cretKey9" * 3}}, "sampling.seed holds what looks like an API key"),
        ({"sampling": {"extra": {"sk-" + "S3cretKey9" * 3: 1}}}, "sampling.extra holds a name that looks like"),
        ({"provider": "vllm-server", "base_url": "http://127.0.0.1:sk-" + "S3cretKey9" * 3 + "/v1"}, "base URL holds"),
        ({"provider": "vllm-server", "base_url": "http://127.0.0.1:S3cretKey9/v1"}, "base URL is not a URL"),
    ],
)
def test_a_refusal_never_quotes_the_secret_it_refuses(spec: dict[str, Any], said: str) -> None:
    """A key given as a seed was refused by the sampling parser, which quoted it; a key as a port by urllib, which
    quoted it; a key as a name inside a setting was named in the path of the refusal (was)."""
    with pytest.raises(InvalidInputError, match=re.escape(said)) as refused:
        HostedSpec(**{"model": DATED, **spec}).descriptor  # noqa: B018
    assert "S3cretKey9" not in str(refused.value)
