"""Errors a user can hit, each with one clear message."""

__all__ = ["CommDebugError", "DumpError"]


class CommDebugError(Exception):
    """Base of every error commdebug raises on purpose; the CLI prints it as one line."""


class DumpError(CommDebugError):
    """A dump file that cannot be read: missing, not JSON, not a dump, or an unknown schema."""
