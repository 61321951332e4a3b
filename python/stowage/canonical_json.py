"""The JSON text nlohmann::json's dump() writes, which metadata_xxh3 hashes.

FORMAT.md defines metadata_xxh3 as the XXH3-64 of the parsed document, without that
field, serialised compactly with sorted keys as nlohmann::json's dump() does. Python's
json module differs from it in the details that matter for a hash (how a float is
written, which numbers are floats at all), so this module does both halves the way the
C++ reader does: parse() makes the same value types nlohmann's parser makes, and dump()
writes them as nlohmann's serializer does:

- objects and arrays without spaces, object keys sorted by their UTF-8 bytes;
- strings as UTF-8, escaping only '"', '\\' and control characters (\\b \\f \\n \\r \\t,
  else \\u00xx in lower case);
- integers in decimal; a float as Grisu2's digits (grisu2.py: not always repr()'s),
  laid out as printf's %g would with at least one fractional digit ("1.0", "0.001",
  "1e+21", "1.5e-07"), -0.0 as "-0.0".
"""

import json
from typing import Any

from . import grisu2

_INT64_MIN = -(2 ** 63)
_UINT64_MAX = 2 ** 64 - 1
# nlohmann writes a float in fixed notation when its decimal point falls within these
# bounds of the first digit (dtoa_impl::format_buffer's kMinExp, kMaxExp).
_MIN_EXPONENT = -4
_MAX_EXPONENT = 15


class CanonicalJsonError(ValueError):
    """Text nlohmann's parser would reject, or a value its serializer cannot write."""


def _parse_int(text: str) -> Any:
    # nlohmann keeps an integer in 64 bits (signed below zero, unsigned above) and reads
    # one that does not fit as a double, which the hash then sees as a double.
    value = int(text)
    if _INT64_MIN <= value <= _UINT64_MAX:
        return value
    return _parse_float(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise CanonicalJsonError(f"number {text} is out of range")
    return value


def _reject_constant(name: str) -> Any:
    raise CanonicalJsonError(f"'{name}' is not JSON")


def parse(data: bytes) -> Any:
    """Parses UTF-8 JSON as nlohmann's parser does: strict UTF-8 (a leading BOM skipped),
    no NaN or Infinity literals, no numbers beyond a double's range, no unpaired UTF-16
    surrogates in escapes. Raises CanonicalJsonError (or ValueError) otherwise."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CanonicalJsonError(f"invalid UTF-8 at byte {error.start}") from None
    value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_reject_constant)
    dump(value)  # an unpaired surrogate escape parses in Python only: reject it here too
    return value


def dump(value: Any) -> str:
    """The compact text nlohmann::json::dump() writes for a value parse() returned."""
    parts: list = []
    _dump_into(value, parts)
    text = "".join(parts)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalJsonError("a string holds an unpaired UTF-16 surrogate") from None
    return text


def _dump_into(value: Any, parts: list) -> None:
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, int):
        parts.append(str(value))
    elif isinstance(value, float):
        parts.append(format_float(value))
    elif isinstance(value, str):
        parts.append(_dump_string(value))
    elif isinstance(value, list):
        parts.append("[")
        for i, item in enumerate(value):
            if i:
                parts.append(",")
            _dump_into(item, parts)
        parts.append("]")
    elif isinstance(value, dict):
        parts.append("{")
        # Code point order is UTF-8 byte order, which is std::map<std::string>'s.
        for i, key in enumerate(sorted(value)):
            if i:
                parts.append(",")
            parts.append(_dump_string(key))
            parts.append(":")
            _dump_into(value[key], parts)
        parts.append("}")
    else:
        raise CanonicalJsonError(f"cannot serialise a {type(value).__name__}")


def _dump_string(text: str) -> str:
    # json.dumps escapes exactly nlohmann's set when ensure_ascii is off: '"', '\\',
    # \b \f \n \r \t, and other code points below 0x20 as \u00xx in lower case.
    return json.dumps(text, ensure_ascii=False)


def format_float(value: float) -> str:
    """A finite double as nlohmann's dtoa_impl::to_chars writes it."""
    if value != value or value in (float("inf"), float("-inf")):
        return "null"  # what nlohmann writes for them; the format stores "nan" etc. as strings
    sign = "-" if str(value).startswith("-") else ""  # -0.0 keeps its sign
    if value == 0:
        return sign + "0.0"
    digits, exponent = grisu2.digits_and_exponent(abs(value))
    return sign + _layout(digits, exponent)


def _layout(digits: str, exponent: int) -> str:
    # The value is digits * 10**exponent; `point` is where the decimal point falls.
    count = len(digits)
    point = count + exponent
    if count <= point <= _MAX_EXPONENT:
        return digits + "0" * (point - count) + ".0"
    if 0 < point <= _MAX_EXPONENT:
        return digits[:point] + "." + digits[point:]
    if _MIN_EXPONENT < point <= 0:
        return "0." + "0" * -point + digits
    mantissa = digits if count == 1 else digits[0] + "." + digits[1:]
    power = point - 1
    return f"{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
