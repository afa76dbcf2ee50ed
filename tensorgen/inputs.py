"""Reading files that come from elsewhere: op.yaml, targets, schedule files, .tgb binaries, arrays.

Every reader here refuses, with one line naming the file, what would otherwise hang, exhaust
memory or end in a traceback: a FIFO or device given as a file (it could block forever or never
end, as /dev/zero does), a file over its size limit, text that is not UTF-8, YAML whose aliases
expand without bound ("billion laughs") or nest deeper than a description ever needs. Limits are
fields of `InputLimits`, passed along explicitly; the error names the limit.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from tensorgen.errors import TensorgenError


@dataclass(frozen=True)
class InputLimits:
    """Upper bounds on what an input file may ask of tensorgen (all checked before the work)."""

    text_bytes: int = 4 << 20  # op.yaml, target and schedule files
    binary_bytes: int = 1 << 30  # .tgb files and .npy arrays
    yaml_depth: int = 32  # nesting of YAML collections
    yaml_nodes: int = 200_000  # YAML nodes after aliases are expanded
    # What an op.yaml program may ask for (tensorgen.spec.loader checks each before any isl work;
    # docs/op-yaml.md, "Limits"). Each keeps every later count, offset and product int64-exact.
    tensor_elements: int = 1 << 31  # elements of one tensor
    dram_bytes: int = 1 << 32  # all tensors together: the DRAM image of the binary
    tensor_rank: int = (
        6  # dimensions of a tensor: the rank of a box in the binary (mc.operands.MAX_RANK)
    )
    name_chars: int = 32  # a tensor, index or loop name: the .tgb tensor table holds 32 bytes
    loop_extent: int = 1 << 31  # trip count of one index or shared loop (LOOP counts are u32)
    statement_iterations: int = 1 << 40  # instances of one statement, shared loops included
    # points the PyTorch reference evaluates as index tensors for one statement (a statement that
    # is not one aten contraction or convolution): about 100 bytes of tensors per point
    reference_points: int = 1 << 24
    # statement runs of the reference: shared-loop steps times statements, each a Python step
    reference_steps: int = 1 << 14
    # bytes of the reference's working copies of all tensors (int64 each element): a check holds
    # them beside the inputs and the simulator's DRAM image
    reference_bytes: int = 1 << 30
    # compile time grows with the square of the statement count: 103 statements took 8 CPU-s
    statements: int = 64
    statement_chars: int = 4096  # one statement, and one where: text
    expr_depth: int = 32  # nesting of a statement's expression (each operator or call is a level)
    expr_nodes: int = 512  # operators, calls, reads and constants of one statement
    # integer constants, subscript coefficients and offsets, and every subscript's value over the
    # statement's iterations: the ISA's i32 immediates (tensorgen.mc.isa)
    int_min: int = -(1 << 31)
    int_max: int = (1 << 31) - 1
    float_abs_max: float = 2.0**31  # a scale: f32(int32 accumulator) * scale stays below 2**62
    float_abs_min: float = 2.0**-126  # smallest nonzero scale: a normal float32


LIMITS = InputLimits()


def one_line(text: object, limit: int = 200) -> str:
    """`text` as a single printable line: control characters escaped, long text cut."""
    s = str(text)
    out = "".join(
        ch if ch.isprintable() else repr(ch)[1:-1] for ch in s.replace("\n", " ").replace("\r", " ")
    )
    return out if len(out) <= limit else out[: limit - 3] + "..."


def read_bytes(
    path: str | Path,
    what: str,
    error: type[TensorgenError] = TensorgenError,
    max_bytes: int | None = None,
) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` (default `LIMITS.binary_bytes`).

    A FIFO, device, socket or directory is refused before it is opened for reading, so nothing
    blocks; the size is checked on the open file, so a file that grows is cut off at the limit."""
    limit = LIMITS.binary_bytes if max_bytes is None else max_bytes
    name = str(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise error(f"{name}: cannot read ({err.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise error(f"{name}: cannot read ({kind}, expected {what})")
    too_large = f"{name}: {what} is larger than the limit of {limit:,} bytes (InputLimits)"
    if st.st_size > limit:
        os.close(fd)
        raise error(too_large)
    with os.fdopen(fd, "rb") as f:
        # NOTE: read(n) allocates n bytes up front, so read what the file holds (plus one byte to
        # see it grew), never the limit itself; a file that grows past the limit is still cut off.
        chunks, total = [], 0
        try:
            while chunk := f.read(
                max(st.st_size - total, 0) + 1 if total <= st.st_size else 1 << 20
            ):
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:
                    raise error(too_large)
        except OSError as err:
            raise error(f"{name}: cannot read ({err.strerror})") from None
    return b"".join(chunks)


def read_text(
    path: str | Path,
    what: str,
    error: type[TensorgenError] = TensorgenError,
    max_bytes: int | None = None,
) -> str:
    """The UTF-8 text of the regular file `path` (at most `LIMITS.text_bytes` by default)."""
    data = read_bytes(path, what, error, LIMITS.text_bytes if max_bytes is None else max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise error(
            f"{path}:{line}: {what} is not UTF-8 text (byte 0x{data[err.start]:02x})"
        ) from None


def _yaml_error(
    err: yaml.YAMLError, where: str, error: type[TensorgenError], text: str = ""
) -> TensorgenError:
    mark = getattr(err, "problem_mark", None)
    at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
    if mark is None and isinstance(err, yaml.reader.ReaderError) and text:
        # the reader (a control character) knows only the character's offset in the text
        before = text[: err.position]
        at = f"{where}:{before.count(chr(10)) + 1}:{err.position - (before.rfind(chr(10)) + 1) + 1}"
    problem = getattr(err, "problem", None) or str(err).split("\n")[0]
    return error(f"{at}: malformed YAML ({one_line(problem)})")


class _DepthLimitedLoader(yaml.SafeLoader):
    """The safe loader's composer, stopped at `LIMITS.yaml_depth` levels as it descends: 3,000
    nested `[` otherwise recurse until Python's own limit (1.7 CPU-s) before the check."""

    def __init__(self, text: str, where: str, error: type[TensorgenError]) -> None:
        super().__init__(text)
        self.depth, self.where, self.error = 0, where, error

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 - PyYAML's signature
        self.depth += 1
        try:
            if self.depth > LIMITS.yaml_depth:
                mark = self.peek_event().start_mark
                raise self.error(
                    f"{self.where}:{mark.line + 1}:{mark.column + 1}: YAML nested deeper than "
                    f"{LIMITS.yaml_depth} levels (limit InputLimits.yaml_depth in "
                    "tensorgen/inputs.py)"
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def compose_yaml(
    text: str, where: str, error: type[TensorgenError] = TensorgenError
) -> yaml.Node | None:
    """YAML text -> its node graph (positions kept), refusing nesting deeper than
    `LIMITS.yaml_depth` and more than `LIMITS.yaml_nodes` nodes once aliases are expanded."""
    try:
        root = _DepthLimitedLoader(text, where, error).get_single_node()
    except yaml.YAMLError as err:
        raise _yaml_error(err, where, error, text) from None
    except RecursionError:
        raise error(
            f"{where}: YAML nested too deeply (limit {LIMITS.yaml_depth}, InputLimits)"
        ) from None
    if root is not None:
        _check_size(root, where, error)
    return root


def _check_size(root: yaml.Node, where: str, error: type[TensorgenError]) -> None:
    # Aliases make the node graph a DAG: count each visit, so that expansion is what is bounded.
    count, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > LIMITS.yaml_depth:
            mark = node.start_mark
            raise error(
                f"{where}:{mark.line + 1}:{mark.column + 1}: YAML nested deeper than "
                f"{LIMITS.yaml_depth} levels (limit InputLimits.yaml_depth in tensorgen/inputs.py)"
            )
        if count > LIMITS.yaml_nodes:
            raise error(
                f"{where}: YAML expands to more than {LIMITS.yaml_nodes:,} nodes "
                "(limit InputLimits.yaml_nodes in tensorgen/inputs.py; aliases count once per use)"
            )
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))


def load_yaml(text: str, where: str, error: type[TensorgenError] = TensorgenError):
    """YAML text -> plain Python data (safe loader), within the limits of `compose_yaml`."""
    root = compose_yaml(text, where, error)
    if root is None:
        return None
    try:
        return yaml.SafeLoader("").construct_document(root)
    except yaml.YAMLError as err:
        raise _yaml_error(err, where, error) from None
    except (
        ValueError,
        TypeError,
        OverflowError,
        RecursionError,
        AttributeError,
    ) as err:  # a bad !!int, !!timestamp
        raise error(f"{where}: malformed YAML value ({one_line(err)})") from None
