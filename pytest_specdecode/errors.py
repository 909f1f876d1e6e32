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
