"""``python -m lit_embed.commands``: the ``lit-embed`` console script (DDP's ranks and the tests start it so)."""

import sys

from lit_embed.commands import main

sys.exit(main())
