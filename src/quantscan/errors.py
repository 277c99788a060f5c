"""Errors quantscan raises for bad input.

Every error a user can cause is a `QuantscanError`: the CLI turns it into one line on stderr and
exit code 2. The message says what was expected and what was found. Bugs stay ordinary exceptions.
"""

from __future__ import annotations


class QuantscanError(Exception):
    """Bad input or usage: the CLI prints `quantscan: error: <message>` and exits 2."""


class ModelError(QuantscanError):
    """The model file is missing, corrupt, truncated, already quantized or otherwise unusable."""


class CalibrationError(QuantscanError):
    """The calibration folder or its files cannot feed the model."""


class ProfileError(QuantscanError):
    """A chip profile is unknown or malformed."""


class SessionError(QuantscanError):
    """onnxruntime refused to build or run a session for a model quantscan prepared."""


class UsageError(QuantscanError):
    """A flag value is malformed (e.g. `--input-shape x:1,3`), or flags contradict each other."""


class InternalError(Exception):
    """A quantscan bug detected as such (e.g. onnxruntime rejects a graph quantscan built): exit 3, not 2.

    Deliberately not a `QuantscanError`: the user's input is not at fault, so it must not read as bad input.
    """


class FileError(QuantscanError):
    """A file quantscan reads (a dump, a session, a vendor result, a case) is unreadable, malformed or over a
    limit (quantscan.readers): one line naming the file, exit 2."""
