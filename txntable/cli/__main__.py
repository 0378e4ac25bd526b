"""``python -m txntable.cli``: the ``txntable`` command."""

import sys

from txntable.cli import main

sys.exit(main())
