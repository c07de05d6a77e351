"""Whether CIFAR-10 is where a run without ``data.root`` reads it: the embedded folder, or ``DCL_DATA_ROOT``'s
folder or pack (a lent GPU machine has only the pack ``benchmarks/gpu_check.py`` names), for the tests that train."""

from __future__ import annotations

from dcl_core.data import resolve_data_root
from dcl_core.data.packed import PACKED_FILE


def cifar10_present() -> bool:
    """CIFAR-10 as an ImageFolder (``train/``) or a pack (``imagefolder.arrow``) where the presets read it."""
    try:
        root = resolve_data_root("cifar10", None)
    except Exception:
        return False
    return (root / "train").is_dir() or (root / PACKED_FILE).is_file()
