"""Which descriptor each legacy source's rows are imported under: the resolver of ``judgestore import``.

Contract: :class:`LegacyDescriptorMapper` is the
:data:`~store.legacy.importer.Resolver` passed to
:func:`store.legacy.importer.import_sources`. For each detected source it
returns an :class:`~store.legacy.importer.Attribution`, never a guess:

* A source with an S3+ or S2 ``metadata.json`` is mapped with the live rules
  (:mod:`inference.legacy.settings`). The resolved model revision and the
  chat template's hash were never recorded: without
  ``--assume-current-model`` such sources are skipped, with the reason and
  the option to use. ``--assume-current-model MODEL`` (the legacy model id or
  path, as recorded) or ``LEGACY=CURRENT`` (the legacy model is now at
  CURRENT, a hub id or folder, which is then the descriptor's model) resolves
  both from the model as it is now, exactly as a live run would; the
  assumption is written into ``metadata.json`` (``assumptions``), and so is
  every ``--assume-setting`` that filled a gap: ``KEY=VALUE`` for every
  source, ``ROLE:KEY=VALUE`` (``judgements:logprobs=5``) for the sources of
  that role only.
* ``--descriptor FILE`` (:mod:`inference.legacy.user_descriptor`) imports the
  sources that cannot be mapped (S0, S1, DataFrame caches, other providers,
  sources without an assumption). It applies to one legacy descriptor at
  most: sources carrying two different legacy descriptors are refused rather
  than merged under one.
* Report notes say which live settings hit the imported rows, and warn when
  the installed vLLM differs from the one that produced them; then they give
  the exact ``judgestore adopt`` command (:func:`inference.drift.adopt.adopt_command_line`)
  that audits those rows with the installed vLLM and, if they come out the
  same, adopts them for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from inference.backends.vllm.descriptor import backend_version as installed_backend_version
from inference.drift.adopt import adopt_command_line
from inference.legacy.settings import live_spec, map_legacy_descriptor, settings_line
from inference.legacy.user_descriptor import UserDescriptor
from inference.spec import ModelSpec
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError, LegacyMappingError
from store.legacy.detect import JUDGES_SHOWN, Detection, LegacyVariant
from store.legacy.importer import Attribution
from store.legacy.metadata import MetadataForm
from store.roles import ROLES, Role


def parse_assumed_models(values: Sequence[str]) -> dict[str, str]:
    """``--assume-current-model`` values: ``MODEL`` (as recorded) or ``LEGACY=CURRENT``; legacy -> current."""
    result: dict[str, str] = {}
    for value in values:
        legacy, sep, current = value.partition("=")
        legacy, current = (legacy, current) if sep else (value, value)
        if not legacy or not current:
            raise InvalidInputError(f"--assume-current-model expects MODEL or LEGACY=CURRENT, got {value!r}")
        if legacy in result and result[legacy] != current:
            raise InvalidInputError(f"--assume-current-model names {legacy!r} twice")
        result[legacy] = current
    return result


def _same_model(a: str, b: str) -> bool:
    """Two spellings of one model: equal ids, or paths of the same folder."""
    if a == b:
        return True
    try:
        return os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b)
    except OSError:
        return False


def _by_role(settings: Mapping[str, Any]) -> dict[Role | None, dict[str, Any]]:
    """``--assume-setting`` values by the role they are for: ``judgements:logprobs=5`` a judge's sources only (a
    whole data folder holds completion caches too, whose rows the setting would then key apart), ``logprobs=5``
    every source's."""
    by_role: dict[Role | None, dict[str, Any]] = {}
    for key, value in settings.items():
        role, _, name = key.rpartition(":")
        if role and role not in ROLES:
            raise InvalidInputError(
                f"--assume-setting {key}: {role!r} is no role; give KEY=VALUE, or ROLE:KEY=VALUE with ROLE one of "
                f"{', '.join(ROLES)}"
            )
        by_role.setdefault(cast(Role, role) if role else None, {})[name] = value
    return by_role


class LegacyDescriptorMapper:
    """The :data:`~store.legacy.importer.Resolver` of ``judgestore import``: live rules, assumptions, --descriptor."""

    def __init__(
        self,
        *,
        user_descriptor: UserDescriptor | None = None,
        assume_current_model: Mapping[str, str] | None = None,
        assume_settings: Mapping[str, Any] | None = None,
        detections: Sequence[Detection] = (),
        task: str | None = None,
    ) -> None:
        self.task = task  # for sources outside a legacy tree (``--task``): the task of the adopt command
        self.user = user_descriptor
        self.assumed_models = dict(assume_current_model or {})
        self.assumed_settings = _by_role(assume_settings or {})
        self._derived: dict[Path, Attribution] = {}
        # --descriptor may name one legacy descriptor, never merge several: find out which sources would use it. An
        # S1 metadata.json names its model only: two models are two descriptors (was: merged, the one's rows hits
        # of the other's run).
        falling_back = {
            d.metadata.sha256 if d.metadata.form is not MetadataForm.S1 else f"S1 {d.metadata.model}"
            for d in detections
            if d.ok
            and d.kind != "metadata"
            and d.metadata is not None
            and (
                d.metadata.form in (MetadataForm.S3, MetadataForm.S2)
                or (d.metadata.form is MetadataForm.S1 and d.metadata.model is not None)
            )
            and self._derive(d).descriptor is None
        }
        self._user_refused = len(falling_back) > 1 and self.user is not None
        # Nor several judges: S0 files name theirs in each row, and one judge's verdicts would become conflicts of
        # another's under one descriptor (the same judge prompt, another verdict).
        self._s0_judges = sorted({judge for d in detections if d.ok and d.variant is LegacyVariant.S0
                                  for judge in d.judges})  # fmt: skip

    def _settings_for(self, role: Role | None) -> dict[str, Any]:
        """The settings assumed for a source of ``role``: those given for every role, then its own."""
        return {**self.assumed_settings.get(None, {}), **(self.assumed_settings.get(role, {}) if role else {})}

    def _assumed_model_for(self, legacy: str) -> str | None:
        for name, current in self.assumed_models.items():
            if _same_model(name, legacy):
                return current
        return None

    def _derive(self, detection: Detection) -> Attribution:
        """The attribution from the legacy metadata alone (and the assumptions given), cached per source."""
        cached = self._derived.get(detection.path)
        if cached is not None:
            return cached
        self._derived[detection.path] = result = self._derive_uncached(detection)
        return result

    def _derive_uncached(self, detection: Detection) -> Attribution:
        metadata = detection.metadata
        if metadata is None or metadata.form not in (MetadataForm.S3, MetadataForm.S2):
            what = detection.variant or "this file"
            return Attribution(None, reason=f"{what} records no descriptor", advice="import it with --descriptor FILE")
        try:
            recorded, _ = live_spec(metadata, assumed=self._settings_for(detection.role))
        except LegacyMappingError as e:
            return Attribution(None, reason=str(e))
        current = self._assumed_model_for(recorded.model)
        if current is None:
            return Attribution(
                None,
                reason=(
                    f"the legacy descriptor does not record the resolved revision or chat template of "
                    f"{recorded.model!r}"
                ),
                advice=(
                    f"pass --assume-current-model {recorded.model!r} to resolve them from the model as it is now "
                    "(recorded as an assumption), or --descriptor FILE"
                ),
            )
        try:
            descriptor, spec, assumed_notes = map_legacy_descriptor(
                metadata, model=current, assumed=self._settings_for(detection.role)
            )
            descriptor.sha256()  # a value no key can hold (an integer over 64 bits): this source fails, alone
        except InvalidInputError as e:  # LegacyMappingError among them
            return Attribution(None, reason=f"the legacy descriptor cannot be mapped: {e}")
        today = datetime.now(UTC).date().isoformat()
        assumptions = [
            f"legacy cache recorded no revision or chat template for {metadata.model!r}; both were resolved from "
            f"{current!r} as it was on {today} (revision {descriptor.revision})"
        ]
        assumptions += [f"legacy run assumed to have used {note} (not recorded by the file)" for note in assumed_notes]
        notes = [f"live settings that hit these rows: {settings_line(spec)}"]
        engine_notes, adopt = self._engine_notes(detection, spec, descriptor)
        return Attribution(descriptor, tuple(assumptions), notes=(*notes, *engine_notes), role_notes=tuple(adopt))

    def _engine_notes(
        self, detection: Detection, spec: ModelSpec | None, descriptor: ModelDescriptor
    ) -> tuple[list[str], list[tuple[Role, str]]]:
        """What the rows of another vLLM than this machine's hit (nothing, here), and the ``judgestore adopt``
        command that carries them over, by role (none without the live settings, ``spec``)."""
        if descriptor.provider != "vllm":  # a hosted API's or a server's: no engine of this machine's runs it
            return [], []
        installed = installed_backend_version()
        produced = descriptor.backend_version
        if produced is not None and produced == installed:
            return [], []
        # A --descriptor file may name no version (it is optional): "vLLM None" was said (was)
        by = f"vLLM {produced}" if produced else "a vLLM the descriptor does not name (no backend_version)"
        if installed is None:  # a core install: judgestore without its vllm extra
            return [
                f"rows were produced by {by}; vLLM is not installed here, so no run on this machine can use them "
                f"yet: install {by if produced else 'that vLLM'} to hit them as they are, or a newer vLLM and then "
                "`judgestore adopt` them "
                "(it audits a sample with the new engine first)"
            ], []
        note = (
            f"rows were produced by {by}; this machine has {installed}: a live run here computes another descriptor "
            "and will not hit them (a different engine may change outputs)"
        )
        return [note], [] if spec is None else self._adopt_notes(detection, spec, descriptor, installed)

    def _adopt_notes(
        self, detection: Detection, spec: ModelSpec, descriptor: ModelDescriptor, installed: str | None
    ) -> list[tuple[Role, str]]:
        """The ``judgestore adopt`` command for each role of the source (S2 sources may hold both), by role: the
        importer keeps those of the roles it found rows of."""
        task = detection.tree.task if detection.tree is not None else self.task
        if task is None:
            return []  # the importer skips the source: no task
        notes: list[tuple[Role, str]] = []
        for role in (detection.role,) if detection.role is not None else ROLES:
            try:
                command = adopt_command_line(spec, role=role, task=task, source=descriptor.hash16())
            except InvalidInputError as e:
                notes.append((role, f"to use them with vLLM {installed}, audit and adopt them from Python: {e}"))
                continue
            audit = (
                f"to audit {role} with vLLM {installed} (add the engine arguments this machine needs that change no "
                f"output, such as kv_cache_memory_bytes) and adopt them if they come out the same, run: {command}"
            )
            notes.append((role, audit))
        return notes

    def __call__(self, detection: Detection) -> Attribution:
        derived = self._derive(detection)
        if derived.descriptor is not None or self.user is None:
            return derived
        if self._user_refused and detection.metadata is not None:
            return Attribution(
                None,
                reason=(
                    "--descriptor applies to one legacy descriptor, and the sources given carry several: "
                    "import each legacy descriptor folder on its own"
                ),
            )
        if detection.variant is LegacyVariant.S0 and len(self._s0_judges) > 1:
            shown = ", ".join(repr(j) for j in self._s0_judges[:JUDGES_SHOWN])
            more = ", ..." if len(self._s0_judges) > JUDGES_SHOWN else ""
            return Attribution(
                None,
                reason=(
                    f"--descriptor names one judge, and the S0 files given hold the verdicts of several "
                    f"({shown}{more}): import each judge's files on their own, each with its judge's --descriptor"
                ),
            )
        # The reason without its advice: --descriptor, which it names, is what was given
        notes = [f"not mapped from its legacy descriptor ({derived.reason}): imported under --descriptor"]
        notes = notes if detection.metadata else []
        # An older vLLM the file names: said, with the adopt command, as for a mapped legacy descriptor (was: nothing)
        engine_notes, adopt = self._engine_notes(detection, self.user.spec, self.user.descriptor)
        return Attribution(self.user.descriptor, (self.user.assumption,), notes=(*notes, *engine_notes),
                           role_notes=tuple(adopt))  # fmt: skip
