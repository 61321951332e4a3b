"""XXH3-64 (seed 0) as the format writes it: 16 lowercase hex digits."""

import re
from typing import Any, Optional

import xxhash

_HEX64 = re.compile(r"[0-9a-fA-F]{16}")


def xxh3(data) -> int:
    """The XXH3-64 of a bytes-like object (a memoryview of a mapping hashes in place)."""
    return xxhash.xxh3_64_intdigest(data)


def hash_hex(value: int) -> str:
    return f"{value:016x}"


def parse_hash(text: Any) -> Optional[int]:
    """The hash written as `text`, or None when it is not 16 hex digits. Upper-case digits
    are accepted, as the C++ reader's strtoull accepts them."""
    if not isinstance(text, str) or not _HEX64.fullmatch(text):
        return None
    return int(text, 16)
