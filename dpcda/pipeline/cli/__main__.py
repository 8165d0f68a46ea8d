"""``python -m dpcda.pipeline.cli``: the ``dpcda`` command."""

import sys

from dpcda.pipeline.cli import main

sys.exit(main())
