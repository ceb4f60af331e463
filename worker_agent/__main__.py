"""`python -m worker_agent …` (see cli.py)."""

import sys

from worker_agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
