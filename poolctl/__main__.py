import sys

from poolctl.cli import main

sys.exit(main())
