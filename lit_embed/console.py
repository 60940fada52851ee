"""What lit-embed keeps out of a command's output: notices of its dependencies that say nothing true about
the run, and that the user cannot act on.

* Lightning's "💡 Tip:" adverts for its cloud services (litlogger, litmodels), which every ``Trainer``
  prints when it is built: one per run, five in one ``lit-embed compress``.
* Lightning's notice that the run has a model summary of its own (lit-embed gives every run one,
  :class:`~lit_embed.callbacks.console.LayerSummary`).
* torch's ``FutureWarning`` on Lightning 2.6's own use of ``torch.utils._pytree.LeafSpec`` (printed once
  per run from ``pytorch_lightning/utilities/_pytree.py``).

Nothing here imports Lightning: :func:`quiet` installs filters by logger name and message.
"""

from __future__ import annotations

import logging
import warnings

#: The loggers Lightning's ``rank_zero_info`` writes to (Lightning points lightning_utilities' at them).
RANK_ZERO_LOGGERS = ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero")
#: How the notices dropped begin.
NOTICES = ("💡 Tip:", "Trainer already configured with model summary callbacks")


class _Notices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NOTICES)


_installed = False


def quiet() -> None:
    """Drop the notices above from this process's output (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in RANK_ZERO_LOGGERS:
        logging.getLogger(name).addFilter(_Notices())
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


__all__ = ["quiet"]
