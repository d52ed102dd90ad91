"""``python -m benchmarks.peer``: see :mod:`benchmarks.peer.bench`."""

import sys

from benchmarks.peer.bench import main

sys.exit(main())
