"""A restricted unpickler for data files that hold only numpy arrays and builtin containers.

``pickle.load`` runs whatever callable a file names, so a downloaded ``.pkl``/``.pbz2`` can run
code on load. ``restricted_load`` resolves globals from a fixed allow-list instead: the few numpy
reconstructors an array or a numpy scalar needs, and builtin containers/scalars. Anything else
raises ``UnsafePickleError`` *before* it is called, so nothing outside the list ever runs.

Which globals numpy arrays need, by pickle protocol:

* protocol 2-4: ``numpy.core.multiarray._reconstruct`` (``numpy._core`` since numpy 2),
  ``numpy.ndarray``, ``numpy.dtype``; numpy scalars add ``multiarray.scalar``.
* protocol 5 (Python's default from 3.14): ``numpy._core.numeric._frombuffer``.
* protocol 2 written by Python 3: bytes become ``_codecs.encode(text, "latin1")``; that name
  resolves to a latin-1-only encoder here, not to ``_codecs.encode`` itself.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import bz2
import codecs
import pickle
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np


class UnsafePickleError(ValueError):
    """A pickle names a global outside the allow-list (it was not imported, let alone called)."""


class CorruptFileError(ValueError):
    """A pickle (or its bz2 wrapper) is truncated or malformed."""


def _numpy_core(submodule: str, name: str) -> Callable[[], Any]:
    """Resolver for a numpy-internal name, wherever this numpy version keeps it.

    numpy 2 moved ``numpy.core`` to ``numpy._core`` (the old path still imports but warns), so
    files written by either major version resolve to the same object without touching the shim.
    """

    def resolve() -> Any:
        import importlib

        for package in ("numpy._core", "numpy.core"):
            try:
                return getattr(importlib.import_module(f"{package}.{submodule}"), name)
            except (ImportError, AttributeError):
                continue
        raise UnsafePickleError(f"numpy has no {submodule}.{name}")

    return resolve


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """The only use of ``_codecs.encode`` in array pickles: protocol-2 bytes as latin-1 text."""
    if not isinstance(text, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise UnsafePickleError(f"_codecs.encode is allowed only as latin-1 text -> bytes, got {encoding!r}")
    return text.encode("latin1")


_BUILTINS = ("dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes", "bool")

# (module, name) -> zero-argument resolver. Exact pairs only: no prefixes, no attribute paths.
_ALLOWED: dict[tuple[str, str], Callable[[], Any]] = {
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    ("_codecs", "encode"): lambda: _latin1_encode,
}
for _package in ("numpy.core", "numpy._core"):
    _ALLOWED[(f"{_package}.multiarray", "_reconstruct")] = _numpy_core("multiarray", "_reconstruct")
    _ALLOWED[(f"{_package}.multiarray", "scalar")] = _numpy_core("multiarray", "scalar")
    _ALLOWED[(f"{_package}.numeric", "_frombuffer")] = _numpy_core("numeric", "_frombuffer")
for _name in _BUILTINS:
    _ALLOWED[("builtins", _name)] = lambda n=_name: getattr(builtins, n)


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` only hands out allow-listed globals."""

    def __init__(self, fileobj: BinaryIO, source: str) -> None:
        super().__init__(fileobj)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (__builtin__, copy_reg, ...) renamed as pickle's fix_imports does; only
        # Python 2 modules are in these tables, so Python 3 names pass through unchanged.
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        resolver = _ALLOWED.get((module, name))
        if resolver is None:
            raise UnsafePickleError(
                f"{self.source}: refusing to load global {module}.{name}: only numpy arrays and "
                "builtin containers are allowed in this file"
            )
        return resolver()

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"{self.source}: persistent ids are not allowed (got {pid!r})")


# Exceptions that mean "this byte stream is not a well-formed pickle of allowed objects".
_CORRUPT = (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, OverflowError, UnicodeDecodeError)


def restricted_load(fileobj: BinaryIO, source: str) -> Any:
    """Unpickle ``fileobj`` allowing only numpy arrays/scalars and builtin containers.

    ``source`` names the file in error messages. Raises ``UnsafePickleError`` for any other
    global and ``CorruptFileError`` for truncated or malformed input (including bz2 errors when
    ``fileobj`` is a ``bz2.BZ2File``).
    """
    try:
        return RestrictedUnpickler(fileobj, source).load()
    except UnsafePickleError:
        raise
    except _CORRUPT as exc:
        raise CorruptFileError(f"{source}: truncated or corrupt pickle ({type(exc).__name__}: {exc})") from None


def load_pbz2(path: Path | str) -> Any:
    """Read a bz2-compressed pickle (``*.pbz2``) with ``restricted_load``.

    Streams through ``bz2.open`` so the decompressed bytes (about 13x the file) are never held
    at once. ``FileNotFoundError`` if ``path`` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with bz2.open(path, "rb") as fileobj:
        return restricted_load(fileobj, str(path))
