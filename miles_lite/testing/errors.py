"""The one error class of the stand-ins' own: a test harness that failed.

The stand-ins are an oracle for the library, so they share none of its code, its error
classes included. Two kinds of failure, two builtin bases:

- a bad stand-in configuration (a config field, a fault switch, a policy) raises
  :class:`ValueError`, naming the field and the value;
- a harness that fails (a child process that exits or hangs while starting, a closed
  engine started again, a missing tokenizer package, no SGLang venv) raises
  :class:`StandInError`, a :class:`RuntimeError`.

Requests the stand-ins refuse are not exceptions but HTTP answers, in SGLang's words.
"""

from __future__ import annotations

__all__ = ["StandInError"]


class StandInError(RuntimeError):
    """Raised when a stand-in harness fails: it could not start, or was used after closing.

    Usage: ``with pytest.raises(StandInError, match="before serving"): process.start()``.
    """
