"""``python -m perfsdk.cli``: the ``perfsdk`` command (what scripts/demo.sh and the tests run)."""

import sys

from perfsdk.cli import main

sys.exit(main())
