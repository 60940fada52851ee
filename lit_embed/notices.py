"""What lit-embed keeps out of a command's output: notices of its dependencies that say nothing true about
the run, and that the user cannot act on.

* Lightning's "💡 Tip:" adverts for its cloud services (litlogger, litmodels), which every ``Trainer``
  prints when it is built: one per run, five in one ``lit-embed compress``.
* Lightning's notice that the run has a model summary of its own (lit-embed gives every run one,
  :class:`~lit_embed.callbacks.console.LayerSummary`).
* torch's ``FutureWarning`` on Lightning 2.6's own use of ``torch.utils._pytree.LeafSpec`` (printed once
  per run from ``pytorch_lightning/utilities/_pytree.py``).
* "No seed found, seed set to 0" where a config sets no ``seed_everything``: the seed is 0, and the checkpoint
  and ``results.json`` record it; and "Loading `train_dataloader` to estimate number of stepping batches".
* Lightning's "GPU available / TPU available" lines after the first of a command: every ``Trainer`` prints them as
  it is built, the same each time (``lit-embed compress`` builds one per candidate k).
* When evaluating or predicting with a checkpoint (``validate``, ``test``, ``predict``): its checkpoint callback's
  "The dirpath has changed" (the run writes into a folder of its own, as every run does).
* Where stderr is no terminal (a log file, a batch job): the progress bars of huggingface_hub, transformers and
  datasets ("Loading weights", "Generating train split", a map's), whose ``\r`` redraws fill a log with one line
  per update; lit-embed's own stages say their progress in plain lines there (:mod:`lit_embed.progress`). A
  ``HF_HUB_DISABLE_PROGRESS_BARS`` or ``HF_DATASETS_DISABLE_PROGRESS_BARS`` the user set is kept.

Nothing here imports Lightning: :func:`quiet` installs filters by logger name and message.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

#: The loggers Lightning's ``rank_zero_info`` writes to (Lightning points lightning_utilities' at them).
RANK_ZERO_LOGGERS = ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero")
#: How the notices dropped begin.
NOTICES = ("💡 Tip:", "Trainer already configured with model summary callbacks",
           "Loading `train_dataloader` to estimate number of stepping batches")

#: How the notices said once a command begin.
ONCE = ("GPU available:", "TPU available:", "HPU available:")


class _Notices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(ONCE):
            if message in _said:
                return False
            _said.add(message)
        return not message.startswith(NOTICES)


_installed = False
_said: set[str] = set()  # the notices of ONCE this command has said


def quiet(command: str | None = None) -> None:
    """Drop the notices above from this process's output; ``command``: the ``lit-embed`` command run."""
    global _installed
    _said.clear()
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"No seed found, seed set to 0")
    if command in ("validate", "test", "predict"):
        warnings.filterwarnings("ignore", message=r"The dirpath has changed from")
    if not sys.stderr.isatty():  # read by the libraries at their import, which comes later; DDP ranks inherit them
        for switch in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
            os.environ.setdefault(switch, "1")
    if not _installed:
        _installed = True
        notices = _Notices()
        for name in RANK_ZERO_LOGGERS:
            logging.getLogger(name).addFilter(notices)


__all__ = ["quiet"]
