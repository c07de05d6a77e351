"""A loss module that ends the process (status 0) as it is imported: the checker must report it, not exit 0."""

import sys

sys.exit(0)
