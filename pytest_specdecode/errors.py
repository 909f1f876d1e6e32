"""Exceptions. Each message names the host, the unit or process, and the state it was left in."""


class SpecDecodeError(Exception):
    """Base of every error this plugin raises on purpose."""


class ConfigError(SpecDecodeError):
    """Bad input, found before anything on any host was touched."""


class HostError(SpecDecodeError):
    """A command on a host failed or could not be run."""


class ServiceError(SpecDecodeError):
    """A service did not start, died, or could not be restored."""


class RequestError(SpecDecodeError):
    """A benchmark request failed: HTTP error, broken stream or missing usage."""


class StartDied(ServiceError):
    """A server that died while starting, before it ever served.

    `refused`: the line by which vLLM refused the configuration (a second start would fail the
    same way), else None: it died for another reason. `cause`: its root cause, one line."""

    def __init__(self, message: str, *, cause: str, after_s: float, refused: str | None) -> None:
        super().__init__(message)
        self.cause = cause
        self.after_s = after_s
        self.refused = refused


class BrokenDrafter(ServiceError):
    """A candidate whose drafter served but accepted almost nothing on its first requests (the
    drafter check before its timed windows); `check`: the check's figures (record/drafter_check)."""

    def __init__(self, message: str, *, check: object) -> None:
        super().__init__(message)
        self.check = check


class ShapeRefused(ConfigError):
    """A shape that cannot be served as asked (an architecture the serving vLLM lacks, a depth
    that does not fit, MoE routing left unbalanced): found before anything was touched."""
