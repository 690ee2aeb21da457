"""`python -m infer` is the `infer` command."""

import sys

from infer.server.cli import main

sys.exit(main())
