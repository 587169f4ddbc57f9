"""``python -m waypost.cli``: the ``waypost`` command."""

import sys

from . import main

sys.exit(main())
