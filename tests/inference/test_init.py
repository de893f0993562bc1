"""inference/__init__.py: the public names resolve to the modules that define them, and cost nothing until used."""

from __future__ import annotations

import importlib

import pytest

import inference
from tests.inference.conftest import run_fresh_python


@pytest.mark.parametrize("name", inference.__all__)
def test_every_public_name_is_the_object_its_module_defines(name: str) -> None:
    module = importlib.import_module(inference._WHERE[name])
    assert getattr(inference, name) is getattr(module, name)
    assert name in dir(inference)


def test_a_name_that_is_not_public_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'cached'"):
        inference.cached  # noqa: B018  (the old flat module's name: it is a room's module now)


def test_importing_the_package_imports_none_of_its_modules_nor_an_engine() -> None:
    code = (
        "import sys, inference\n"
        "print(sorted(m for m in sys.modules if m.startswith('inference.')))\n"
        "from inference import CachedModel, HostedSpec, ModelSpec, run_requests\n"
        "print(sorted(m for m in ('vllm', 'torch', 'transformers', 'openai') if m in sys.modules))\n"
    )
    assert run_fresh_python(code).stdout.split("\n")[:2] == ["[]", "[]"]
