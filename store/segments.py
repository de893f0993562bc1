"""One folder name of a store: a name percent-encoded, and shortened when it is too long for a file name.

Contract:

* Segments are percent-encoded (``quote(s, safe="")``), so ``Qwen/Qwen3-8B``
  is the one segment ``Qwen%2FQwen3-8B``; empty, ``.`` and ``..`` are
  refused, as is text that is not valid Unicode.
* A segment whose encoding is longer than a file name may be
  (:data:`NAME_MAX_BYTES`) is shortened to its first
  :data:`SHORT_PREFIX_BYTES` bytes (whole characters), ``+`` and the SHA-256
  of the whole name. ``+`` never appears in an encoded segment, so a
  shortened one is known as such; :func:`decode_segment` gives it back as a
  :class:`ShortName`, whose whole name only the folder's metadata.json holds.
* :func:`encode_segment` and :func:`decode_segment` are inverses on every
  canonical segment; a segment in any other spelling is refused.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import quote, unquote

from store.descriptor import sha256_hex
from store.errors import InvalidInputError

NAME_MAX_BYTES = 255  # the longest file name ext4, xfs, btrfs, tmpfs and NFS take


SHORT_PREFIX_BYTES = 120  # what a shortened segment keeps of the encoded name (then "+" and 64 hex)


_LONGEST_ESCAPE = len("%F0%9F%99%82")  # one character, encoded


_SHORTENED = re.compile(r"(?:[A-Za-z0-9_.~-]|%[0-9A-F]{2})*\+[0-9a-f]{64}")
_UNESCAPED = re.compile(r"[A-Za-z0-9_.~-]+")  # the characters quote(safe="") never escapes


class ShortName(str):
    """A name known only by its shortened segment (see the module docstring); its value is the segment.

    The whole name is in the folder's metadata.json. :func:`encode_segment`
    gives the segment back, so a location holding one still has its folder.
    """


def same_name(wanted: str, name: str) -> bool:
    """Whether ``name`` (a location's, perhaps a :class:`ShortName`) is ``wanted`` (a whole name)."""
    if isinstance(name, ShortName):
        return encode_segment(wanted) == name
    return name == wanted


def encode_segment(value: str) -> str:
    """Percent-encode one path segment, shortened if too long (module docstring); reject empty, ``.``, ``..``."""
    if isinstance(value, ShortName):
        return str(value)
    if type(value) is str:
        return _encoded(value)
    return _encode(value)


@functools.lru_cache(maxsize=1 << 16)
def _encoded(value: str) -> str:
    """:func:`_encode` of a plain string, remembered: a store names few tasks and providers, and models and
    descriptors by the thousand at most (a cache smaller than a listing would be emptied by it)."""
    return _encode(value)


def _encode(value: str) -> str:
    if not isinstance(value, str) or value in ("", ".", ".."):
        raise InvalidInputError(f"invalid path segment {value!r}: empty, '.' and '..' are not allowed")
    if len(value) <= NAME_MAX_BYTES and _UNESCAPED.fullmatch(value):  # what quote() would give back unchanged
        return value
    try:
        encoded = quote(value, safe="")
    except UnicodeEncodeError as e:  # lone surrogates have no UTF-8 bytes to encode
        raise InvalidInputError(f"invalid path segment {value!r}: not valid Unicode text ({e})") from e
    if len(encoded) <= NAME_MAX_BYTES:
        return encoded
    prefix, size = [], 0
    for char in value:  # whole characters only: a prefix is itself a canonical segment
        piece = quote(char, safe="")
        if size + len(piece) > SHORT_PREFIX_BYTES:
            break
        prefix.append(piece)
        size += len(piece)
    return f"{''.join(prefix)}+{sha256_hex(value.encode())}"


def decode_segment(segment: str) -> str:
    """Inverse of :func:`encode_segment` (a shortened segment gives a :class:`ShortName`); rejects the rest."""
    # What quote() leaves as it is, short enough not to be shortened, decodes to itself (most names: a fast path).
    if len(segment) <= NAME_MAX_BYTES and _UNESCAPED.fullmatch(segment) and segment not in (".", ".."):
        return segment
    if "+" in segment:
        prefix = segment.partition("+")[0]
        if _SHORTENED.fullmatch(segment) and SHORT_PREFIX_BYTES - _LONGEST_ESCAPE < len(prefix) <= SHORT_PREFIX_BYTES:
            try:
                if quote(unquote(prefix, errors="strict"), safe="") == prefix:
                    return ShortName(segment)
            except UnicodeDecodeError:
                pass
        raise InvalidInputError(f"path segment {segment!r} is neither percent-encoded nor a shortened name")
    value = unquote(segment)
    if encode_segment(value) != segment:
        raise InvalidInputError(f"path segment {segment!r} is not in canonical percent-encoding")
    return value
