"""How a spec is refused: a `SpecError` whose one-line message starts with the key
(``space.lambda_p.high: lambda_p must be in (0, 1], got 1.5``) and says how to fix it."""

from __future__ import annotations

from typing import NoReturn

from ponder.config import ConfigError

__all__ = ["SpecError", "config_error_field", "fail"]


class SpecError(ValueError):
    """A spec that cannot run; the message is one line naming the key and the fix."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key
        """The offending key path (``space.lambda_p.high``), empty for a whole-file problem."""

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str]]:
        return type(self), (str(self), self.key)


def fail(key: str, message: str) -> NoReturn:
    """Refuse the spec at ``key`` (empty: the whole file), in one line."""
    line = " ".join(f"{key}: {message}".split("\n")) if key else " ".join(message.split("\n"))
    raise SpecError(line, key)


def config_error_field(exc: ConfigError) -> str:
    """The field a `ConfigError` names: its messages start with it (``lambda_p must be ...``)."""
    return str(exc).split(" ", 1)[0]
