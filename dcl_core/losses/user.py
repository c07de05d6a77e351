"""A loss from the user's own code (``loss.name=my_losses:MyLoss`` or ``path/to/my_loss.py:MyLoss``): imported,
checked against the built-in losses' contract and built with its own keyword arguments (``loss.params``).

The contract is :class:`~dcl_core.losses.base.ContrastiveLoss`'s: a subclass whose constructor takes
``temperature`` and ``gather_distributed`` (the base class's) plus its own keyword arguments, and whose
``from_similarities(sims) -> LossOutput`` holds its equation (``loss(z1, z2)`` then forms SimCLR's two views, with
every rank's negatives under DDP, as for the built-in losses). Whatever fails (the import, a missing class, a
class of another kind, an argument it does not take) is one line naming the reference and what failed
(:class:`~dcl_core.config.InputError`: exit 2 before any compute).

A file is imported as a module named after its resolved path's hash, so two files called ``my_loss.py`` never
shadow each other; a module is imported by name from ``sys.path`` (the working folder when run with
``python -m``; ``PYTHONPATH`` otherwise).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dcl_core.config import REFERENCE_FORMS, InputError, LossReference, LossSource, loss_params, loss_reference
from dcl_core.losses.base import ContrastiveLoss
from dcl_core.losses.foreign import ForeignLoss, adapt, is_foreign, takes_gather

MAX_SOURCE_BYTES = 1 << 20  # a loss's source file; the hash reads no more (a larger one is refused)
MAX_SOURCE_FILES = 2000  # the Python files of a loss's folder or package (lightly's: 152)
MAX_SOURCES_BYTES = 32 << 20  # and their bytes together


def loss_source_file(ref: LossReference) -> Path:
    """The file that holds the loss: the given ``.py`` (resolved), or the module's file as found on ``sys.path``
    (its parent packages are imported to find it, as Python does)."""
    if ref.file:
        try:
            path = Path(ref.file).expanduser().resolve()
        except (RuntimeError, OSError):  # a loop of links (RuntimeError before Python 3.13)
            raise InputError(f"loss.name={ref}: its symbolic links lead into a loop: not followed") from None
        try:
            mode = path.stat().st_mode  # never opened here: a FIFO would block
        except OSError:
            raise InputError(f"loss.name={ref}: no such file {path}") from None
        if not stat.S_ISREG(mode):
            kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
                    if stat.S_ISSOCK(mode) else "a device")
            raise InputError(f"loss.name={ref}: {path} is {kind}, not a Python file: name the .py file that defines "
                             "the loss")
        return path
    try:
        spec = importlib.util.find_spec(ref.module)
    except (Exception, SystemExit) as err:  # a parent package that fails to import (or exits): its error, one line
        raise _failed(err, f"loss.name={ref}: cannot import {ref.module}: {type(err).__name__}: {err}") from None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise InputError(f"loss.name={ref}: no module named {ref.module!r} on the Python path (run from the folder "
                         "that holds it, or add that folder to PYTHONPATH)")
    return Path(spec.origin).resolve()


def _read_source(path: Path) -> bytes:
    """A source file's bytes, reading no more than :data:`MAX_SOURCE_BYTES` + 1 (a larger one is refused)."""
    with open(path, "rb") as f:
        data = f.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise InputError(f"{path}: a loss's source file is over {MAX_SOURCE_BYTES >> 20} MiB")
    return data


def source_sha256(path: Path) -> str:
    """The SHA-256 of one source file (bounded read)."""
    return hashlib.sha256(_read_source(path)).hexdigest()


def source_root(ref: LossReference, file: Path) -> tuple[Path, bool]:
    """The folder a loss's file is hashed with, and whether it is walked whole: a module inside a package (or a
    package) → its top-level package's folder, whole (every Python file the package may import); a file, or a
    top-level module → the file's folder: its own ``.py`` files and the packages (folders with ``__init__.py``)
    below it, which are what it can import beside itself."""
    top = ref.module.partition(".")[0] if ref.module else ""
    if top:
        spec = importlib.util.find_spec(top)
        if spec is not None and spec.submodule_search_locations:
            return Path(next(iter(spec.submodule_search_locations))).resolve(), True
    return file.parent, False


def _python_files(root: Path, whole: bool) -> list[Path]:
    """The regular ``.py`` files below ``root`` (see :func:`source_root`), sorted; hidden folders and caches left
    out; more than :data:`MAX_SOURCE_FILES` refused."""
    found: list[Path] = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                         and (whole or (here / d / "__init__.py").is_file()))
        for name in names:
            path = here / name
            if name.endswith(".py") and not name.startswith(".") and stat.S_ISREG(_stat_mode(path)):
                found.append(path)
        if len(found) > MAX_SOURCE_FILES:
            raise InputError(f"{root}: the folder a loss is hashed with holds over {MAX_SOURCE_FILES} Python files; "
                             "put the loss in a folder or package of its own")
    return sorted(found)


def _stat_mode(path: Path) -> int:
    try:
        return path.stat().st_mode  # through a link: what it points to (a FIFO or device there is left out)
    except OSError:
        return 0


def loss_sources(name: str) -> LossSource:
    """What user loss ``name`` is made of (:class:`~dcl_core.config.LossSource`): its file, and every Python
    source of its folder or package (:func:`source_root`) with its SHA-256, in at most :data:`MAX_SOURCES_BYTES`.

    Raises:
        InputError: the loss's file cannot be found, or its folder is over the bounds (one line).
    """
    ref = loss_reference(name)
    if ref is None:
        raise InputError(f"loss.name={name}: not a user loss ({REFERENCE_FORMS})")
    file = loss_source_file(ref)
    root, whole = source_root(ref, file)
    files, total = [], 0
    for path in {*_python_files(root, whole), file}:
        try:
            data = _read_source(path)
        except InputError as err:  # another file of the folder: say why it was read at all
            if path == file:
                raise
            raise InputError(f"{err} (a loss is hashed with every Python source of {root}, so that a resume notices "
                             "a changed helper: put the loss in a folder or package of its own)") from None
        total += len(data)
        if total > MAX_SOURCES_BYTES:
            raise InputError(f"{root}: the Python sources a loss is hashed with are over {MAX_SOURCES_BYTES >> 20} "
                             "MiB; put the loss in a folder or package of its own")
        files.append((path.relative_to(root).as_posix(), hashlib.sha256(data).hexdigest()))
    files.sort()
    digest = hashlib.sha256("".join(f"{rel}\0{sha}\n" for rel, sha in files).encode()).hexdigest()
    return LossSource(name=name, file=str(file), digest=digest, root=str(root), files=tuple(files))


def _import(ref: LossReference) -> Any:
    """The module ``ref`` names, imported (a file under a name unique to its resolved path)."""
    if not ref.file:
        return importlib.import_module(ref.module)
    path = loss_source_file(ref)
    name = f"dcl_user_loss_{hashlib.sha256(str(path).encode()).hexdigest()[:16]}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name while it executes
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _load(name: str, key: str) -> tuple[LossReference, Any]:
    """What ``name`` (``module:attr`` or ``file.py:attr``, given as option ``key``) names, imported."""
    ref = loss_reference(name, key)
    if ref is None:
        raise InputError(f"{key}={name}: expected {REFERENCE_FORMS}")
    try:
        module = _import(ref)
    except InputError:
        raise
    except (Exception, SystemExit) as err:  # the user's module failing (or exiting) as it imports: one line
        where = ref.file or ref.module
        detail = str(err).splitlines()[0] if str(err) else ""
        raise _failed(err, f"{key}={ref}: importing {where} failed: {type(err).__name__}: {detail}") from None
    found = getattr(module, ref.attr, None)
    if found is None:
        raise InputError(f"{key}={ref}: {ref.file or ref.module} has no {ref.attr}")
    return ref, found


def load_loss_class(name: str) -> type[ContrastiveLoss]:
    """The class ``loss.name`` names (``module:Class`` or ``file.py:Class``), imported and checked: a
    ContrastiveLoss subclass, or another library's loss (an ``nn.Module`` whose constructor takes ``temperature``,
    :mod:`~dcl_core.losses.foreign`), adapted.

    Raises:
        InputError: one line naming the reference: it cannot be imported (the error's own line), the class is
            missing, or it is neither a ContrastiveLoss subclass with its own ``from_similarities`` or ``forward``
            nor an ``nn.Module`` taking ``temperature``.
    """
    ref, cls = _load(name, "loss.name")
    if is_foreign(cls):
        return adapt(cls)
    if not (inspect.isclass(cls) and issubclass(cls, ContrastiveLoss)):
        raise InputError(f"loss.name={ref}: {ref.attr} must be a subclass of dcl_core.losses.ContrastiveLoss, or an "
                         f"nn.Module whose constructor takes temperature (another library's loss); got "
                         f"{type(cls).__name__} {cls!r}"[:300])
    if cls.from_similarities is ContrastiveLoss.from_similarities and cls.forward is ContrastiveLoss.forward:
        raise InputError(f"loss.name={ref}: {ref.attr} implements neither from_similarities(sims) nor "
                         "forward(z1, z2); the loss's equation goes in from_similarities")
    return cls


def load_function(name: str, key: str = "--reference") -> Callable[..., Any]:
    """The function ``name`` (``module:function`` or ``file.py:function``) names, imported; one line if it cannot
    be, or is not callable."""
    ref, found = _load(name, key)
    if not callable(found):
        raise InputError(f"{key}={ref}: {ref.attr} is not a function")
    function: Callable[..., Any] = found
    return function


def build_user_loss(name: str, params: str, temperature: float, gather_distributed: bool) -> ContrastiveLoss:
    """The user loss ``name`` built with τ, the DDP gathering and its own keyword arguments ``params`` (JSON).

    Raises:
        InputError: the class cannot be loaded (:func:`load_loss_class`), or its constructor refuses the
            arguments (one line with its signature).
    """
    cls = load_loss_class(name)
    kwargs = loss_params(params)
    if issubclass(cls, ForeignLoss):  # another library's constructor: τ, its own keywords and maybe the gathering
        built, given = cls.wrapped, {"temperature": temperature, **kwargs}
        if takes_gather(built):
            given["gather_distributed"] = gather_distributed
    else:
        built, given = cls, {"temperature": temperature, "gather_distributed": gather_distributed, **kwargs}
    try:
        inspect.signature(built).bind(**given)
    except TypeError as err:
        takes = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}"
                          for p in inspect.signature(built).parameters.values())
        raise InputError(f"loss.name={name}: {built.__name__}({takes}) does not take "
                         f"{', '.join(given)} (loss.params): {err}") from None
    try:
        return cls(temperature=temperature, gather_distributed=gather_distributed, **kwargs)
    except (Exception, SystemExit) as err:  # sys.exit() in a constructor: its status, not this process's
        why = f"loss.name={name}: {built.__name__}(...) failed: {type(err).__name__}: {err}"
        raise _failed(err, why[:500]) from None


class LossExitedError(InputError):
    """The user's code called ``sys.exit`` as it was imported or built (``code``: its status): one line for a study;
    ``python -m dcl_core.losses check`` reports it as the exit it is (the contract fails)."""

    def __init__(self, message: str, code: object) -> None:
        super().__init__(message)
        self.code = code


def _failed(err: BaseException, message: str) -> InputError:
    """The one-line error for the user's code failing with ``err`` (:class:`LossExitedError` for a ``sys.exit``)."""
    return LossExitedError(message, err.code) if isinstance(err, SystemExit) else InputError(message)
