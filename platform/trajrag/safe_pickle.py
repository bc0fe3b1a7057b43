"""A restricted unpickler for data files that hold only numpy arrays and builtin containers.

``pickle.load`` runs whatever callable a file names, so a downloaded ``.pkl``/``.pbz2`` can run
code on load. ``restricted_load`` resolves globals from a fixed allow-list instead: the few numpy
reconstructors an array or a numpy scalar needs, and builtin containers/scalars. Anything else
raises ``UnsafePickleError`` *before* it is called, so nothing outside the list ever runs.

Naming a global is not calling it: only the calls the formats make are allowed, each with the
arguments they take, and each call's size is checked before it runs. ``bytes(2**50)`` (an
82-byte pbz2), an array of 2**40 elements or a set built a million times over one memoised list
are refused with one line, not attempted. Everything one file may make (the unpickled stream
read, plus what the allowed calls and array states allocate) shares one budget, ``MAX_BYTES``; a
length the stream claims is checked against it before anything is read, and the stream is read
in pieces, so a claimed length is never allocated ahead of the data.

The checks need hooks the C unpickler lacks (``REDUCE``, ``NEWOBJ``, ``BUILD``), so this is
``pickle._Unpickler``, the pure-Python one; the data files hold a few thousand opcodes (their
bulk is array bytes), so it loads as fast as the C one (Gibson's train file: bz2 dominates).

Which globals numpy arrays need, by pickle protocol:

* protocol 2-4: ``numpy.core.multiarray._reconstruct`` (``numpy._core`` since numpy 2),
  ``numpy.ndarray`` (named as ``_reconstruct``'s type, never called), ``numpy.dtype``; numpy
  scalars add ``multiarray.scalar``.
* protocol 5 (Python's default from 3.14): ``numpy._core.numeric._frombuffer``.
* protocol 2 written by Python 3: bytes become ``_codecs.encode(text, "latin1")``; that name
  resolves to a latin-1-only encoder here, not to ``_codecs.encode`` itself. Sets are
  ``set(list)``, empty bytes ``bytes()``, complex numbers ``complex.__new__(complex, re, im)``.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import bz2
import codecs
import math
import pickle
import reprlib
import struct
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

# Bytes one file may make: its unpickled stream plus what its calls and array states allocate.
# 3x the largest file read here (Gibson v1.1 train_info.pbz2: 0.33 GB of stream, 0.33 GB of
# arrays; an MP3D BEV map: 2 MB), far below a worker's memory.
MAX_BYTES = 2 * 1024**3
# Largest piece asked of the file at once: a claimed length is read in pieces as the data comes.
_READ_PIECE = 16 * 1024**2
# Bytes charged per element of a container a call builds (a pointer and its hash-table slot).
_SLOT_BYTES = 16


class UnsafePickleError(ValueError):
    """A pickle names a global outside the allow-list (it was not imported, let alone called), calls
    one in a way the data formats never do, or asks for more memory than a data file may."""


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


class _Refused(Exception):
    """A call's arguments are not what the data formats pass (the reason, for the message)."""


def _count(shape: Any) -> int:
    """Elements of an array of ``shape`` (a tuple of non-negative ints)."""
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise _Refused(f"shape {reprlib.repr(shape)} is not a tuple of sizes")
    return math.prod(shape)


def _nbytes(buffer: Any) -> int:
    try:
        with memoryview(buffer) as view:
            return view.nbytes
    except TypeError:
        raise _Refused(f"{type(buffer).__name__} is not a buffer") from None


# Each guard takes a call's (args, kwargs), raises ``_Refused`` unless they are what the format
# passes, and returns the bytes the call will allocate (charged before it runs).
def _no_kwargs(kwargs: dict) -> None:
    if kwargs:
        raise _Refused("keyword arguments")


def _guard_reconstruct(args: tuple, kwargs: dict) -> int:
    _no_kwargs(kwargs)
    if len(args) != 3 or args[0] is not np.ndarray:
        raise _Refused("only _reconstruct(numpy.ndarray, shape, typecode)")
    return _count(args[1]) * _SLOT_BYTES


def _guard_scalar(args: tuple, kwargs: dict) -> int:
    _no_kwargs(kwargs)
    if not 1 <= len(args) <= 2 or not isinstance(args[0], np.dtype):
        raise _Refused("only scalar(dtype, data)")
    dtype = args[0]
    if not dtype.hasobject and (len(args) < 2 or _nbytes(args[1]) != dtype.itemsize):
        raise _Refused(f"the data is not one {dtype} ({dtype.itemsize} bytes)")
    return dtype.itemsize


def _guard_frombuffer(args: tuple, kwargs: dict) -> int:
    _no_kwargs(kwargs)
    if len(args) != 4 or not isinstance(args[1], np.dtype) or args[1].hasobject:
        raise _Refused("only _frombuffer(buffer, dtype, shape, order)")
    size = _nbytes(args[0])
    if _count(args[2]) * args[1].itemsize != size:
        raise _Refused(f"shape {reprlib.repr(args[2])} of {args[1]} does not match the {size} bytes given")
    return size


def _guard_dtype(args: tuple, kwargs: dict) -> int:
    _no_kwargs(kwargs)
    if not 1 <= len(args) <= 3 or not isinstance(args[0], str) or not all(isinstance(a, int) for a in args[1:]):
        raise _Refused("only dtype(typestring, align, copy)")
    return _SLOT_BYTES


def _guard_latin1(args: tuple, kwargs: dict) -> int:
    _no_kwargs(kwargs)
    if not args or not isinstance(args[0], str):
        raise _Refused("only latin-1 text -> bytes")
    return len(args[0])


def _guard_collection(args: tuple, kwargs: dict) -> int:
    """``set(list)`` / ``frozenset(list)`` (protocols 2-3): one container of the elements."""
    _no_kwargs(kwargs)
    if len(args) > 1 or (args and not isinstance(args[0], (list, tuple, set, frozenset))):
        raise _Refused("only an empty call or one list of elements")
    return _SLOT_BYTES * (len(args[0]) + 1 if args else 1)


def _guard_empty_bytes(args: tuple, kwargs: dict) -> int:
    """``bytes()``: how protocol 2 writes ``b""`` (other bytes are ``_codecs.encode``)."""
    _no_kwargs(kwargs)
    if args:
        raise _Refused("only bytes() (an argument such as 2**50 would allocate that many bytes)")
    return 0


def _guard_complex(args: tuple, kwargs: dict) -> int:
    _no_kwargs(kwargs)
    if len(args) > 2 or not all(isinstance(a, (int, float)) for a in args):
        raise _Refused("only complex(real, imag)")
    return _SLOT_BYTES


def _guard_not_called(args: tuple, kwargs: dict) -> int:
    raise _Refused("it is allowed as a value, never called by the data formats")


_BUILTINS = {"dict": _guard_not_called, "list": _guard_not_called, "tuple": _guard_not_called,
             "set": _guard_collection, "frozenset": _guard_collection, "int": _guard_not_called,
             "float": _guard_not_called, "complex": _guard_complex, "str": _guard_not_called,
             "bytes": _guard_empty_bytes, "bool": _guard_not_called}

# (module, name) -> (zero-argument resolver, guard of its calls). Exact pairs only: no prefixes,
# no attribute paths.
_ALLOWED: dict[tuple[str, str], tuple[Callable[[], Any], Callable[[tuple, dict], int]]] = {
    ("numpy", "ndarray"): (lambda: np.ndarray, _guard_not_called),
    ("numpy", "dtype"): (lambda: np.dtype, _guard_dtype),
    ("_codecs", "encode"): (lambda: _latin1_encode, _guard_latin1),
}
for _package in ("numpy.core", "numpy._core"):
    _ALLOWED[(f"{_package}.multiarray", "_reconstruct")] = (_numpy_core("multiarray", "_reconstruct"),
                                                            _guard_reconstruct)
    _ALLOWED[(f"{_package}.multiarray", "scalar")] = (_numpy_core("multiarray", "scalar"), _guard_scalar)
    _ALLOWED[(f"{_package}.numeric", "_frombuffer")] = (_numpy_core("numeric", "_frombuffer"), _guard_frombuffer)
for _name, _guard in _BUILTINS.items():
    _ALLOWED[("builtins", _name)] = (lambda n=_name: getattr(builtins, n), _guard)


class _Budget:
    """The bytes a load may still make (``MAX_BYTES`` at the start)."""

    def __init__(self, source: str, limit: int) -> None:
        self.source, self.limit, self.left = source, limit, limit

    def check(self, size: int, what: str) -> None:
        """Refuse ``what`` when its ``size`` bytes are more than the budget has left."""
        if size > self.left:
            raise UnsafePickleError(f"{self.source}: refusing to load: {what} would take {size:,} bytes, more "
                                    f"than the {self.limit:,} a data file may make")

    def spend(self, size: int, what: str) -> None:
        """Charge ``size`` bytes for ``what``, or refuse before it is made."""
        self.check(size, what)
        self.left -= size


class _BudgetedReader:
    """``read`` / ``readline`` over a file that charge what they return to the budget, refuse a
    claimed length over it before reading, and ask the file for at most ``_READ_PIECE`` at once."""

    def __init__(self, fileobj: BinaryIO, budget: _Budget) -> None:
        self.fileobj, self.budget = fileobj, budget

    def read(self, size: int) -> bytes:
        self.budget.check(size, "a length the stream claims")
        pieces = []
        while size > 0:
            piece = self.fileobj.read(min(size, _READ_PIECE))
            if not piece:
                break
            self.budget.spend(len(piece), "the pickle stream")
            pieces.append(piece)
            size -= len(piece)
        if size > 0:
            raise pickle.UnpicklingError("pickle data was truncated")
        return b"".join(pieces)

    def readline(self) -> bytes:
        pieces: list[bytes] = []
        while not pieces or not pieces[-1].endswith(b"\n"):
            piece = self.fileobj.readline(min(self.budget.left + 1, _READ_PIECE))
            if not piece:
                break
            self.budget.spend(len(piece), "a line of the pickle stream")
            pieces.append(piece)
        return b"".join(pieces)


class RestrictedUnpickler(pickle._Unpickler):
    """The pure-Python ``pickle._Unpickler`` whose ``find_class`` only hands out allow-listed
    globals, whose calls (``REDUCE``, ``NEWOBJ``, ``OBJ``/``INST``) and array states (``BUILD``)
    are checked against what the formats pass, and whose every allocation is charged to one
    budget first."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, fileobj: BinaryIO, source: str, max_bytes: int = MAX_BYTES) -> None:
        self.source = source
        self.budget = _Budget(source, max_bytes)
        super().__init__(_BudgetedReader(fileobj, self.budget))
        self._guards: dict[int, tuple[Any, str, Callable[[tuple, dict], int]]] = {}

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (__builtin__, copy_reg, ...) renamed as pickle's fix_imports does; only
        # Python 2 modules are in these tables, so Python 3 names pass through unchanged.
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise UnsafePickleError(
                f"{self.source}: refusing to load global {module}.{name}: only numpy arrays and "
                "builtin containers are allowed in this file"
            )
        resolve, guard = allowed
        obj = resolve()
        self._guards[id(obj)] = (obj, f"{module}.{name}", guard)
        return obj

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"{self.source}: persistent ids are not allowed (got {pid!r})")

    def _call(self, func: Any, args: Any, kwargs: Any, make: Callable[[], Any]) -> Any:
        """``make()`` (which calls ``func``) once ``func``'s guard passed ``args`` and the budget
        has room for what it makes."""
        obj, name, guard = self._guards.get(id(func), (None, "", None))
        if obj is not func:
            raise UnsafePickleError(f"{self.source}: refusing to call a {type(func).__name__}: only allowed "
                                    "globals are called")
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise UnsafePickleError(f"{self.source}: refusing to call {name}: malformed arguments")
        try:
            size = guard(args, kwargs)
        except _Refused as reason:
            raise UnsafePickleError(f"{self.source}: refusing to call {name}: {reason}") from None
        self.budget.spend(size, f"{name}(...)")
        return make()

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        self.stack[-1] = self._call(func, args, {}, lambda: func(*args))

    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._call(cls, args, {}, lambda: cls.__new__(cls, *args)))

    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._call(cls, args, kwargs, lambda: cls.__new__(cls, *args, **kwargs)))

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def _instantiate(self, klass: Any, args: Any) -> None:  # OBJ and INST (protocols 0-1)
        self.append(self._call(klass, tuple(args), {}, lambda: klass(*args)))

    def load_bytearray8(self) -> None:
        # The base class makes bytearray(claimed length) before reading: read first (bounded).
        (size,) = struct.unpack("<Q", self.read(8))
        self.append(bytearray(self.read(size)))

    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8

    def load_build(self) -> None:
        state = self.stack[-1]
        inst = self.stack[-2]
        if isinstance(inst, np.ndarray):
            self.budget.spend(self._array_state_bytes(state), "an array's data")
        elif not isinstance(inst, np.dtype):
            raise UnsafePickleError(f"{self.source}: refusing to set the state of a {type(inst).__name__}: only "
                                    "numpy arrays and dtypes take one")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build

    def _array_state_bytes(self, state: Any) -> int:
        """The bytes ``ndarray.__setstate__(state)`` makes, once the data is checked to match."""
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise UnsafePickleError(f"{self.source}: refusing an array state that is not numpy's")
        shape, dtype, _, data = state[-4:]
        try:
            count = _count(shape)
            if not isinstance(dtype, np.dtype):
                raise _Refused(f"its dtype is a {type(dtype).__name__}")
            if dtype.hasobject:
                if not isinstance(data, list) or len(data) != count:
                    raise _Refused(f"{count} objects expected")
                return count * _SLOT_BYTES
            if _nbytes(data) != count * dtype.itemsize:
                raise _Refused(f"{count * dtype.itemsize} bytes of data expected")
        except _Refused as reason:
            raise UnsafePickleError(f"{self.source}: refusing an array of shape {reprlib.repr(shape)}: {reason}") from None
        return count * dtype.itemsize


# Exceptions that mean "this byte stream is not a well-formed pickle of allowed objects".
_CORRUPT = (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, OverflowError, UnicodeDecodeError, struct.error)


def restricted_load(fileobj: BinaryIO, source: str, max_bytes: int = MAX_BYTES) -> Any:
    """Unpickle ``fileobj`` allowing only numpy arrays/scalars and builtin containers.

    ``source`` names the file in error messages; ``max_bytes`` bounds what the load may make
    (stream read plus allocations, see the module doc). Raises ``UnsafePickleError`` for any other
    global, a call the formats never make or a size over the bound, and ``CorruptFileError`` for
    truncated or malformed input (including bz2 errors when ``fileobj`` is a ``bz2.BZ2File``).
    """
    try:
        return RestrictedUnpickler(fileobj, source, max_bytes).load()
    except UnsafePickleError:
        raise
    except _CORRUPT as exc:
        raise CorruptFileError(f"{source}: truncated or corrupt pickle ({type(exc).__name__}: {exc})") from None


def load_pbz2(path: Path | str, max_bytes: int = MAX_BYTES) -> Any:
    """Read a bz2-compressed pickle (``*.pbz2``) with ``restricted_load``.

    Streams through ``bz2.open`` so the decompressed bytes (about 13x the file) are never held
    at once. ``FileNotFoundError`` if ``path`` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with bz2.open(path, "rb") as fileobj:
        return restricted_load(fileobj, str(path), max_bytes)

