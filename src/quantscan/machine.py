"""What this machine has for a run: its available and total memory (the cgroup's limit when one is set)
and the default budget taken from them.

Why a module of its own, below calib/ and scanning/: the scan plans its batch from the budget and the
calibration readers refuse an array that cannot fit it, before reading a byte of data.
"""

from __future__ import annotations

from pathlib import Path


def machine_memory(meminfo: str | None = None) -> tuple[int, int]:
    """(available, total) bytes: /proc/meminfo, capped by the cgroup limit when one is set."""
    text = meminfo if meminfo is not None else read_text_or_empty("/proc/meminfo")
    fields = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * 1024
    total = fields.get("MemTotal", 0)
    available = fields.get("MemAvailable", total)
    limit = _cgroup_limit()
    if limit is not None:
        total = min(total, limit) if total else limit
        available = min(available, limit) if available else limit
    return available, total


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        raw = read_text_or_empty(path).strip()
        if raw.isdigit() and int(raw) < 2**60:
            return int(raw)
    return None


def read_text_or_empty(path: str) -> str:
    """A /proc or /sys file's text, empty where it does not exist."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def default_budget(available: int, total: int) -> int:
    """Half the available RAM, never more than the machine has (contract's default)."""
    half = available // 2 if available else total // 2
    return min(half, total) if total else half
