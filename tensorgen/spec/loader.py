"""op.yaml (format version 1) → `tensorgen.ir.Program`.

Every error names `file:line:col` and what was expected. YAML is composed to
nodes first so that each value keeps its position in the file.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import islpy as isl
import yaml

from tensorgen.errors import SpecError
from tensorgen.inputs import LIMITS, compose_yaml, one_line, read_text
from tensorgen.ir import poly
from tensorgen.ir.core import DTYPES, ROLES, Access, Program, Statement, Tensor, dtype_range
from tensorgen.spec.limits import check_statement_size, check_tensor_sizes, check_where
from tensorgen.spec.statement import name_problem, parse_statement
from tensorgen.spec.types import check_types

FORMAT_VERSION = 1
TOP_KEYS = {
    "tensorgen",
    "name",
    "tensors",
    "statements",
    "loops",
    "target",
    "schedule",
    "description",
}
TENSOR_KEYS = {"shape", "dtype", "role", "pad"}
STR_TAG = "tag:yaml.org,2002:str"


class _Doc:
    def __init__(self, path: str) -> None:
        self.path = path
        # one constructor for the document's scalars: building one per scalar (its resolver and
        # reader) took a third of their reading (2,137 scalars in a ResNet-18's layers)
        self.constructor = yaml.SafeLoader("")

    def at(self, node: yaml.Node) -> str:
        return f"{self.path}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def error(self, node: yaml.Node, what: str) -> SpecError:
        return SpecError(f"{self.at(node)}: {what}")

    def mapping(self, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"expected a mapping for {what}")
        out, seen = [], set()
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise self.error(k, f"expected a plain key in {what}")
            if k.tag != self.untagged(k):  # `!!null role` is no key 'role'
                raise self.error(
                    k,
                    f"expected a plain key in {what}, got '{one_line(k.value, 60)}' tagged {k.tag}",
                )
            if k.value in seen:
                raise self.error(k, f"duplicate key '{one_line(k.value, 60)}' in {what}")
            seen.add(k.value)
            out.append((k.value, k, v))
        return out

    def untagged(self, node: yaml.ScalarNode) -> str:
        """The tag YAML gives `node`'s text without an explicit tag: a key's text is its name
        whatever YAML would read it as (`on`, `1`), but an explicit tag asks for something else."""
        if node.style in ("'", '"'):
            return STR_TAG
        return self.constructor.resolve(yaml.ScalarNode, node.value, (True, False))

    def scalar(self, node: yaml.Node, kind: type, what: str):
        """The value of a scalar as YAML reads it (its tag decides: `'1'` and `!!str 1` are
        strings, `1` and `0x1` integers, `true` a bool), which must be a `kind`."""
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, f"expected {what}")
        try:
            value = self.constructor.construct_object(node)
        except Exception:  # noqa: BLE001  PyYAML's constructors fail in many ways: `!!int xx` (ValueError),
            # `!!timestamp xx` (AttributeError), 5000 digits (ValueError), an unknown tag (YAMLError)
            raise self.error(
                node,
                f"expected {what}, got '{one_line(node.value, 60)}' "
                f"(not a valid {node.tag.rsplit(':', 1)[-1]})",
            ) from None
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise self.error(node, f"expected {what}, got '{one_line(node.value, 60)}'")
        return value


def load_program(path: str | Path, target: str | None = None) -> Program:
    text = read_text(path, "the op.yaml file", SpecError)
    return parse_program(text, str(path), target)


def parse_program(text: str, path: str = "<op.yaml>", target: str | None = None) -> Program:
    try:
        return _parse_program(text, path, target)
    except SpecError as err:
        # one line whatever a file name, key or value quoted in it holds (control characters,
        # line separators); a message is already one line almost always, so this rarely rewrites
        message = str(err)
        if message.isprintable():
            raise
        raise SpecError(one_line(message, 1000), err.detail) from None


def _parse_program(text: str, path: str, target: str | None) -> Program:
    doc = _Doc(path)
    root = compose_yaml(text, path, SpecError)
    if root is None:
        raise SpecError(f"{path}:1:1: empty file; expected an op.yaml mapping with 'tensorgen: 1'")
    top = {k: (kn, v) for k, kn, v in doc.mapping(root, "the op.yaml file")}
    for key, (kn, _) in top.items():
        if key not in TOP_KEYS:
            raise doc.error(
                kn,
                f"unknown key '{one_line(key, 60)}' (expected one of {', '.join(sorted(TOP_KEYS))})",
            )
    for key in ("tensorgen", "tensors", "statements"):
        if key not in top:
            raise doc.error(root, f"missing key '{key}'")
    version = doc.scalar(top["tensorgen"][1], int, "the format version 1")
    if version != FORMAT_VERSION:
        raise doc.error(top["tensorgen"][1], f"unsupported format version {version} (expected 1)")
    name = doc.scalar(top["name"][1], str, "a name") if "name" in top else Path(path).stem
    if not name.isprintable() or not 0 < len(name) <= 128:
        raise doc.error(top["name"][1], "expected a name of 1 to 128 printable characters")
    tensors = _tensors(doc, top["tensors"][1])
    shared = _loops(doc, top["loops"][1]) if "loops" in top else ()
    statements = _statements(doc, top["statements"][1], tensors, shared)
    named = doc.scalar(top["target"][1], str, "a target name") if "target" in top else "tg1"
    tgt = target or named
    sched = doc.scalar(top["schedule"][1], str, "a schedule") if "schedule" in top else "auto"
    program = Program(name, tuple(tensors.values()), tuple(statements), shared, tgt, sched, path)
    _check_roles(doc, program, top["statements"][1])
    return program


def _tensors(doc: _Doc, node: yaml.Node) -> dict[str, Tensor]:
    tensors: dict[str, Tensor] = {}
    for name, kn, spec in doc.mapping(node, "'tensors'"):
        problem = name_problem(name, "tensor")
        if problem:
            raise doc.error(kn, problem)
        fields = {k: (knode, v) for k, knode, v in doc.mapping(spec, f"tensor {name}")}
        for k, (knode, _) in fields.items():
            if k not in TENSOR_KEYS:
                raise doc.error(
                    knode,
                    f"unknown key '{one_line(k, 60)}' in tensor {name} (expected shape, dtype, role, pad)",
                )
        if "shape" not in fields or "dtype" not in fields:
            raise doc.error(spec, f"tensor {name} needs 'shape' and 'dtype'")
        shape_node = fields["shape"][1]
        if not isinstance(shape_node, yaml.SequenceNode) or not shape_node.value:
            raise doc.error(
                shape_node, f"expected a non-empty list of dimensions for {name}'s shape"
            )
        if len(shape_node.value) > LIMITS.tensor_rank:
            raise doc.error(
                shape_node,
                f"{name} has {len(shape_node.value)} dimensions; at most "
                f"{LIMITS.tensor_rank} (limit InputLimits.tensor_rank in tensorgen/inputs.py)",
            )
        shape = []
        for d in shape_node.value:
            v = doc.scalar(d, int, "a positive integer dimension")
            if v <= 0:
                raise doc.error(d, f"expected a positive integer dimension, got {v}")
            shape.append(v)
        dtype = doc.scalar(fields["dtype"][1], str, "a dtype")
        if dtype not in DTYPES:
            raise doc.error(
                fields["dtype"][1],
                f"unknown dtype '{one_line(dtype, 60)}' (expected {', '.join(DTYPES)})",
            )
        role = doc.scalar(fields["role"][1], str, "a role") if "role" in fields else "none"
        if role not in ROLES:
            raise doc.error(
                fields["role"][1],
                f"unknown role '{one_line(role, 60)}' (expected {', '.join(ROLES)})",
            )
        pad = doc.scalar(fields["pad"][1], int, "an integer pad value") if "pad" in fields else 0
        lo, hi = dtype_range(dtype)
        if not lo <= pad <= hi:
            raise doc.error(fields["pad"][1], f"pad value {pad} does not fit {dtype}")
        tensors[name] = Tensor(name, tuple(shape), dtype, role, pad)
    if not tensors:
        raise doc.error(node, "expected at least one tensor")
    check_tensor_sizes(doc, {n: kn for n, kn, _ in doc.mapping(node, "'tensors'")}, tensors)
    return tensors


def _loops(doc: _Doc, node: yaml.Node) -> tuple[tuple[str, int], ...]:
    loops = []
    for name, kn, v in doc.mapping(node, "'loops'"):
        problem = name_problem(name, "loop")
        if problem:
            raise doc.error(kn, problem)
        extent = doc.scalar(v, int, "a positive trip count")
        if extent <= 0:
            raise doc.error(v, f"expected a positive trip count, got {extent}")
        if extent > LIMITS.loop_extent:
            raise doc.error(
                v,
                f"trip count {extent} is over the limit of {LIMITS.loop_extent:,} "
                "(limit InputLimits.loop_extent in tensorgen/inputs.py)",
            )
        loops.append((name, extent))
    return tuple(loops)


def _statement_text(doc: _Doc, node: yaml.Node) -> tuple[str, int, int, str, yaml.Node | None]:
    """(text, line, col, where, where_node) of one entry of 'statements'."""
    where, where_node = "", None
    if isinstance(node, yaml.MappingNode):
        fields = {k: (kn, v) for k, kn, v in doc.mapping(node, "a statement")}
        for k, (kn, _) in fields.items():
            if k not in ("stmt", "where"):
                raise doc.error(
                    kn, f"unknown key '{one_line(k, 60)}' in a statement (expected stmt, where)"
                )
        if "stmt" not in fields:
            raise doc.error(node, "expected 'stmt:' in a statement mapping")
        if "where" in fields:
            where_node = fields["where"][1]
            where = doc.scalar(where_node, str, "isl constraints like '0 <= r < 3 and j <= i'")
            check_where(doc, where_node, where)
        node = fields["stmt"][1]
    if not isinstance(node, yaml.ScalarNode):
        raise doc.error(node, "expected a statement like 'Y[i, j] += A[i, k] * B[k, j]'")
    quoted = 1 if node.style in ("'", '"') else 0
    return (
        node.value,
        node.start_mark.line + 1,
        node.start_mark.column + 1 + quoted,
        where,
        where_node,
    )


def _statements(doc: _Doc, node: yaml.Node, tensors: dict[str, Tensor], shared) -> list[Statement]:
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise doc.error(node, "expected a non-empty list of statements")
    if len(node.value) > LIMITS.statements:
        raise doc.error(
            node,
            f"{len(node.value)} statements; at most {LIMITS.statements} "
            "(limit InputLimits.statements in tensorgen/inputs.py)",
        )
    shared_names = [n for n, _ in shared]
    out = []
    for pos, item in enumerate(node.value):
        text, line, col, where, where_node = _statement_text(doc, item)
        parsed = parse_statement(text, doc.path, line, col)
        loc = f"{doc.path}:{line}:{col}"
        for acc in [parsed.lhs] + _reads(parsed.rhs):
            _check_access(loc, acc, tensors)
        indices = _index_order(parsed, shared_names)
        stmt = Statement(
            f"S{pos}", parsed.lhs, parsed.op, parsed.rhs, tuple(indices), (), where, text, loc
        )
        if not indices:  # the reference (and isl's ast) need an index to iterate over
            raise SpecError(
                f"{loc}: a statement needs at least one index; write a single element as "
                f"'C[i, 0] = ...' with where: 'i = 0'"
            )
        check_types(stmt, tensors)
        stmt = _infer_bounds(doc, stmt, tensors, dict(shared), where_node or item)
        check_statement_size(stmt)
        _check_write_in_bounds(stmt, tensors[stmt.lhs.tensor])
        out.append(stmt)
    return out


def _reads(rhs) -> list[Access]:
    from tensorgen.ir.core import reads_of

    return reads_of(rhs)


def _check_access(loc: str, acc: Access, tensors: dict[str, Tensor]) -> None:
    if acc.tensor not in tensors:
        raise SpecError(
            f"{loc}: unknown tensor '{acc.tensor}' (declared: {one_line(', '.join(tensors), 200)})"
        )
    rank = len(tensors[acc.tensor].shape)
    if len(acc.index) != rank and not acc.table:  # lut's table: its dtype check says more
        raise SpecError(
            f"{loc}: shape mismatch: {acc} has {len(acc.index)} subscript(s) but {acc.tensor} has {rank} dimension(s)"
        )


def _index_order(parsed, shared_names: list[str]) -> list[str]:
    order = list(shared_names)
    for acc in [parsed.lhs] + _reads(parsed.rhs):
        for sub in acc.index:
            for name in sub.names:
                if name not in order:
                    order.append(name)
    return order


def _infer_bounds(doc, stmt: Statement, tensors, shared: dict[str, int], where_node) -> Statement:
    """Ranges from bare subscripts (as Tensor Comprehensions does), then `where:`."""
    known: dict[str, tuple[int, str]] = {}
    for acc in [stmt.lhs] + stmt.reads:
        for dim, sub in enumerate(acc.index):
            name = sub.bare()
            if name is None or name in shared:
                continue
            extent = tensors[acc.tensor].shape[dim]
            if name in known and known[name][0] != extent and _mentions(stmt.where, name):
                # the statement's where: bounds it explicitly: the ranges intersect (a slice of a
                # larger tensor, as in a concatenation)
                known[name] = (min(extent, known[name][0]), known[name][1])
                continue
            if name in known and known[name][0] != extent:
                raise SpecError(
                    f"{stmt.location}: shape mismatch: index '{name}' ranges over {known[name][0]} "
                    f"({known[name][1]}) but over {extent} in {acc.tensor} dimension {dim}"
                )
            known.setdefault(name, (extent, f"{acc.tensor} dimension {dim}"))
    cons = []
    for name in stmt.indices:
        if name in shared:
            cons.append(f"0 <= {name} < {shared[name]}")
        elif name in known:
            cons.append(f"0 <= {name} < {known[name][0]}")
    if stmt.where:
        cons.append(f"({stmt.where})")
    text = f"{{ [{', '.join(stmt.indices)}] : {' and '.join(cons) or 'true'} }}"
    try:
        dom = isl.Set(text)
    except isl.Error:
        raise doc.error(
            where_node,
            f"cannot parse where: '{one_line(stmt.where, 80)}' (expected isl constraints like '0 <= r < 3')",
        ) from None
    if dom.is_empty():
        raise doc.error(
            where_node,
            f"where: '{one_line(stmt.where, 80)}' leaves the statement no iterations; "
            f"expected constraints that some index values satisfy",
        )
    return dataclasses.replace(stmt, bounds=_box_of(dom, stmt))


def _box_of(dom: isl.Set, stmt: Statement) -> tuple[tuple[int, int], ...]:
    """The (lo, hi) of every index over the domain; an index without both is refused."""
    bounds = []
    for pos, name in enumerate(stmt.indices):
        try:
            lo, hi = dom.dim_min(pos), dom.dim_max(pos)
        except isl.Error:  # isl reports an unbounded index as an error, not as a value
            lo = hi = None
        if lo is None or not (lo.is_cst() and hi.is_cst()):
            raise SpecError(
                f"{stmt.location}: cannot infer the range of index '{name}': it never subscripts a tensor "
                f"dimension bare; give it a bound with 'where:'"
            )
        lo_v = lo.get_pieces()[0][1].get_constant_val().to_python()
        hi_v = hi.get_pieces()[0][1].get_constant_val().to_python()
        bounds.append((int(lo_v), int(hi_v)))
    return tuple(bounds)


def _mentions(where: str, name: str) -> bool:
    return bool(where) and re.search(rf"\b{re.escape(name)}\b", where) is not None


def _check_write_in_bounds(stmt: Statement, tensor: Tensor) -> None:
    written = poly.access_map(stmt, stmt.lhs).range()
    outside = written.subtract(poly.tensor_box(tensor))
    if not outside.is_empty():
        point = outside.sample_point()
        coords = [
            point.get_coordinate_val(isl.dim_type.set, i).to_python()
            for i in range(len(tensor.shape))
        ]
        raise SpecError(
            f"{stmt.location}: out-of-bounds write: {stmt.lhs} reaches {tensor.name}"
            f"[{', '.join(map(str, coords))}] outside shape {list(tensor.shape)}"
        )


def _check_roles(doc: _Doc, program: Program, node: yaml.Node) -> None:
    written = {s.lhs.tensor: s for s in program.statements}
    for stmt in program.statements:
        if program.tensor(stmt.lhs.tensor).role == "input":
            raise SpecError(
                f"{stmt.location}: {stmt.lhs.tensor} is an input and cannot be written (make it inout)"
            )
    for t in program.tensors:
        if t.role in ("output", "inout") and t.name not in written and t.role == "output":
            raise doc.error(node, f"output tensor {t.name} is never written")
    if not program.outputs:
        raise doc.error(node, "no tensor has role output or inout: the program computes nothing")
