"""The allow-list a KernelBench `ModelNew` file must pass before any of it runs
(docs/architecture.md, "The ModelNew allow-list").

`screen(code)` parses the file with Python's own `ast` (nothing is executed) and gives every
name and expression one kind: a torch module, the extension loader, an extension built by
`load_inline`, `self`, a module the constructor made, a tensor, a number, a shape, a dtype, a
device, or something callable. A construct is admitted only when the allow-list names it;
everything else is a finding, with its line:

- imports: `torch`, `torch.nn`, `torch.nn.functional` (bound, never used), `math`,
  `torch.utils.cpp_extension` / `load_inline`, `__future__`;
- module level: constants and their arithmetic (`math` on constants), `load_inline(...)` with
  constant arguments, functions, and classes deriving from `nn.Module` alone; `ModelNew` is a
  class; no name is bound twice;
- classes: methods and a docstring only; no decorator, metaclass or dunder method but
  `__init__`; no method named like an `nn.Module` method (`cuda`, `to`, `load_state_dict`, ...)
  or with a leading underscore;
- `__init__` (construction: it sees no input): `super().__init__()`, `nn` classes as parameter
  holders (`nn.Parameter`, `nn.Conv2d`, an empty `nn.Module`, ...) and `nn.init.*`, modules of
  the file, `register_parameter`/`register_buffer`/`add_module` with constant names, tensor
  creation, and `self.<name> = ...` of these (never a callable, never an `nn.Module` name);
- every other function and method, used or not: calls into the file's own extensions, methods
  and modules, tensor creation (`torch.empty`, `zeros_like`, ... with `dtype`/`device` only),
  shape and view methods (`size`, `view`, `reshape`, `contiguous`, `permute`, ...), integer
  arithmetic on sizes, basic indexing by sizes and slices, the parameters the constructor made,
  `if`/`for` over sizes, `assert` and `raise`.

A name keeps one kind (a second binding of another kind is refused), callables and modules are
never stored, passed or returned, builtins and exceptions are never rebound, and defaults are
immutable. Refused, among others: any other torch function or tensor method, arithmetic,
comparisons or truth tests on tensors, indexing with tensors or lists, assignment into tensors,
calling a torch module, attribute chains into modules (`torch.ops`, `torch.sys`, ...), dunder
names, `getattr`/`exec`/`eval`/`globals` and every builtin outside a short list, lambdas,
comprehensions, nested functions, `try`/`with`/`global`/`while`, and state kept between calls
(`self.x = ...` outside `__init__`, mutable defaults). A file the screen cannot follow is one
finding.

Run as `python3 cudarl_screen.py < model_new.py`, it prints the findings as JSON.
"""

import ast
import json
import sys

# ---- kinds
# Values: what a local, an attribute of `self`, an argument or a return value may be.
TENSOR, TENSORS, NUM, SHAPE, DTYPE, DEVICE = "tensor", "tensors", "number", "shape", "dtype", "device"
VALUES = {TENSOR, TENSORS, NUM, SHAPE, DTYPE, DEVICE}
INT_LIKE = {NUM, SHAPE}
# Held by `self` (set in `__init__`): values, an extension, a torch module, a module of the file.
EXT, SUBMOD, OWN = "extension", "torch module", "own:"  # OWN + class name
HELD = VALUES | {EXT, SUBMOD}
# A module-level constant that is none of the values (a list of strings: `load_inline` arguments).
LITERAL = "literal"
# Never stored, passed or returned.
SELF = "self"
MOD_TORCH, MOD_NN, MOD_F, MOD_INIT, MOD_CPPEXT, MOD_MATH = (
    "module torch", "module torch.nn", "module torch.nn.functional", "module torch.nn.init",
    "module torch.utils.cpp_extension", "module math",
)  # fmt: skip
LOADER, EXTFN, INITFN, MATHFN, TYPE = "load_inline", "extension function", "nn.init", "math function", "type"
BUILTIN, TORCHFN, NNCLASS, TMETHOD, METHOD, FUNC, CLASS, REGISTRY = (
    "builtin:", "torch function:", "nn class:", "tensor method:", "method:", "function:", "class:", "registry:",
)  # fmt: skip

IMPORTS = {
    "torch": MOD_TORCH, "torch.nn": MOD_NN, "torch.nn.functional": MOD_F, "torch.nn.init": MOD_INIT,
    "torch.utils.cpp_extension": MOD_CPPEXT, "torch.utils.cpp_extension.load_inline": LOADER, "math": MOD_MATH,
}  # fmt: skip
DTYPES = {
    "float32", "float", "float16", "half", "bfloat16", "float64", "double", "int8", "uint8", "int16", "short",
    "int32", "int", "int64", "long", "bool", "float8_e4m3fn", "float8_e5m2",
}  # fmt: skip
MEMORY_FORMATS = {"contiguous_format", "channels_last", "channels_last_3d", "preserve_format"}
# Tensor creation: a fresh buffer, its contents independent of any input; `_like` ones take a
# tensor first. Keywords: CREATION_KEYWORDS only (no `out=`).
CREATION = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "randn", "rand", "randint", "tensor", "Tensor",
}  # fmt: skip
CREATION_KEYWORDS = {"dtype", "device", "requires_grad", "memory_format"}
# Shape and view methods of a tensor, with what they give (None: a shape without an argument,
# a number with one).
TENSOR_METHODS = {
    "size": None, "stride": None, "dim": NUM, "numel": NUM, "nelement": NUM, "storage_offset": NUM,
    "data_ptr": NUM, "element_size": NUM, "get_device": NUM, "is_contiguous": NUM,
    "contiguous": TENSOR, "view": TENSOR, "reshape": TENSOR, "view_as": TENSOR, "reshape_as": TENSOR,
    "flatten": TENSOR, "unflatten": TENSOR, "unsqueeze": TENSOR, "squeeze": TENSOR, "permute": TENSOR,
    "transpose": TENSOR, "t": TENSOR, "expand": TENSOR, "expand_as": TENSOR, "narrow": TENSOR,
    "select": TENSOR, "detach": TENSOR, "split": TENSORS, "chunk": TENSORS, "unbind": TENSORS,
    "new_empty": TENSOR, "new_zeros": TENSOR, "new_ones": TENSOR, "new_full": TENSOR,
}  # fmt: skip
TAKES_TENSOR = {"view_as", "reshape_as", "expand_as"}
METHOD_KEYWORDS = {"dim", "dtype", "device", "memory_format", "requires_grad"}
TENSOR_ATTRS = {"shape": SHAPE, "dtype": DTYPE, "device": DEVICE, "ndim": NUM, "is_cuda": NUM, "T": TENSOR}
# In-place initializers a constructor may apply to its parameters (it sees no input).
INIT_METHODS = {"uniform_", "normal_", "zero_", "fill_", "copy_"}
# `nn` classes a constructor may make: every capitalized `nn` name but the containers.
NN_CONTAINERS = {"Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict", "functional"}
# What may be read of a torch module the constructor made: its tensors, and its settings.
SUBMOD_TENSORS = {"weight", "bias", "running_mean", "running_var", "num_batches_tracked", "in_proj_weight"}
SUBMOD_SETTINGS = {
    "kernel_size", "stride", "padding", "dilation", "groups", "output_padding", "in_channels", "out_channels",
    "in_features", "out_features", "eps", "momentum", "normalized_shape", "num_groups", "num_channels",
    "num_features", "negative_slope", "affine", "elementwise_affine", "track_running_stats", "embedding_dim",
    "num_embeddings", "padding_idx", "alpha", "beta", "threshold", "min_val", "max_val", "lambd", "dim",
    "upscale_factor", "scale_factor", "p", "inplace", "approximate", "ceil_mode", "count_include_pad",
}  # fmt: skip
# Registration by name in a constructor, and lookup by name anywhere.
REGISTER = {"register_buffer", "register_parameter", "add_module"}
LOOKUP = {"get_parameter", "get_submodule", "get_buffer"}
# `nn.Module`'s own names: no method or attribute of the file may take one (the judge calls
# `cuda`, `load_state_dict`, `__call__` -> `forward`), besides `forward` itself.
NN_MODULE_NAMES = {
    "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "compile", "cpu", "cuda",
    "double", "dump_patches", "eval", "extra_repr", "float", "get_buffer", "get_extra_state", "get_parameter",
    "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia", "named_buffers", "named_children",
    "named_modules", "named_parameters", "parameters", "register_backward_hook", "register_buffer",
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter",
    "register_state_dict_post_hook", "register_state_dict_pre_hook", "requires_grad_", "set_extra_state",
    "set_submodule", "share_memory", "state_dict", "to", "to_empty", "train", "training", "type", "xpu",
    "zero_grad",
}  # fmt: skip
BUILTINS = {"isinstance", "int", "float", "bool", "len", "range", "min", "max", "tuple", "list", "abs"}
RAISABLE = {"ValueError", "RuntimeError", "TypeError", "AssertionError", "NotImplementedError"}
RESERVED = BUILTINS | RAISABLE | {"super", "self", "True", "False", "None", "print", "getattr", "object"}
ANNOTATIONS = {"int", "float", "bool", "str", "tuple", "list", "None"}
MATH_CONSTANTS = {"pi", "e", "tau", "inf"}


class Refused(Exception):
    """A construct outside the allow-list, at a node."""

    def __init__(self, node, message):
        super().__init__(message)
        self.line = getattr(node, "lineno", 0)


def is_const_literal(v):
    """An immutable literal: a constant, or a tuple of them (negative numbers included)."""
    if isinstance(v, ast.Constant):
        return True
    if isinstance(v, ast.UnaryOp) and isinstance(v.op, (ast.USub, ast.UAdd)):
        return isinstance(v.operand, ast.Constant)
    return isinstance(v, ast.Tuple) and all(is_const_literal(e) for e in v.elts)


class Screen:
    """A screen of one parsed file: module-level names, classes and their members, findings."""

    def __init__(self, tree):
        self.tree = tree
        self.globals = {}  # name -> kind
        self.classes = {}  # name -> {"methods": {name: FunctionDef}, "attrs": {path: kind}}
        self.findings = []

    def note(self, r, prefix=""):
        """Records a finding from a refusal."""
        self.findings.append({"line": r.line, "message": f"{prefix}{r}"})

    # ---- module level
    def run(self):
        """Screens the module, then every constructor (what `self` holds), then every other function
        and method; the findings by line."""
        bodies = []
        for node in self.tree.body:
            try:
                bodies.extend(self.module_stmt(node))
            except Refused as r:
                self.note(r)
        if "ModelNew" in self.globals and self.globals["ModelNew"] != CLASS + "ModelNew":
            self.findings.append({"line": 0, "message": "`ModelNew` must be a class"})
        # Every constructor first (what `self` holds), then every other function and method.
        for cls, f in bodies:
            if cls is not None and f.name == "__init__":
                self.function(f, cls)
        for cls, f in bodies:
            if cls is None or f.name != "__init__":
                self.function(f, cls)
        return sorted(self.findings, key=lambda f: f["line"])

    def bind_global(self, node, name, kind):
        """Binds a module-level name once; reserved and dunder names are refused."""
        if name.startswith("__") or name in RESERVED:
            raise Refused(node, f"`{name}` may not be bound")
        if name in self.globals:
            raise Refused(node, f"`{name}` is bound twice")
        self.globals[name] = kind

    def module_stmt(self, node):
        """Screens a module-level statement; returns the functions to screen later."""
        if isinstance(node, ast.Import):
            for a in node.names:
                self.bind_import(node, a.name, a.asname, from_=False)
        elif isinstance(node, ast.ImportFrom):
            if node.level or node.module is None:
                raise Refused(node, "relative imports are not allowed")
            for a in node.names:
                if a.name == "*":
                    raise Refused(node, "`import *` is not allowed")
                self.bind_import(node, f"{node.module}.{a.name}", a.asname or a.name, from_=True)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            pass  # a docstring
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if isinstance(node, ast.AnnAssign):
                self.annotation(node.annotation)
                if node.value is None:
                    raise Refused(node, "an annotation without a value is not allowed at module level")
            kind = self.module_value(node.value)
            for t in targets:
                if isinstance(t, ast.Tuple):
                    if not isinstance(node.value, ast.Tuple) or len(node.value.elts) != len(t.elts):
                        raise Refused(t, "module-level unpacking takes a tuple of as many constants")
                    pairs = [(n, self.const_kind(v)) for n, v in zip(t.elts, node.value.elts, strict=True)]
                else:
                    pairs = [(t, kind)]
                for n, k in pairs:
                    if not isinstance(n, ast.Name):
                        raise Refused(n, "module-level assignments bind plain names (no attributes or items)")
                    self.bind_global(n, n.id, k)
        elif isinstance(node, ast.FunctionDef):
            self.definition(node)
            if node.name == "ModelNew":
                raise Refused(node, "`ModelNew` must be a class")
            self.bind_global(node, node.name, FUNC + node.name)
            return [(None, node)]
        elif isinstance(node, ast.ClassDef):
            self.bind_global(node, node.name, CLASS + node.name)
            return [(node.name, m) for m in self.classdef(node)]
        else:
            raise Refused(node, f"`{type(node).__name__}` statements are not allowed at module level")
        return []

    def bind_import(self, node, full, asname, from_):
        """Binds `import full [as asname]` or `from a import b [as asname]` (`from_`)."""
        if full.startswith("__future__."):
            return
        if from_ and full.startswith("math."):
            kind = NUM if full[len("math.") :] in MATH_CONSTANTS else MATHFN
        elif full not in IMPORTS:
            raise Refused(node, f"importing `{full}` is not allowed (only torch, torch.nn, math, load_inline)")
        else:
            kind = IMPORTS[full] if asname else IMPORTS[full.split(".")[0]]
        name = asname or full.split(".")[0]
        if name in self.globals and self.globals[name] == kind:
            return  # `import torch` and `import torch.nn` bind `torch` alike
        self.bind_global(node, name, kind)

    def module_value(self, v):
        """The kind of a module-level value: a constant's ([`const_kind`]), or an extension
        for one `load_inline(...)` with constant arguments."""
        if isinstance(v, ast.Call) and self.loader(v.func):
            for a in [*v.args, *(k.value for k in v.keywords)]:
                if self.const_kind(a) is None:
                    raise Refused(a, "load_inline's arguments must be constants")
            if any(k.arg is None for k in v.keywords):
                raise Refused(v, "`**kwargs` in calls is not allowed")
            return EXT
        kind = self.const_kind(v)
        if kind is None:
            raise Refused(v, "module-level values are constants, their arithmetic or `load_inline(...)`")
        return kind

    def module_path(self, e):
        """The dotted path an attribute chain names from an imported module (`nn.Module` is
        `torch.nn.Module`), or None when it starts elsewhere."""
        parts = []
        while isinstance(e, ast.Attribute):
            parts.append(e.attr)
            e = e.value
        roots = {
            MOD_TORCH: "torch",
            MOD_NN: "torch.nn",
            MOD_CPPEXT: "torch.utils.cpp_extension",
            LOADER: "torch.utils.cpp_extension.load_inline",
        }
        root = roots.get(self.globals.get(e.id)) if isinstance(e, ast.Name) else None
        return ".".join([root, *reversed(parts)]) if root else None

    def loader(self, f):
        """Whether `f` names `load_inline` (imported, or through `torch.utils.cpp_extension`)."""
        return self.module_path(f) == "torch.utils.cpp_extension.load_inline"

    def const_kind(self, v):
        """The kind of a constant expression, or None when `v` is not one: a number (numbers,
        booleans, `None`, their arithmetic, `math` constants and functions of them), a device (a
        string, an f-string of constants), a shape (a tuple or list of numbers), else a literal
        (a list of strings). Nothing but `math` functions is called."""
        if isinstance(v, ast.Constant):
            if isinstance(v.value, str):
                return DEVICE
            return NUM if isinstance(v.value, (bool, int, float)) or v.value is None else LITERAL
        if isinstance(v, ast.Name):
            k = self.globals.get(v.id)
            return k if k in (NUM, DEVICE, SHAPE, LITERAL) else None
        if isinstance(v, (ast.Tuple, ast.List)):
            kinds = [self.const_kind(e) for e in v.elts]
            if None in kinds:
                return None
            return SHAPE if all(k == NUM for k in kinds) else LITERAL
        if isinstance(v, (ast.BinOp, ast.UnaryOp)):
            kinds = [self.const_kind(x) for x in ((v.left, v.right) if isinstance(v, ast.BinOp) else (v.operand,))]
            if None in kinds:
                return None
            return kinds[0] if all(k == kinds[0] for k in kinds) else LITERAL
        if isinstance(v, ast.JoinedStr):
            ok = all(
                isinstance(p, ast.Constant)
                or isinstance(p, ast.FormattedValue)
                and self.const_kind(p.value) is not None
                and (p.format_spec is None or self.const_kind(p.format_spec) is not None)
                for p in v.values
            )
            return DEVICE if ok else None
        if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name):
            is_const = self.globals.get(v.value.id) == MOD_MATH and v.attr in MATH_CONSTANTS
            return NUM if is_const else None
        if isinstance(v, ast.Call) and not v.keywords:
            f = v.func
            is_math = (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name)
                and self.globals.get(f.value.id) == MOD_MATH
                and not f.attr.startswith("_")
                or isinstance(f, ast.Name)
                and self.globals.get(f.id) == MATHFN
            )
            ok = is_math and all(self.const_kind(a) == NUM for a in v.args)
            return NUM if ok else None
        return None

    def definition(self, f):
        """What runs when a function is defined: decorators, defaults, annotations."""
        if f.decorator_list:
            raise Refused(f, "decorators are not allowed")
        a = f.args
        if a.kwarg is not None:
            raise Refused(f, "`**kwargs` parameters are not allowed")
        for d in [*a.defaults, *(d for d in a.kw_defaults if d is not None)]:
            if not is_const_literal(d):
                raise Refused(d, "default arguments are immutable constants")
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg]:
            if arg is None:
                continue
            if arg.arg in RESERVED and arg.arg != "self" or arg.arg.startswith("__") or arg.arg in self.globals:
                raise Refused(arg, f"the parameter `{arg.arg}` shadows a name")
            self.annotation(arg.annotation)
        self.annotation(f.returns)

    def annotation(self, a):
        """Refuses annotations (evaluated when a function is defined) other than tensors, numbers, tuples and lists."""
        if a is None:
            return
        if isinstance(a, ast.Constant) and (a.value is None or a.value is Ellipsis or isinstance(a.value, str)):
            return
        if isinstance(a, ast.Name) and a.id in ANNOTATIONS:
            return
        if (
            isinstance(a, ast.Attribute)
            and a.attr in ("Tensor", "Size", "dtype", "device")
            and isinstance(a.value, ast.Name)
            and self.globals.get(a.value.id) == MOD_TORCH
        ):
            return
        if isinstance(a, ast.Subscript):
            self.annotation(a.value)
            for e in a.slice.elts if isinstance(a.slice, ast.Tuple) else [a.slice]:
                self.annotation(e)
            return
        if isinstance(a, ast.BinOp) and isinstance(a.op, ast.BitOr):
            self.annotation(a.left)
            self.annotation(a.right)
            return
        raise Refused(a, "annotations name tensors, numbers, tuples or lists")

    def classdef(self, node):
        """Screens a class's definition; returns its methods."""
        if node.decorator_list:
            raise Refused(node, "decorators are not allowed")
        if node.keywords or len(node.bases) != 1 or not self.is_nn_module(node.bases[0]):
            raise Refused(node, f"class `{node.name}` must derive from nn.Module alone (no metaclass)")
        methods = {}
        for s in node.body:
            if isinstance(s, ast.FunctionDef):
                if s.name != "__init__" and (s.name.startswith("_") or s.name in NN_MODULE_NAMES):
                    raise Refused(s, f"method `{s.name}`: underscore and nn.Module names are not allowed")
                if s.name in TENSOR_METHODS or s.name in TENSOR_ATTRS or s.name in methods:
                    raise Refused(s, f"method `{s.name}`: the name is taken")
                self.definition(s)
                a = s.args
                if not (a.posonlyargs or a.args):
                    raise Refused(s, f"method `{s.name}` takes no `self`")
                methods[s.name] = s
            elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) or isinstance(s, ast.Pass):
                pass
            else:
                raise Refused(s, f"class `{node.name}`: only methods and a docstring are allowed in its body")
        self.classes[node.name] = {"methods": methods, "attrs": {}}
        return list(methods.values())

    def is_nn_module(self, b):
        """Whether `b` is `nn.Module` (or `torch.nn.Module`)."""
        return self.module_path(b) == "torch.nn.Module"

    # ---- functions
    def function(self, f, cls):
        """Screens a function's body: its first positional parameter is `self` for a method, the
        others numbers in a constructor and tensors elsewhere."""
        init = cls is not None and f.name == "__init__"
        a = f.args
        positional = [*a.posonlyargs, *a.args]
        scope = {}
        for i, p in enumerate([*positional, *a.kwonlyargs]):
            if cls is not None and i == 0:
                scope[p.arg] = SELF
            else:
                # A constructor's arguments are the problem's sizes; any other argument may be a
                # tensor, whatever its annotation says (nothing checks annotations).
                scope[p.arg] = NUM if init else TENSOR
        if a.vararg is not None:
            scope[a.vararg.arg] = SHAPE if init else TENSORS
        ctx = {"init": init, "cls": cls, "scope": scope, "self": positional[0].arg if cls else None}
        for s in f.body:
            try:
                self.stmt(s, ctx)
            except Refused as r:
                self.note(r, f"{f.name}: ")

    def attrs(self, ctx):
        """What `self` holds in the class being screened, by dotted path."""
        return self.classes[ctx["cls"]]["attrs"]

    def stmt(self, s, ctx):
        """Screens one statement of a function."""
        if isinstance(s, ast.Expr):
            if isinstance(s.value, ast.Constant):
                return
            if ctx["init"] and self.is_super_init(s.value, ctx):
                return
            if not isinstance(s.value, ast.Call):
                raise Refused(s, "an expression statement is a call")
            self.expr(s.value, ctx)
        elif isinstance(s, ast.Assign):
            kind = self.expr(s.value, ctx)
            for t in s.targets:
                self.assign(t, kind, ctx)
        elif isinstance(s, ast.AnnAssign):
            self.annotation(s.annotation)
            if s.value is None:
                raise Refused(s, "an annotation without a value is not allowed")
            self.assign(s.target, self.expr(s.value, ctx), ctx)
        elif isinstance(s, ast.AugAssign):
            kinds = [self.expr(s.target, ctx), self.expr(s.value, ctx)] if isinstance(s.target, ast.Name) else []
            if kinds != [NUM, NUM]:
                raise Refused(s, "augmented assignment is of numbers to names (on lists and tensors it mutates)")
        elif isinstance(s, ast.Return):
            if s.value is not None:
                self.value(s.value, ctx, "return values")
        elif isinstance(s, ast.If):
            self.condition(s.test, ctx)
            for b in [*s.body, *s.orelse]:
                self.stmt(b, ctx)
        elif isinstance(s, ast.For):
            if s.orelse:
                raise Refused(s, "`for ... else` is not allowed")
            it = self.expr(s.iter, ctx)
            if it not in (SHAPE, TENSORS):
                raise Refused(s.iter, "loops run over `range(...)`, a shape or a tuple of tensors")
            self.assign(s.target, NUM if it == SHAPE else TENSOR, ctx)
            for b in s.body:
                self.stmt(b, ctx)
        elif isinstance(s, ast.Assert):
            self.condition(s.test, ctx)
            if s.msg is not None:
                self.message(s.msg, ctx)
        elif isinstance(s, ast.Raise):
            e = s.exc
            if s.cause is not None or not (
                isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in RAISABLE and not e.keywords
            ):
                raise Refused(s, f"`raise` takes one of {', '.join(sorted(RAISABLE))}")
            for a in e.args:
                self.message(a, ctx)
        elif isinstance(s, ast.Pass):
            pass
        else:
            raise Refused(s, f"`{type(s).__name__}` statements are not allowed in a function")

    def message(self, m, ctx):
        """Refuses a message (of `assert` or `raise`) other than a string or an f-string of sizes,
        dtypes and devices."""
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            return
        if isinstance(m, ast.JoinedStr):
            for p in m.values:
                if isinstance(p, ast.FormattedValue):
                    if p.format_spec is not None or self.expr(p.value, ctx) not in (*INT_LIKE, DTYPE, DEVICE):
                        raise Refused(p, "messages format sizes, dtypes and devices")
            return
        raise Refused(m, "messages are strings")

    def condition(self, t, ctx):
        """Refuses a condition that is not on sizes (a tensor's truth value runs a torch op)."""
        k = self.expr(t, ctx)
        if k not in INT_LIKE:
            raise Refused(t, f"a condition is on sizes (the truth value of a {k} is not allowed)")

    def is_super_init(self, v, ctx):
        """`super().__init__()`, `super(Cls, self).__init__()` or `nn.Module.__init__(self)`."""
        if not (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "__init__"):
            return False
        if v.keywords:
            return False
        base = v.func.value
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            args = base.args
            return (
                not v.args
                and not base.keywords
                and (
                    not args
                    or len(args) == 2
                    and isinstance(args[0], ast.Name)
                    and args[0].id == ctx["cls"]
                    and self.is_self(args[1], ctx)
                )
            )
        return self.is_nn_module(base) and len(v.args) == 1 and self.is_self(v.args[0], ctx)

    def is_self(self, n, ctx):
        """Whether `n` is the method's `self`."""
        return isinstance(n, ast.Name) and n.id == ctx["self"]

    def self_path(self, e, ctx):
        """`a.b` for the expression `self.a.b`, else None."""
        parts = []
        while isinstance(e, ast.Attribute):
            parts.append(e.attr)
            e = e.value
        return ".".join(reversed(parts)) if parts and self.is_self(e, ctx) else None

    def assign(self, t, kind, ctx):
        """Binds an assignment target to `kind`: a name keeps one value kind; attributes of `self`
        only in `__init__`."""
        if isinstance(t, ast.Name):
            if t.id in RESERVED or t.id.startswith("__") or t.id in self.globals:
                raise Refused(t, f"`{t.id}` may not be rebound")
            if kind not in VALUES:
                raise Refused(t, f"a {kind} is not stored in a name")
            old = ctx["scope"].get(t.id)
            if old is not None and old != kind:
                raise Refused(t, f"`{t.id}` is a {old}; it may not become a {kind}")
            ctx["scope"][t.id] = kind
        elif isinstance(t, (ast.Tuple, ast.List)):
            each = TENSOR if kind in (TENSOR, TENSORS) else NUM if kind == SHAPE else None
            if each is None:
                raise Refused(t, "unpacking takes a shape or a tuple of tensors")
            for e in t.elts:
                if isinstance(e, ast.Starred):
                    self.assign(e.value, TENSORS if each == TENSOR else SHAPE, ctx)
                else:
                    self.assign(e, each, ctx)
        elif isinstance(t, ast.Attribute) and self.self_path(t, ctx):
            if not ctx["init"]:
                raise Refused(t, "attributes of `self` are set in `__init__` only (no state kept between calls)")
            path = self.self_path(t, ctx)
            self.set_attr(t, path, kind, ctx)
        else:
            raise Refused(t, "assignment to items or other objects' attributes is not allowed")

    def set_attr(self, node, path, kind, ctx):
        """Records `self.<path> = <kind>` (in `__init__`)."""
        methods = self.classes[ctx["cls"]]["methods"]
        for part in path.split("."):
            if part.startswith("_") or part in NN_MODULE_NAMES or part in ("forward", "T"):
                raise Refused(node, f"`{part}` may not be set on a module")
        if path.split(".")[0] in methods:
            raise Refused(node, f"`{path}` is a method")
        if kind not in HELD and not kind.startswith(OWN):
            raise Refused(node, f"a {kind} is not held by a module")
        if "." in path:
            owner = path.rsplit(".", 1)[0]
            if self.attrs(ctx).get(owner) != SUBMOD or kind != TENSOR:
                raise Refused(node, "attributes of held modules are tensors set on a torch module")
        attrs = self.attrs(ctx)
        if attrs.get(path, kind) != kind:
            raise Refused(node, f"`self.{path}` is a {attrs[path]}; it may not become a {kind}")
        attrs[path] = kind

    # ---- expressions: the kind of what they give
    def value(self, e, ctx, what):
        """The kind of `e`, which must be a value (no module, callable or `self`)."""
        k = self.expr(e, ctx)
        if k not in VALUES:
            raise Refused(e, f"{what} are tensors, sizes, dtypes or devices (not a {k})")
        return k

    def expr(self, e, ctx):
        """The kind of what `e` gives; a construct outside the allow-list is refused."""
        if isinstance(e, ast.Constant):
            if isinstance(e.value, (bool, int, float)) or e.value is None:
                return NUM
            if isinstance(e.value, str):
                return DEVICE  # a string names a device (`device="cuda"`); messages are apart
            raise Refused(e, "constants in functions are numbers and strings")
        if isinstance(e, ast.Name):
            return self.name(e, ctx)
        if isinstance(e, ast.Attribute):
            return self.attribute(e, ctx)
        if isinstance(e, ast.Call):
            return self.call(e, ctx)
        if isinstance(e, (ast.Tuple, ast.List)):
            kinds = [self.value(x.value if isinstance(x, ast.Starred) else x, ctx, "tuple elements") for x in e.elts]
            if all(k in INT_LIKE for k in kinds):
                return SHAPE
            if all(k in (TENSOR, TENSORS, NUM) for k in kinds):
                return TENSORS
            raise Refused(e, "tuples hold sizes or tensors")
        if isinstance(e, ast.BinOp):
            return self.arith(e, [self.expr(e.left, ctx), self.expr(e.right, ctx)], ctx)
        if isinstance(e, ast.UnaryOp):
            return self.arith(e, [self.expr(e.operand, ctx)], ctx)
        if isinstance(e, ast.BoolOp):
            return self.arith(e, [self.expr(v, ctx) for v in e.values], ctx)
        if isinstance(e, ast.Compare):
            return self.compare(e, ctx)
        if isinstance(e, ast.IfExp):
            self.condition(e.test, ctx)
            a, b = self.value(e.body, ctx, "branches"), self.value(e.orelse, ctx, "branches")
            if a == b:
                return a
            raise Refused(e, f"the branches give a {a} and a {b}")
        if isinstance(e, ast.Subscript):
            return self.subscript(e, ctx)
        raise Refused(e, f"`{type(e).__name__}` expressions are not allowed")

    def compare(self, e, ctx):
        """A comparison (each operand screened once): sizes, dtypes and devices, or `is None`."""
        nodes = [e.left, *e.comparators]
        kinds = [self.expr(n, ctx) for n in nodes]
        for i, op in enumerate(e.ops):
            pair = kinds[i : i + 2]
            identity = isinstance(op, (ast.Is, ast.IsNot)) and any(
                isinstance(x, ast.Constant) and x.value is None for x in nodes[i : i + 2]
            )
            if identity and all(k in VALUES for k in pair):
                continue
            if any(k not in (*INT_LIKE, DTYPE, DEVICE) for k in pair):
                raise Refused(e, "comparisons are on sizes, dtypes and devices (on tensors they run torch ops)")
        return NUM

    def arith(self, e, kinds, ctx):
        """Arithmetic: on numbers; on shapes only `+` of two and `*` by a number (a shape); in a
        constructor on its tensors too (it sees no input). `and`/`or` take numbers only."""
        if ctx["init"] and all(k in (NUM, TENSOR) for k in kinds) and not isinstance(e, ast.BoolOp):
            return TENSOR if TENSOR in kinds else NUM  # a constructor's parameters, no input
        if all(k == NUM for k in kinds):
            return NUM
        if isinstance(e, ast.BinOp) and all(k in INT_LIKE for k in kinds):
            if isinstance(e.op, ast.Add) and kinds == [SHAPE, SHAPE]:
                return SHAPE
            if isinstance(e.op, ast.Mult) and sorted(kinds) == sorted([SHAPE, NUM]):
                return SHAPE
        raise Refused(e, "arithmetic is on numbers (on tensors it runs torch ops; shapes only join and repeat)")

    def name(self, e, ctx):
        """The kind a name has here: a local, a module-level name, a builtin of the short list."""
        n = e.id
        if n in ctx["scope"]:
            return ctx["scope"][n]
        if n in self.globals:
            return self.globals[n]
        if n in BUILTINS:
            return BUILTIN + n
        if n in ("True", "False", "None"):
            return NUM
        raise Refused(e, f"the name `{n}` is not allowed here")

    def attribute(self, e, ctx):
        """The kind of `<base>.<a>`, by the kind of the base."""
        a = e.attr
        if a.startswith("_"):
            raise Refused(e, f"`.{a}`: underscore names are not allowed")
        base = self.expr(e.value, ctx)
        if base == MOD_TORCH:
            if a in DTYPES or a in MEMORY_FORMATS:
                return DTYPE  # a dtype or a memory format: a setting, never a value
            if a in CREATION:
                return TORCHFN + a
            if a == "nn":
                return MOD_NN
            raise Refused(e, f"`torch.{a}` is not allowed (torch functions other than tensor creation)")
        if base == MOD_NN:
            if a == "init":
                return MOD_INIT
            if a[:1].isupper() and a not in NN_CONTAINERS:
                return NNCLASS + a
            raise Refused(e, f"`nn.{a}` is not allowed (parameter holders only)")
        if base == MOD_INIT:
            return INITFN
        if base == MOD_MATH:
            return NUM if a in MATH_CONSTANTS else MATHFN
        if base == SELF:
            return self.member(e, ctx["cls"], a, ctx, own=True)
        if base.startswith(OWN):
            return self.member(e, base[len(OWN) :], a, ctx, own=False)
        if base == SUBMOD:
            path = self.self_path(e, ctx)
            if path is None:
                if ctx["init"] and a in REGISTER:
                    return REGISTRY + a
                raise Refused(e, f"`.{a}` of a torch module is read through `self`'s attributes only")
            if path in self.attrs(ctx):
                return self.attrs(ctx)[path]
            if a in SUBMOD_TENSORS:
                return TENSOR
            if a in SUBMOD_SETTINGS:
                return SHAPE  # a number or a tuple of them
            if ctx["init"] and a in REGISTER:
                return REGISTRY + a
            raise Refused(e, f"`.{a}` of a torch module is not readable (its tensors and settings are)")
        if base == TENSOR:
            if a in TENSOR_ATTRS:
                return TENSOR_ATTRS[a]
            if a in TENSOR_METHODS or ctx["init"] and a in INIT_METHODS:
                return TMETHOD + a
            if ctx["init"] and a == "data":
                return TENSOR
            raise Refused(e, f"`.{a}` is not a shape or view method (tensor methods that compute stand in)")
        if base == EXT:
            return EXTFN
        raise Refused(e, f"`.{a}` of a {base} is not allowed")

    def member(self, e, cls, a, ctx, own):
        """`self.a` (own: in the class being screened) or `<module of class cls>.a`."""
        c = self.classes.get(cls)
        if c is None:
            raise Refused(e, f"`{cls}` is not a class of the file")
        if a in c["attrs"]:
            return c["attrs"][a]
        if a in c["methods"] and a != "__init__":
            return METHOD + f"{cls}.{a}"
        if own and (ctx["init"] and a in REGISTER or a in LOOKUP):
            return REGISTRY + a
        raise Refused(e, f"`.{a}` is not set in `{cls}.__init__`")

    def args(self, e, ctx, allowed, keywords=(), what="arguments"):
        """The kinds of a call's arguments, each in `allowed`; keywords only from `keywords`."""
        out = []
        for a in e.args:
            k = self.expr(a.value if isinstance(a, ast.Starred) else a, ctx)
            if k not in allowed:
                raise Refused(a, f"{what} may not be a {k}")
            out.append(k)
        for kw in e.keywords:
            if kw.arg is None or kw.arg not in keywords:
                raise Refused(e, f"the keyword `{kw.arg}` is not allowed here")
            k = self.expr(kw.value, ctx)
            if k not in allowed:
                raise Refused(kw.value, f"{what} may not be a {k}")
        return out

    def call(self, e, ctx):
        """The kind a call gives, by what is called; every argument is screened."""
        if isinstance(e.func, ast.Name) and e.func.id == "super":
            raise Refused(e, "`super()` is allowed only as `super().__init__()` in `__init__`")
        f = self.expr(e.func, ctx)
        values = VALUES
        if f == EXTFN:
            self.args(e, ctx, values, what="extension arguments")
            return TENSOR
        if f.startswith(TORCHFN):
            return self.creation(e, f[len(TORCHFN) :], ctx)
        if f.startswith(TMETHOD):
            return self.tensor_method(e, f[len(TMETHOD) :], ctx)
        if f.startswith(BUILTIN):
            return self.builtin(e, f[len(BUILTIN) :], ctx)
        if f == MATHFN:
            self.args(e, ctx, INT_LIKE)
            return NUM
        if f.startswith(NNCLASS) or f == INITFN:
            if not ctx["init"]:
                raise Refused(e, "parameter holders are made in `__init__` only")
            holder = f in (INITFN, NNCLASS + "Parameter", NNCLASS + "Buffer")
            # A module is built from sizes (a tensor among its settings would be read as one).
            allowed = values if holder else INT_LIKE | {DTYPE, DEVICE}
            self.args(e, ctx, allowed, keywords=self.any_keyword(e))
            return TENSOR if holder else SUBMOD
        if f.startswith(CLASS):
            if not ctx["init"]:
                raise Refused(e, "modules are made in `__init__` only")
            # Sizes only: a tensor handed to a constructor would be a number there.
            self.args(e, ctx, INT_LIKE | {DTYPE, DEVICE, EXT}, keywords=self.any_keyword(e))
            return OWN + f[len(CLASS) :]
        if f.startswith(OWN):
            if "forward" not in self.classes[f[len(OWN) :]]["methods"]:
                raise Refused(e, "the module has no `forward`")
            self.args(e, ctx, values, keywords=self.any_keyword(e))
            return TENSOR  # its methods are screened with its class
        if f.startswith((METHOD, FUNC)):
            self.args(e, ctx, values, keywords=self.any_keyword(e))
            return TENSOR
        if f.startswith(REGISTRY):
            return self.registry(e, f[len(REGISTRY) :], ctx)
        raise Refused(e, f"calling a {f} is not allowed")

    def any_keyword(self, e):
        """The keyword names a call passes (a module's constructor takes any)."""
        return {k.arg for k in e.keywords if k.arg is not None}

    def creation(self, e, name, ctx):
        """`torch.<name>(...)`: sizes (a tensor first for `_like`), `dtype`/`device` keywords."""
        if name.endswith("_like"):
            if not e.args or self.expr(e.args[0], ctx) != TENSOR:
                raise Refused(e, f"`torch.{name}` takes a tensor first")
            rest = ast.Call(func=e.func, args=e.args[1:], keywords=e.keywords)
            ast.copy_location(rest, e)
            self.args(rest, ctx, INT_LIKE | {DTYPE, DEVICE}, CREATION_KEYWORDS, "sizes")
        else:
            self.args(e, ctx, INT_LIKE | {DTYPE, DEVICE}, CREATION_KEYWORDS, "sizes")
        return TENSOR

    def tensor_method(self, e, name, ctx):
        """A shape or view method of a tensor: sizes, dtypes and devices as arguments (a tensor for
        `view_as` and its kin)."""
        allowed = INT_LIKE | {DTYPE, DEVICE}
        if name in TAKES_TENSOR or name == "copy_":
            allowed = allowed | {TENSOR}
        self.args(e, ctx, allowed, METHOD_KEYWORDS, f"arguments of `.{name}`")
        if name in ("size", "stride"):
            return NUM if e.args else SHAPE
        return TENSOR_METHODS.get(name, TENSOR)

    def builtin(self, e, name, ctx):
        """A builtin of the short list, on sizes (`len` also of tensors; `isinstance` against number
        and tensor types)."""
        if e.keywords:
            raise Refused(e, f"`{name}()` takes no keywords here")
        if name == "isinstance":
            if len(e.args) != 2:
                raise Refused(e, "isinstance takes a value and a type")
            self.value(e.args[0], ctx, "isinstance's first argument")
            t = e.args[1]
            types = t.elts if isinstance(t, ast.Tuple) else [t]
            for x in types:
                ok = (
                    isinstance(x, ast.Name)
                    and x.id in ("int", "float", "bool", "tuple", "list")
                    or (
                        isinstance(x, ast.Attribute)
                        and x.attr == "Tensor"
                        and isinstance(x.value, ast.Name)
                        and self.globals.get(x.value.id) == MOD_TORCH
                    )
                )
                if not ok:
                    raise Refused(x, "isinstance checks for numbers, tuples, lists or torch.Tensor")
            return NUM
        if name == "len":
            self.args(e, ctx, {SHAPE, TENSOR, TENSORS})
            return NUM
        self.args(e, ctx, INT_LIKE, what=f"arguments of `{name}()`")
        return SHAPE if name in ("range", "tuple", "list") else NUM

    def registry(self, e, op, ctx):
        """`register_buffer`/`register_parameter`/`add_module` on `self` or a torch module it
        holds, in `__init__`, and `get_parameter`/`get_submodule`/`get_buffer` on `self`:
        constant names, recorded under their dotted path like attributes."""
        name = e.args[0] if e.args else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            raise Refused(e, f"`{op}` takes a constant name")
        if op in LOOKUP:
            if len(e.args) != 1 or e.keywords or name.value not in self.attrs(ctx):
                raise Refused(e, f"`{op}({name.value!r})`: not registered in `__init__`")
            return self.attrs(ctx)[name.value]
        if len(e.args) != 2 or any(
            k.arg != "persistent" or not (isinstance(k.value, ast.Constant) and isinstance(k.value.value, bool))
            for k in e.keywords
        ):
            raise Refused(e, f"`{op}` takes a name, a value and at most `persistent=True/False`")
        holder = e.func.value
        owner = self.self_path(holder, ctx)
        if (
            owner is None
            and isinstance(holder, ast.Call)
            and isinstance(holder.func, ast.Attribute)
            and holder.func.attr == "get_submodule"
            and self.is_self(holder.func.value, ctx)
        ):
            owner = holder.args[0].value  # checked when `holder` was screened
        is_none = isinstance(e.args[1], ast.Constant) and e.args[1].value is None
        kind = SUBMOD if op == "add_module" else TENSOR
        given = self.expr(e.args[1], ctx)
        if given != kind and not (is_none and op == "register_buffer"):
            raise Refused(e, f"`{op}` takes a {kind}")
        if owner is not None and self.attrs(ctx).get(owner) != SUBMOD:
            raise Refused(e, f"`{op}` on `{owner}`, which is not a torch module `self` holds")
        path = f"{owner}.{name.value}" if owner else name.value
        for part in path.split("."):
            if part.startswith("_") or part in NN_MODULE_NAMES or part == "forward":
                raise Refused(e, f"`{part}` may not be set on a module")
        self.attrs(ctx)[path] = kind
        return NUM

    def subscript(self, e, ctx):
        """Indexing: shapes and tuples of tensors by numbers, tensors by numbers, slices, `None` and
        `...` (basic indexing, a view)."""
        base = self.expr(e.value, ctx)
        idx = e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]
        for i in idx:
            if isinstance(i, ast.Slice):
                for p in (i.lower, i.upper, i.step):
                    if p is not None and self.expr(p, ctx) != NUM:
                        raise Refused(p, "slice bounds are numbers")
            elif isinstance(i, ast.Constant) and (i.value is None or i.value is Ellipsis):
                if base != TENSOR:
                    raise Refused(i, "`None` and `...` index tensors only")
            elif self.expr(i, ctx) != NUM:
                raise Refused(i, "indices are numbers and slices (tensors and lists run gather kernels)")
        if base == SHAPE:
            return SHAPE if any(isinstance(i, ast.Slice) for i in idx) else NUM
        if base == TENSORS and len(idx) == 1 and not isinstance(idx[0], ast.Slice):
            return TENSOR
        if base == TENSOR:
            return TENSOR
        raise Refused(e, f"indexing a {base} is not allowed")


def screen(code):
    """Findings of the allow-list on a `ModelNew` file: `[{"line": int, "message": str}]`, empty
    when every construct is admitted. A file that does not parse, or that the screen cannot
    follow, is one finding."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return [{"line": getattr(e, "lineno", 0) or 0, "message": f"the file does not parse: {type(e).__name__}"}]
    try:
        return Screen(tree).run()
    except RecursionError:
        return [{"line": 0, "message": "the file nests too deeply to screen"}]
    except Exception as e:  # a construct the screen does not follow is refused, not a crash
        return [{"line": 0, "message": f"the screen could not follow the file: {type(e).__name__}: {e}"}]


if __name__ == "__main__":
    print(json.dumps(screen(sys.stdin.read())))
