#!/usr/bin/env bash
# A real two-node Ray cluster on this Linux machine (two network namespaces, as root) running the smoke
# temperature study; --kill-worker-after N loses the worker node mid-study. What it does, its checks and its
# exit codes: studies/cluster/two_node.py. Runs with the Python of the active environment (or $PYTHON).
set -euo pipefail
exec "${PYTHON:-python}" "$(dirname "${BASH_SOURCE[0]}")/two_node.py" "$@"
