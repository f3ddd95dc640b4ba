"""``python -m worker.cli`` = the ``derender-worker`` console script."""
import sys

from worker.cli import main

sys.exit(main())
