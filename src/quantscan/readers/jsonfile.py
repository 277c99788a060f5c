"""JSON: one parser and one file reader, every decode error and limit a ValueError or a one-line FileError.

Why its own module: `json.loads` fails in more ways than `JSONDecodeError` (an integer of more than
4,300 digits is a plain ValueError; nesting beyond the interpreter's limit a RecursionError), and a file
that parses can still be nested deeply enough to overflow the recursion of whatever walks it next (the
bisect session's digest, `jsonable`). The depth is therefore measured on the text, without recursion,
before anything parses it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from quantscan.errors import FileError
from quantscan.readers.text import decode_utf8, read_bytes

MAX_JSON_DEPTH = 100
"""The deepest nesting accepted. Every JSON file quantscan writes nests under 10 levels; 100 leaves room
for hand-written files and stays far below Python's recursion limit for the code that walks them."""

MAX_JSON_BYTES = 1 << 28
"""The largest JSON file read (a session of 10^5 sites is a few MB)."""

_ONLY_SYNTAX = {c: None for c in range(128) if chr(c) not in '[]{}"'}
"""str.translate table deleting every ASCII character but brackets and quotes."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


def json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep the arrays/objects of `text` nest (strings skipped), counted up to `limit` + 1 and no further.

    No recursion and no per-character Python loop: each pass deletes the innermost bracket pairs (a C
    regex), so the passes are the depth. Brackets that do not pair up stop the count early; json.loads
    then says where the text is wrong."""
    brackets = _NOT_BRACKET.sub("", "".join(_syntax(text).split('"')[::2]))  # odd pieces: inside strings
    depth = 0
    while brackets and depth <= limit:
        inner = _INNERMOST.sub("", brackets)
        if inner == brackets:
            break
        brackets, depth = inner, depth + 1
    return depth


def _syntax(text: str) -> str:
    """The text's brackets and string quotes only. Escaped backslashes, then escaped quotes, go first (the
    order the decoder reads them), so every remaining quote opens or closes a string."""
    return text.replace("\\\\", "").replace('\\"', "").translate(_ONLY_SYNTAX)


def parse_json(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, where every way the text can fail is a `json.JSONDecodeError` (a ValueError): invalid
    JSON, not UTF-8, nested deeper than `max_depth`, an integer beyond Python's digit limit."""
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise json.JSONDecodeError(f"not UTF-8 (byte 0x{text[exc.start]:02x})", "", exc.start) from None
    if json_depth(text, max_depth) > max_depth:
        raise json.JSONDecodeError(f"nested too deep (more than {max_depth} levels)", "", 0)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deep", "", 0) from None
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise json.JSONDecodeError(str(exc).split(";")[0], "", 0) from None


def read_json(path: Path, what: str, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value of a file; unreadable, not a regular file, too large, not UTF-8, invalid or too deep:
    one FileError line naming `what` and the file."""
    path = Path(path)
    text = decode_utf8(read_bytes(path, what, max_bytes), path, what)
    try:
        return parse_json(text, max_depth)
    except json.JSONDecodeError as exc:
        where = f" at line {exc.lineno} column {exc.colno}" if exc.doc else ""
        raise FileError(f"{what}: expected JSON, found {'invalid JSON' if exc.doc else exc.msg}{where} "
                        f"in {path}" + (f" ({exc.msg})" if exc.doc else "")) from None


def read_json_object(path: Path, what: str, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """A JSON file whose top level must be an object (every file quantscan itself writes is one)."""
    data = read_json(path, what, max_bytes)
    if not isinstance(data, dict):
        raise FileError(f"{what}: expected a JSON object, found a JSON {json_kind(data)} in {path}")
    return data


def json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type (for "expected ..., found ..." messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    """`data[key]` checked to be of `kind` (booleans are not numbers); absent -> `default`.

    Why: a hand-edited or foreign file with a number where a list belongs must be one line naming the
    key, not a TypeError deep inside whatever uses it."""
    if key not in data:
        return default
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        names = "/".join(json_kind(k()) if k is not type(None) else "null" for k in kinds)
        raise FileError(f'{where}: expected "{key}" to be a JSON {names}, found a JSON {json_kind(value)}')
    return value
