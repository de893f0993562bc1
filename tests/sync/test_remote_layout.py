"""Remote paths and metadata are untrusted: only what judgestore itself writes is accepted."""

from __future__ import annotations

import pytest

from store.errors import RemoteMetadataError, UnsafeRemotePathError, UntrustedContentError
from store.layout import Location, metadata_bytes
from store.sync.remote_layout import metadata_path, parse_remote_path, shard_path, verify_remote_metadata
from tests.sync.helpers import QWEN, QWEN_FOLDER

LOCATION = Location.of("completions", "mt-bench", QWEN)
SHA = "ab" * 32


def test_the_two_shapes_of_a_remote_path_parse_back_to_their_location() -> None:
    assert parse_remote_path(metadata_path(LOCATION)).location == LOCATION
    parsed = parse_remote_path(shard_path(LOCATION, SHA))
    assert parsed.location == LOCATION and parsed.shard == SHA
    assert parsed.location.model == "Qwen/Qwen3-8B"  # Qwen%2FQwen3-8B on the remote


@pytest.mark.parametrize(
    "path",
    [
        f"completions/../../etc/x/{LOCATION.descriptor_hash16}/metadata.json",
        f"/{QWEN_FOLDER}/metadata.json",
        f"{QWEN_FOLDER}//metadata.json",
        f"{QWEN_FOLDER}/./metadata.json",
        f"{QWEN_FOLDER}\\metadata.json",
        f"{QWEN_FOLDER}/shards/{SHA}.jsonl.gz\n",
        QWEN_FOLDER.replace("mt-bench", "%2E%2E") + "/metadata.json",
        QWEN_FOLDER.replace("Qwen%2F", "Qwen%2f") + "/metadata.json",  # the same name, spelled differently
        QWEN_FOLDER.replace("mt-bench", "mt%2Dbench") + "/metadata.json",
    ],
)
def test_paths_that_escape_or_alias_are_unsafe(path: str) -> None:
    with pytest.raises(UnsafeRemotePathError):
        parse_remote_path(path)


@pytest.mark.parametrize(
    "path",
    [
        f"embeddings/mt-bench/vllm/m/{LOCATION.descriptor_hash16}/metadata.json",
        f"{QWEN_FOLDER.rsplit('/', 1)[0]}/NOTAHASH12345678/metadata.json",
        f"{QWEN_FOLDER}/completions.db",
        f"{QWEN_FOLDER}/shards/{SHA}.jsonl",
        f"{QWEN_FOLDER}/shards/{SHA[:-1]}.jsonl.gz",
        f"{QWEN_FOLDER}/shards/deeper/{SHA}.jsonl.gz",
        f"{QWEN_FOLDER}",
    ],
)
def test_anything_but_metadata_and_shards_is_refused(path: str) -> None:
    with pytest.raises(UntrustedContentError):
        parse_remote_path(path)


def test_metadata_is_accepted_only_byte_for_byte() -> None:
    data = metadata_bytes("completions", "mt-bench", QWEN)
    assert verify_remote_metadata(data, LOCATION).descriptor == QWEN
    with_assumptions = metadata_bytes("completions", "mt-bench", QWEN, ("chat template guessed",))
    assert verify_remote_metadata(with_assumptions, LOCATION).assumptions == ("chat template guessed",)

    with pytest.raises(RemoteMetadataError, match="byte-identical"):
        verify_remote_metadata(data.replace(b"\n", b"\r\n"), LOCATION)
    with pytest.raises(RemoteMetadataError, match="lies in the folder"):
        verify_remote_metadata(metadata_bytes("completions", "other-task", QWEN), LOCATION)
    with pytest.raises(RemoteMetadataError, match="lies in the folder"):
        edited = data.replace(b'"max_tokens": 16', b'"max_tokens": 17')
        assert edited != data
        verify_remote_metadata(edited, LOCATION)
    with pytest.raises(RemoteMetadataError, match=r"not a judgestore metadata\.json"):
        verify_remote_metadata(b"[1, 2]", LOCATION)
    with pytest.raises(RemoteMetadataError, match="far smaller"):
        verify_remote_metadata(b" " * (2 * 1024 * 1024), LOCATION)
