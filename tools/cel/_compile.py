"""Type-check a parsed selector and compile it to nested Python closures.

One pass over the AST: each node yields its static type (for Kubernetes' compile-time
errors) and a closure ``fn(ctx) -> value``. Evaluation is then plain Python calls. CEL's
error semantics are kept: ``false && error`` is false, ``error || true`` is true, and
``all``/``exists`` absorb errors the same way.

Each node's ``size`` (its AST nodes) feeds the runtime budget of the macros (see _eval).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tools.cel import _eval as ev
from tools.cel import _functions as fn_table
from tools.cel import _library as lib
from tools.cel import _runtime as rt
from tools.cel._ast import Call, Ident, Index, ListLit, Lit, MapLit, Node, Select
from tools.cel._errors import CelCompileError, CelEvalError, CelUnsupportedError, position
from tools.cel._eval import Fn
from tools.cel._types import (
    BOOL,
    BYTES,
    DEVICE,
    DOUBLE,
    DYN,
    INT,
    NULL,
    NUMBERS,
    QUANTITY,
    STRING,
    TYPE,
    UINT,
    Ty,
    assignable,
    list_of,
    map_of,
    substitute,
    unify,
)
from tools.cel._values import CelType, UInt

_DEVICE_TYPE_FIELDS = {
    "driver": STRING,
    "attributes": map_of(STRING, map_of(STRING, DYN)),
    "capacity": map_of(STRING, map_of(STRING, QUANTITY)),
    "allowMultipleAllocations": BOOL,
}

_TYPE_IDENTS = {
    n: CelType(n)
    for n in (
        "bool",
        "int",
        "uint",
        "double",
        "string",
        "bytes",
        "list",
        "map",
        "null_type",
        "type",
    )
}

_ARITH = {
    "_+_": (rt.add, ["int", "uint", "double", "string", "bytes", "list"]),
    "_-_": (rt.sub, ["int", "uint", "double"]),
    "_*_": (rt.mul, ["int", "uint", "double"]),
    "_/_": (rt.div, ["int", "uint", "double"]),
    "_%_": (rt.mod, ["int", "uint"]),
}
_ORDER_OPS: dict[str, Callable[[int], bool]] = {
    "_<_": lambda c: c == -1,
    "_<=_": lambda c: c in (-1, 0),
    "_>_": lambda c: c == 1,
    "_>=_": lambda c: c in (0, 1),
}
_ORDERABLE = frozenset({"int", "uint", "double", "string", "bytes", "bool"})
_MACROS = {"all", "exists", "exists_one", "map", "filter"}


@dataclass(frozen=True, slots=True)
class Code:
    ty: Ty
    fn: Fn
    const: bool = False
    value: Any = None
    size: int = 1  # AST nodes, for the cost model
    # An attribute value: dyn here, Kubernetes' unknown type (AnyType) upstream, which a
    # list or map literal cannot mix with another type.
    opaque: bool = False


def _constant(ty: Ty, value: Any) -> Code:
    return Code(ty, lambda _c: value, True, value)


class Compiler:
    def __init__(self, text: str) -> None:
        self._text = text
        # name -> (static type, bound by cel.bind: the value is a _Thunk until first read)
        self._scope: dict[str, tuple[Ty, bool]] = {}
        self._in_format = False

    # -- errors ---------------------------------------------------------------------------

    def error(self, pos: int, msg: str) -> CelCompileError:
        return CelCompileError(f"{position(self._text, pos)}: {msg}", self._text, pos)

    def unsupported(self, pos: int, what: str) -> CelUnsupportedError:
        return CelUnsupportedError(
            f"{position(self._text, pos)}: {what} is valid Kubernetes CEL but not supported "
            "by this tool",
            self._text,
            pos,
        )

    # -- dispatch -------------------------------------------------------------------------

    def compile(self, node: Node) -> Code:
        if isinstance(node, Lit):
            return self._literal(node)
        if isinstance(node, Ident):
            return self._ident(node)
        if isinstance(node, Select):
            return self._select(node)
        if isinstance(node, Index):
            return self._index(node)
        if isinstance(node, ListLit):
            return self._list(node)
        if isinstance(node, MapLit):
            return self._map(node)
        return self._call(node)

    def _literal(self, node: Lit) -> Code:
        value = node.value
        t = type(value)
        ty = {
            bool: BOOL,
            int: INT,
            UInt: UINT,
            float: DOUBLE,
            str: STRING,
            bytes: BYTES,
            type(None): NULL,
        }[t]
        return _constant(ty, value)

    def _ident(self, node: Ident) -> Code:
        name = node.name
        if name in self._scope:
            ty, lazy = self._scope[name]
            if lazy:
                return Code(ty, lambda c: ev.force(c, name))
            return Code(ty, lambda c: c.vars[name])
        if name == "device":
            return Code(DEVICE, lambda c: c.device)
        if name in _TYPE_IDENTS:
            return _constant(TYPE, _TYPE_IDENTS[name])
        if name in fn_table.UNSUPPORTED_NAMESPACES:
            raise self.unsupported(node.pos, fn_table.UNSUPPORTED_NAMESPACES[name])
        raise self.error(node.pos, f"undeclared reference to '{name}' (in container '')")

    def _is_device(self, node: Node) -> bool:
        return isinstance(node, Ident) and node.name == "device" and "device" not in self._scope

    def _select(self, node: Select) -> Code:
        fast = self._device_lookup(node.operand, node.field)
        if fast is not None:
            return fast
        operand = self.compile(node.operand)
        field = node.field
        ty = operand.ty
        if ty == DEVICE:
            if field not in _DEVICE_TYPE_FIELDS:
                raise self.error(node.pos, f"undefined field '{field}'")
            result = _DEVICE_TYPE_FIELDS[field]
            if self._is_device(node.operand):
                return Code(result, _device_field(field), size=2)
        elif ty.name == "map":
            if ty.args[0] not in (STRING, DYN):
                raise self.error(node.pos, f"type '{ty}' does not support field selection")
            result = ty.args[1]
        elif ty == DYN:
            result = DYN
        else:
            raise self.error(node.pos, f"type '{ty}' does not support field selection")
        fn = operand.fn
        opaque = ty.name == "map" and result == DYN
        return Code(result, lambda c: rt.select(fn(c), field), size=operand.size + 1, opaque=opaque)

    def _device_domain(self, node: Node) -> tuple[str, bool] | None:
        """``device.attributes["d"]`` or ``device.capacity["d"]``: the domain, and whether
        it is capacity; None for anything else."""
        if (
            isinstance(node, Index)
            and isinstance(node.index, Lit)
            and type(node.index.value) is str
            and isinstance(node.operand, Select)
            and node.operand.field in ("attributes", "capacity")
            and self._is_device(node.operand.operand)
        ):
            return node.index.value, node.operand.field == "capacity"
        return None

    def _device_lookup(self, domains: Node, ident: str) -> Code | None:
        """``device.attributes["d"].x`` (or ``device.capacity``): one call, no temporaries."""
        found = self._device_domain(domains)
        if found is None:
            return None
        domain, of_capacity = found
        if of_capacity:

            def capacity(c: ev.Ctx) -> Any:
                try:
                    return c.device.capacity_value(domain, ident)
                except KeyError:
                    raise CelEvalError(f"no such key: {ident}") from None

            return Code(QUANTITY, capacity, size=4)

        def attribute(c: ev.Ctx) -> Any:
            try:
                return c.device.attribute(domain, ident)
            except KeyError:
                raise CelEvalError(f"no such key: {ident}") from None

        return Code(DYN, attribute, size=4, opaque=True)

    def _index(self, node: Index) -> Code:
        if isinstance(node.index, Lit) and type(node.index.value) is str:
            fast = self._device_lookup(node.operand, node.index.value)
            if fast is not None:
                return fast
        operand = self.compile(node.operand)
        key = self.compile(node.index)
        ty = operand.ty
        if ty.name == "list":
            if key.ty not in (INT, DYN):
                raise self._no_overload(node.pos, "_[_]", [ty, key.ty])
            result = ty.args[0]
        elif ty.name == "map":
            if not assignable(ty.args[0], key.ty):
                raise self._no_overload(node.pos, "_[_]", [ty, key.ty])
            result = ty.args[1]
        elif ty == DYN:
            result = DYN
        else:
            raise self._no_overload(node.pos, "_[_]", [ty, key.ty])
        fo = operand.fn
        size = operand.size + key.size + 1
        opaque = ty.name == "map" and result == DYN
        if key.const:
            k = key.value
            return Code(result, lambda c: rt.index(fo(c), k), size=size, opaque=opaque)
        fk = key.fn
        return Code(result, lambda c: rt.index(fo(c), fk(c)), size=size, opaque=opaque)

    def _list(self, node: ListLit) -> Code:
        items = [self.compile(i) for i in node.items]
        self._homogeneous(items, node.items)
        elem = _join_types([i.ty for i in items])
        fns = [i.fn for i in items]
        size = 1 + sum(i.size for i in items)
        if all(i.const for i in items):
            values = [i.value for i in items]
            return Code(list_of(elem), lambda _c: list(values), size=size)
        return Code(list_of(elem), lambda c: [f(c) for f in fns], size=size)

    def _homogeneous(self, codes: list[Code], nodes: Sequence[Node]) -> None:
        """Kubernetes' HomogeneousAggregateLiterals: a literal's elements share one type."""
        if self._in_format:
            return
        first: Ty | None = None
        for code, node in zip(codes, nodes, strict=True):
            ty = _ANY if code.opaque else code.ty
            if first is None or first == DYN:
                first = ty
            elif ty != DYN and not _literal_assignable(first, ty):
                raise self.error(node.pos, f"expected type '{first}' but found '{ty}'")

    def _map(self, node: MapLit) -> Code:
        entries = [(self.compile(k), self.compile(v)) for k, v in node.entries]
        for (key, _), (kn, _) in zip(entries, node.entries, strict=True):
            if key.ty not in (INT, UINT, BOOL, STRING, DYN):
                raise self.error(kn.pos, f"unsupported map key type: {key.ty}")
        self._homogeneous([k for k, _ in entries], [k for k, _ in node.entries])
        self._homogeneous([v for _, v in entries], [v for _, v in node.entries])
        ty = map_of(
            _join_types([k.ty for k, _ in entries]), _join_types([v.ty for _, v in entries])
        )
        fns = [(k.fn, v.fn) for k, v in entries]
        size = 1 + sum(k.size + v.size for k, v in entries)

        def build(c: ev.Ctx) -> dict[object, Any]:
            out: dict[object, Any] = {}
            kinds: dict[object, type] = {}
            for fk, fv in fns:
                key = fk(c)
                kind = type(key)
                if kind not in (int, UInt, bool, str):
                    raise CelEvalError(f"unsupported key type: {rt.type_name(key)}")
                if key in out:
                    if kinds[key] is not kind:
                        # Python's dict merges 1, 1u and true; CEL keeps them apart.
                        raise CelEvalError(
                            f"map keys {key!r} of types {rt.type_name(key)} and "
                            f"{kinds[key].__name__} collide: not supported by this tool"
                        )
                    raise CelEvalError(f"Failed with repeated key: {key!r}")
                kinds[key] = kind
                out[key] = fv(c)
            return out

        return Code(ty, build, size=size)

    # -- calls ----------------------------------------------------------------------------

    def _call(self, node: Call) -> Code:
        name, target, args = node.name, node.target, node.args
        if name == "format" and not self._in_format:
            # cel-go's homogeneous-literal validator exempts everything inside format().
            self._in_format = True
            try:
                return self._call(node)
            finally:
                self._in_format = False
        if target is None and name == "has":
            return self._has(node)
        if (
            name == "bind"
            and isinstance(target, Ident)
            and target.name == "cel"
            and "cel" not in self._scope
        ):
            return self._bind(node)
        if target is not None and name in _MACROS:
            if len(args) == 3 and name in ("all", "exists", "exists_one"):
                raise self.unsupported(node.pos, "a two-variable comprehension")
            if len(args) == 2 or (name == "map" and len(args) == 3):
                return self._comprehension(node)
        if name == "_&&_" or name == "_||_":
            return self._logic(node)
        if name == "_?_:_":
            return self._conditional(node)
        if name == "!_":
            arg = self._arg(node, 0)
            self._expect(node, "!_", [arg.ty], [BOOL])
            fn = arg.fn
            return Code(BOOL, lambda c: rt.logical_not(fn(c)), size=arg.size + 1)
        if name == "-_":
            arg = self._arg(node, 0)
            if arg.ty not in (INT, DOUBLE, DYN):
                raise self._no_overload(node.pos, "-_", [arg.ty])
            fn = arg.fn
            return Code(arg.ty, lambda c: rt.negate(fn(c)), size=arg.size + 1)
        if name in _ARITH:
            return self._arith(node)
        if name in _ORDER_OPS:
            return self._ordering(node)
        if name in ("_==_", "_!=_"):
            return self._equality(node)
        if name == "@in":
            return self._in(node)
        if isinstance(target, Ident) and target.name not in self._scope:
            if (target.name, name) in fn_table.NAMESPACED:
                return self._function(node, name, None, args)
            if target.name in fn_table.UNSUPPORTED_NAMESPACES:
                raise self.unsupported(
                    node.pos,
                    f"{target.name}.{name} ({fn_table.UNSUPPORTED_NAMESPACES[target.name]})",
                )
        if name in fn_table.UNSUPPORTED_FUNCTIONS:
            raise self.unsupported(node.pos, f"'{name}' ({fn_table.UNSUPPORTED_FUNCTIONS[name]})")
        if name not in fn_table.SIGS or name == "quote":
            if target is not None:
                self.compile(target)  # an unsupported receiver is the better message
            raise self.error(node.pos, f"undeclared reference to '{name}' (in container '')")
        return self._function(node, name, target, args)

    def _arg(self, node: Call, i: int) -> Code:
        return self.compile(node.args[i])

    def _no_overload(
        self, pos: int, name: str, types: list[Ty], member: bool = False
    ) -> CelCompileError:
        if member:
            shown = f"{types[0]}.({', '.join(str(t) for t in types[1:])})"
        else:
            shown = f"({', '.join(str(t) for t in types)})"
        return self.error(pos, f"found no matching overload for '{name}' applied to '{shown}'")

    def _expect(self, node: Call, name: str, got: list[Ty], want: list[Ty]) -> None:
        if not all(g in (DYN, w) for g, w in zip(got, want, strict=True)):
            raise self._no_overload(node.pos, name, got)

    def _function(self, node: Call, name: str, target: Node | None, args: tuple[Node, ...]) -> Code:
        member = target is not None
        codes = ([self.compile(target)] if target is not None else []) + [
            self.compile(a) for a in args
        ]
        types = [c.ty for c in codes]
        results: list[Ty] = []
        for sig in fn_table.SIGS[name]:
            if sig.member != member or len(sig.params) != len(codes):
                continue
            binds: dict[str, Ty] = {}
            if all(unify(p, t, binds) for p, t in zip(sig.params, types, strict=True)):
                results.append(substitute(sig.result, binds))
        if not results:
            raise self._no_overload(node.pos, name, types, member)
        result = results[0] if all(r == results[0] for r in results) else DYN
        impl = fn_table.TABLE[name][0]
        if name == "sum" and types[0].name == "list":
            zero = {UINT: UInt(0), DOUBLE: 0.0}.get(types[0].args[0], 0)
            return self._apply(result, rt.guarded(name, lambda v: lib.list_sum(v, zero)), codes)
        if name in ("matches", "find", "findAll") and len(codes) >= 2 and codes[1].const:
            try:
                lib.compile_regex(codes[1].value)
            except CelEvalError as err:
                pattern = args[0] if target is not None else args[1]
                raise self.error(pattern.pos, str(err)) from None
        return self._apply(result, rt.guarded(name, impl), codes)

    def _apply(self, result: Ty, impl: Callable[..., Any], codes: list[Code]) -> Code:
        size = 1 + sum(c.size for c in codes)
        if all(c.const for c in codes):
            # Every library function is pure: fold constants such as quantity("40Gi") now,
            # unless that fails, in which case the error stays an evaluation error.
            try:
                folded = impl(*[c.value for c in codes])
            except CelEvalError:
                pass
            else:
                if type(folded) is not list and type(folded) is not dict:
                    return Code(result, lambda _c: folded, True, folded, size)
        fns = [c.fn for c in codes]
        if len(fns) == 0:
            return Code(result, lambda _c: impl(), size=size)
        if len(fns) == 1:
            f0 = fns[0]
            return Code(result, lambda c: impl(f0(c)), size=size)
        if len(fns) == 2:
            f0, f1 = fns
            if codes[1].const:
                v1 = codes[1].value
                return Code(result, lambda c: impl(f0(c), v1), size=size)
            return Code(result, lambda c: impl(f0(c), f1(c)), size=size)
        return Code(result, lambda c: impl(*[f(c) for f in fns]), size=size)

    def _arith(self, node: Call) -> Code:
        impl, kinds = _ARITH[node.name]
        left, right = self._arg(node, 0), self._arg(node, 1)
        lt, rt_ = left.ty, right.ty
        if lt == DYN or rt_ == DYN:
            result = rt_ if lt == DYN else lt
            if result.name not in kinds:
                result = DYN
        elif (
            lt.name == rt_.name and lt.name in kinds and (lt.name != "list" or assignable(lt, rt_))
        ):
            result = lt if lt.name != "list" else list_of(_join_types([lt.args[0], rt_.args[0]]))
        else:
            raise self._no_overload(node.pos, node.name, [lt, rt_])
        fl, fr = left.fn, right.fn
        return Code(result, lambda c: impl(fl(c), fr(c)), size=left.size + right.size + 1)

    def _ordering(self, node: Call) -> Code:
        left, right = self._arg(node, 0), self._arg(node, 1)
        lt, rt_ = left.ty, right.ty
        # CrossTypeNumericComparisons: int, uint and double order against each other by value
        # (rt.compare); equality stays homogeneous, see _equality.
        mixed_numbers = lt in NUMBERS and rt_ in NUMBERS
        typed = lt != DYN and rt_ != DYN and not mixed_numbers
        if typed and (lt != rt_ or lt.name not in _ORDERABLE):
            raise self._no_overload(node.pos, node.name, [lt, rt_])
        test = _ORDER_OPS[node.name]
        fl, fr = left.fn, right.fn
        name = node.name
        return Code(
            BOOL, lambda c: test(rt.compare(name, fl(c), fr(c))), size=left.size + right.size + 1
        )

    def _equality(self, node: Call) -> Code:
        left, right = self._arg(node, 0), self._arg(node, 1)
        lt, rt_ = left.ty, right.ty
        if not assignable(lt, rt_):
            # Also for 1 == 1.0: the API server's checker has no mixed-number equality.
            raise self._no_overload(node.pos, node.name, [lt, rt_])
        negate = node.name == "_!=_"
        fl, fr = left.fn, right.fn
        size = left.size + right.size + 1
        if right.const and type(right.value) is str:
            return _string_equality(left.fn, right.value, negate, size)
        if negate:
            return Code(BOOL, lambda c: not rt.equals(fl(c), fr(c)), size=size)
        return Code(BOOL, lambda c: rt.equals(fl(c), fr(c)), size=size)

    def _in(self, node: Call) -> Code:
        item, container = self._arg(node, 0), self._arg(node, 1)
        ct = container.ty
        ok = assignable(ct.args[0], item.ty) if ct.name in ("list", "map") else ct == DYN
        if not ok:
            raise self._no_overload(node.pos, "@in", [item.ty, ct])
        fi, fc = item.fn, container.fn
        return Code(BOOL, lambda c: rt.contains(fc(c), fi(c)), size=item.size + container.size + 1)

    def _logic(self, node: Call) -> Code:
        left, right = self._arg(node, 0), self._arg(node, 1)
        if left.ty not in (BOOL, DYN) or right.ty not in (BOOL, DYN):
            raise self._no_overload(node.pos, node.name, [left.ty, right.ty])
        fl, fr = left.fn, right.fn
        # The value that decides the result on its own (false for &&, true for ||).
        decisive: bool = node.name == "_||_"
        name = node.name

        def logic(c: ev.Ctx) -> bool:
            try:
                a = fl(c)
            except ev.CostLimitError:
                raise
            except ev.LOGIC_ERRORS as err:
                b = fr(c)
                if b is decisive:
                    return bool(decisive)
                if type(b) is not bool:
                    raise rt.no_overload(name, b) from err
                raise
            if a is decisive:
                return bool(decisive)
            b = fr(c)
            if type(a) is not bool:
                if b is decisive:
                    return bool(decisive)
                raise rt.no_overload(name, a, b)
            if type(b) is not bool:
                raise rt.no_overload(name, a, b)
            return bool(b)

        return Code(BOOL, logic, size=left.size + right.size + 1)

    def _conditional(self, node: Call) -> Code:
        cond, then, other = (self._arg(node, i) for i in range(3))
        if cond.ty not in (BOOL, DYN):
            raise self._no_overload(node.pos, "_?_:_", [cond.ty, then.ty, other.ty])
        if not assignable(then.ty, other.ty):
            raise self._no_overload(node.pos, "_?_:_", [cond.ty, then.ty, other.ty])
        result = then.ty if then.ty == other.ty else DYN
        fc, ft, fo = cond.fn, then.fn, other.fn

        def conditional(c: ev.Ctx) -> Any:
            test = fc(c)
            if test is True:
                return ft(c)
            if test is False:
                return fo(c)
            raise rt.no_overload("_?_:_", test)

        return Code(result, conditional, size=cond.size + then.size + other.size + 1)

    # -- macros ---------------------------------------------------------------------------

    def _has(self, node: Call) -> Code:
        if len(node.args) != 1 or not isinstance(node.args[0], Select):
            raise self.error(node.pos, "invalid argument to has() macro")
        sel = node.args[0]
        field = sel.field
        operand = sel.operand
        found = self._device_domain(operand)
        if found is not None:
            domain, capacity = found
            return Code(BOOL, lambda c: c.device.has(domain, field, capacity))
        code = self.compile(operand)
        if code.ty.name not in ("map", "dyn", "device"):
            raise self.error(sel.pos, f"type '{code.ty}' does not support field selection")
        if code.ty == DEVICE and field not in _DEVICE_TYPE_FIELDS:
            raise self.error(sel.pos, f"undefined field '{field}'")
        fn = code.fn
        return Code(BOOL, lambda c: rt.has_field(fn(c), field), size=code.size + 1)

    def _variable(self, node: Node) -> str:
        if not isinstance(node, Ident):
            raise self.error(node.pos, "argument is not an identifier")
        return node.name

    def _scoped(self, name: str, ty: Ty, node: Node, lazy: bool = False) -> Code:
        saved = self._scope.get(name)
        self._scope[name] = (ty, lazy)
        try:
            return self.compile(node)
        finally:
            if saved is None:
                del self._scope[name]
            else:
                self._scope[name] = saved

    def _bind(self, node: Call) -> Code:
        if len(node.args) != 3:
            raise self._no_overload(node.pos, "cel.bind", [DYN] * len(node.args))
        name = self._variable(node.args[0])
        init = self.compile(node.args[1])
        body = self._scoped(name, init.ty, node.args[2], lazy=True)
        fi, fb = init.fn, body.fn

        def bind(c: ev.Ctx) -> Any:
            saved = c.vars.get(name, ev.UNSET)
            # Lazy like cel-cpp: an unused binding that would fail does not fail the result.
            c.vars[name] = ev.Thunk(fi, dict(c.vars))
            try:
                return fb(c)
            finally:
                ev.restore(c, name, saved)

        return Code(body.ty, bind, size=init.size + body.size + 1)

    def _comprehension(self, node: Call) -> Code:
        assert node.target is not None
        kind = node.name
        var = self._variable(node.args[0])
        rng = self.compile(node.target)
        rt_ = rng.ty
        if rt_.name in ("list", "map"):
            elem = rt_.args[0]
        elif rt_ == DYN:
            elem = DYN
        else:
            raise self.error(
                node.pos, f"expression of type '{rt_}' cannot be range of a comprehension"
            )
        bodies = [self._scoped(var, elem, a) for a in node.args[1:]]
        predicates = bodies if kind != "map" else bodies[:-1]
        for code, arg in zip(predicates, node.args[1:], strict=False):
            if code.ty not in (BOOL, DYN):
                raise self.error(arg.pos, f"{kind}() predicate must be bool, not {code.ty}")
        cost = sum(b.size for b in bodies) + 1
        fr = rng.fn
        fns = [b.fn for b in bodies]
        size = rng.size + cost
        if kind in ("all", "exists"):
            return Code(BOOL, ev.quantifier(var, fr, fns[0], cost, kind == "exists"), size=size)
        if kind == "exists_one":
            return Code(BOOL, ev.exists_one(var, fr, fns[0], cost), size=size)
        if kind == "filter":
            return Code(list_of(elem), ev.filter(var, fr, fns[0], cost), size=size)
        result = list_of(bodies[-1].ty)
        return Code(result, ev.map_macro(var, fr, fns, cost), size=size)


def _string_equality(fa: Fn, s: str, negate: bool, size: int) -> Code:
    """The hot path of selectors: an attribute against a string literal."""

    def equal(c: ev.Ctx) -> bool:
        value = fa(c)
        return value == s if type(value) is str else rt.equals(value, s)

    def unequal(c: ev.Ctx) -> bool:
        value = fa(c)
        return value != s if type(value) is str else not rt.equals(value, s)

    return Code(BOOL, unequal if negate else equal, size=size)


def _device_field(field: str) -> Fn:
    if field == "driver":
        return lambda c: c.device.driver
    if field == "allowMultipleAllocations":
        return lambda c: c.device.allow_multiple_allocations
    return lambda c: c.device.cel_field(field)


_ANY = Ty("any")  # only for messages and the homogeneity check


def _literal_assignable(a: Ty, b: Ty) -> bool:
    if a == _ANY or b == _ANY:
        return a == b
    return assignable(a, b)


def _join_types(types: list[Ty]) -> Ty:
    """The element type of a literal list or map: the common type, or dyn when mixed."""
    if not types:
        return DYN
    first = types[0]
    return first if all(t == first for t in types) else DYN
