"""Pack an ImageFolder into one file: ``python -m dcl_core.pack ROOT -o OUT_DIR`` writes ``OUT_DIR/imagefolder.arrow``,
which ``--data-root OUT_DIR`` then reads as the folder itself (:mod:`dcl_core.data.packed`: the same images, labels
and results). For carrying a dataset of many small files where one file travels better (CIFAR-10's 60,000 JPEGs:
one 57 MB file). Bad input exits with code 2 and one line.

A pack travels, so it takes only image files from inside ROOT: a link out of ROOT (unless ``--follow-links`` says
to take what links point to), a link loop, a FIFO, a device, a file that is no image, an image or a total over the
bounds (:data:`dcl_core.data.image_bytes.MAX_IMAGE_BYTES`, :data:`dcl_core.data.packed.MAX_PACK_BYTES`) is refused
with nothing written, never followed, opened or read.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dcl_core.cli_common import FOLDER_HINT, ArgumentParser, given, run_command, setup_logging
from dcl_core.config import ConfigError
from dcl_core.data.packed import PACKED_FILE, pack, splits_of


def main(argv: list[str] | None = None) -> int:
    """Pack the ImageFolder named on the command line; the exit status."""
    parser = ArgumentParser(prog="python -m dcl_core.pack", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=given(Path, FOLDER_HINT),
                        help="an ImageFolder root: ROOT/train/<class>/..., ROOT/test/... (or val/)")
    parser.add_argument("-o", "--out-dir", required=True,
                        help=f"the folder to write {PACKED_FILE} into (then --data-root OUT_DIR)")
    parser.add_argument("--follow-links", action="store_true",
                        help="also take images that links in ROOT point to outside it (a subset such as ImageNet-100 "
                             "made of links into ImageNet): their bytes go into the pack, which travels")
    args = parser.parse_args(argv)
    setup_logging()

    def body() -> int:
        if not args.out_dir.strip():  # Path("") is the folder the command runs in
            raise ConfigError(f"-o is empty: name the folder to write {PACKED_FILE} into (-o . for this one)")
        target = pack(args.root, Path(args.out_dir), follow_links=args.follow_links)
        print(f"{target}: {target.stat().st_size / 1e6:.1f} MB, splits {', '.join(sorted(splits_of(target)))}")
        return 0

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
