"""`python3 tests/fsmodel ARGS`: run the model test standalone (see fsmodel/cli.py)."""

import os
import sys

# Run as a directory, Python puts tests/fsmodel itself first on the path: put tests/ there
# instead, so the package imports as `fsmodel` (and its siblings, conftest, as themselves).
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from fsmodel.cli import main  # noqa: E402

sys.exit(main())
