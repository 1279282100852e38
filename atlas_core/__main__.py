import sys

from atlas_core.cli import main

sys.exit(main())
