"""How ``lit-embed`` answers SIGTERM and Ctrl-C (SIGINT), without importing Lightning.

During a loop of a trainer that :class:`~lit_embed.callbacks.RunGuard` activated, training stops after
the step in progress (the guard then saves ``last.ckpt``); anywhere else the signal stops the command.
Either way :func:`lit_embed.commands.main` exits 128 + the signal's number. A second Ctrl-C stops at once.

A signal that reaches a loop as it ends (its last step) lets it end; whatever would start a step after it (the test
``fit`` runs on task data, a sweep's next command) calls :func:`stop_if_signalled` first. So a command that returns
normally has done every step, signal or not, and one stopped short raises, and exits 128 + N.
"""

from __future__ import annotations

import logging
import signal

from lit_embed._compat import request_stop

log = logging.getLogger(__name__)

_received: int | None = None  # the signal that stopped this process's run, if one did
_active = None  # the trainer whose loops check for a stop request


class Interrupted(BaseException):
    """A signal arrived while no training or evaluation loop could stop at a step boundary."""


def received_signal() -> int | None:
    """The signal (SIGTERM or SIGINT) that interrupted this process, if one did."""
    return _received


def install_signal_handlers() -> dict:
    """Handle SIGTERM and SIGINT as described in the module docstring; returns the handlers they replace, for
    :func:`restore_signal_handlers` when the command ends (a signal after it then ends the process as usual)."""
    global _received
    _received = None  # a command run before in this process (tests, notebooks) was its own
    return {signum: signal.signal(signum, _on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}


def restore_signal_handlers(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def activate(trainer) -> None:
    """Make ``trainer`` (``None``: none) the one whose loops a signal stops at a step boundary."""
    global _active
    _active = trainer


def stop_if_signalled() -> None:
    """Stop here, as the signal would have stopped the command, if one has arrived (before starting another step)."""
    if _received is not None:
        raise KeyboardInterrupt if _received == signal.SIGINT else Interrupted(_received)


def _on_signal(signum, frame) -> None:
    global _received
    first = _received is None
    _received = signum
    trainer = _active
    if signum == signal.SIGTERM and trainer is not None:
        return  # Lightning's own SIGTERM handler ran first: its loops stop at the next step
    if signum == signal.SIGINT and trainer is not None and first:
        request_stop(trainer)
        log.warning("Interrupted: stopping after this step and saving a checkpoint (Ctrl-C again stops at once)")
        return
    raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted(signum)


__all__ = ["Interrupted", "activate", "install_signal_handlers", "received_signal", "restore_signal_handlers",
           "stop_if_signalled"]
