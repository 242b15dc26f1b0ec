"""Exceptions tether raises. A leaf: imports nothing from tether."""

from __future__ import annotations


class TetherError(Exception):
    """Base class of every error tether raises on purpose."""


class JobRefused(TetherError):
    """A job, or a spawn into it, was refused rather than run unprotected.

    Raised when ``require="kernel"`` cannot be met, when the asked-for
    mechanism is not available, or when a child could not be placed in the
    job (the job gate). The message names the reason.
    """


class JobClosed(TetherError):
    """The job was closed (or its owner is gone); nothing more can start in it."""


class SignalRefused(TetherError):
    """identity.send_signal refused: the target is not provably the process meant."""
