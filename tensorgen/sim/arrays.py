"""Input arrays for `tensorgen run`: untrusted .npy files checked against a binary's tensor table.

The file is read through `tensorgen.inputs.read_bytes` (a size limit, no FIFO or device), its
header is parsed and checked (dtype, shape, and that the data is exactly that many bytes)
before numpy builds the array, so that a header promising 10**12 elements is refused, not
allocated; pickled object arrays are never loaded.
"""

from __future__ import annotations

import io
import math

import numpy as np

from tensorgen.errors import SimulatorError, TensorgenError
from tensorgen.inputs import one_line, read_bytes
from tensorgen.mc.binary import Binary, TensorEntry

_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}
_LOAD_ERRORS = (ValueError, EOFError, OSError, TypeError, OverflowError, KeyError, SyntaxError)


def input_tensor(binary: Binary, name: str) -> TensorEntry:
    """The input (or inout) tensor `name` of `binary`, or a one-line error."""
    for t in binary.tensors:
        if t.name == name and t.role in ("input", "inout"):
            return t
    raise SimulatorError(f"unknown input tensor(s): {one_line(name, 60)}")


def read_npy(item: str, path: str, tensor: TensorEntry) -> np.ndarray:
    """The array in the .npy file `path` for `tensor` (`item` is the command-line argument)."""
    try:
        data = read_bytes(path, "a .npy array")
    except TensorgenError as err:
        reason = str(err).removeprefix(f"{path}: ")
        if reason.startswith("cannot read (") and reason.endswith(")"):
            reason = reason[len("cannot read (") : -1]
        raise TensorgenError(f"--in {item}: cannot load {path} ({reason})") from None
    if not data:  # numpy's own words for it
        raise TensorgenError(f"--in {item}: cannot load {path} (No data left in file)")
    try:
        f = io.BytesIO(data)
        version = np.lib.format.read_magic(f)
        if version not in _HEADER_READERS:
            raise ValueError(f".npy format version {version[0]}.{version[1]} is not supported")
        shape, _, dtype = _HEADER_READERS[version](f)
    except _LOAD_ERRORS as err:
        raise TensorgenError(f"--in {item}: cannot load {path} ({one_line(err, 120)})") from None
    _check_header(tensor, shape, dtype)
    if len(data) - f.tell() != math.prod(shape) * dtype.itemsize:
        raise TensorgenError(
            f"--in {item}: cannot load {path} (its data is {len(data) - f.tell():,} bytes, "
            f"its header promises {math.prod(shape) * dtype.itemsize:,})"
        )
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except _LOAD_ERRORS as err:
        raise TensorgenError(f"--in {item}: cannot load {path} ({one_line(err, 120)})") from None


def _check_header(t: TensorEntry, shape: tuple[int, ...], dtype: np.dtype) -> None:
    # the same messages as the simulator's own check of an array given in-process
    if tuple(shape) != tuple(t.shape):
        raise SimulatorError(f"input '{t.name}' has shape {list(shape)}, expected {list(t.shape)}")
    if np.dtype(t.dtype).kind == "f":
        if dtype != np.float32:
            raise SimulatorError(
                f"input '{t.name}' has dtype {one_line(dtype, 40)}; expected float32"
            )
    elif dtype != np.dtype(t.dtype):  # a file is typed: no silent conversion of another width
        raise SimulatorError(
            f"input '{t.name}' has dtype {one_line(dtype, 40)}; expected {t.dtype} "
            f"(convert it with a.astype(np.{t.dtype}))"
        )
