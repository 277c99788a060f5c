"""Text files and the paths written inside them.

Why: a vendor toolkit's text output (RKNN's `map_name_to_file.txt`, a log, an .mlir) is read as UTF-8;
a file in another encoding is the user's input to fix, not our bug. The names such files hold are
joined to a folder, so they are checked to stay inside it (a stem `../../x` must not read files
outside the dump folder the user named).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from quantscan.errors import FileError

MAX_TEXT_BYTES = 1 << 30
"""The largest text file read whole (a vendor log of several hundred MB is real; /dev/zero is not)."""


def regular_file(path: Path, what: str, max_bytes: int) -> int:
    """The size of `path`, refused unless it is a regular file (after symlinks) no larger than `max_bytes`.

    Why before opening: a symlink to /dev/zero or a FIFO would read forever, and a file's size is the
    first cap on what reading it may allocate."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FileError(f"{what}: expected a readable file, found {exc.strerror or exc} at {path}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileError(f"{what}: expected a regular file, found {_kind(st.st_mode)} at {path}")
    if st.st_size > max_bytes:
        raise FileError(f"{what}: expected at most {max_bytes} bytes, found {st.st_size} in {path}")
    return st.st_size


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    return "a special file"


def read_bytes(path: Path, what: str, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; anything else one FileError line."""
    regular_file(path, what, max_bytes)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise FileError(f"{what}: expected a readable file, found {exc.strerror or exc} at {path}") from None
    if len(data) > max_bytes:  # grew while we read it
        raise FileError(f"{what}: expected at most {max_bytes} bytes, found more in {path}")
    return data


def decode_utf8(data: bytes, path: Path, what: str) -> str:
    """UTF-8 text (a leading BOM dropped); another encoding is one line naming the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileError(f"{what}: expected UTF-8 text, found byte 0x{data[exc.start]:02x} at offset {exc.start} "
                        f"of {path} (save it as UTF-8)") from None


def read_text(path: Path, what: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A UTF-8 text file, whole."""
    return decode_utf8(read_bytes(path, what, max_bytes), Path(path), what)


def read_text_lenient(path: Path, what: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A text file whose undecodable bytes are replaced (a tool's log: its figures are ASCII, its
    messages may be in the tool's locale)."""
    return read_bytes(path, what, max_bytes).decode("utf-8", errors="replace")


NAME_MAX = 255
"""The longest file name (one path part, in bytes) Linux and macOS file systems take."""


def inside(folder: Path, name: str, what: str) -> Path:
    """`folder / name` for a relative `name` read from a file, refused when it could leave `folder`:
    absolute (either OS's form), any `..` part, a NUL, or a symlink that resolves outside `folder`."""
    if not name or "\0" in name or PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() \
            or PureWindowsPath(name).drive or ".." in PurePosixPath(name.replace("\\", "/")).parts:
        raise FileError(f"{what}: expected a file name relative to {folder}, found {name!r}")
    longest = max(len(part.encode("utf-8", "surrogateescape")) for part in PurePosixPath(name).parts)
    if longest > NAME_MAX:
        raise FileError(f"{what}: expected file names of at most {NAME_MAX} bytes, found one of {longest} bytes")
    path = Path(folder) / name
    root = Path(folder).resolve()
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        raise FileError(f"{what}: expected a file inside {folder}, found a symlink loop at {path}") from None
    if resolved != root and root not in resolved.parents:
        raise FileError(f"{what}: expected a file inside {folder}, found {name!r} leading to {resolved}")
    return path
