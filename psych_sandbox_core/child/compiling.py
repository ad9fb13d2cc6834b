"""The program compiled: its body wrapped in one function (async when it awaits, its last
expression returned, its top-level names kept global), every line number a line of the
model's text."""

import sys

PROGRAM_FILENAME = "<program>"


MAIN_NAME = "__psych_main__"


def _iter_children(node):
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            yield value
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, ast.AST):
                    yield item


def _walk(node):
    pending = [node]
    while pending:
        current = pending.pop()
        pending.extend(_iter_children(current))
        yield current


def _copy_location(new, old):
    for attribute in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
        if hasattr(old, attribute):
            setattr(new, attribute, getattr(old, attribute))
    return new


def _fix_missing_locations(node):
    # Give every synthetic node its parent's position, as ast.fix_missing_locations does.
    def fix(current, lineno, col, end_lineno, end_col):
        if "lineno" in current._attributes:
            if getattr(current, "lineno", None) is None:
                current.lineno = lineno
            else:
                lineno = current.lineno
            if getattr(current, "end_lineno", None) is None:
                current.end_lineno = end_lineno
            else:
                end_lineno = current.end_lineno
            if getattr(current, "col_offset", None) is None:
                current.col_offset = col
            else:
                col = current.col_offset
            if getattr(current, "end_col_offset", None) is None:
                current.end_col_offset = end_col
            else:
                end_col = current.end_col_offset
        for child in _iter_children(current):
            fix(child, lineno, col, end_lineno, end_col)

    fix(node, 1, 0, 1, 0)
    return node


class _NodeVisitor:
    def visit(self, node):
        return getattr(self, "visit_" + type(node).__name__, self.generic_visit)(node)

    def generic_visit(self, node):
        for child in _iter_children(node):
            self.visit(child)


class _ScopeWalker(_NodeVisitor):
    """Collects names the top-level scope binds, and whether it awaits, without descending
    into nested scopes."""

    def __init__(self):
        self.names = set()
        self.awaits = False
        self.yields = False

    def visit_FunctionDef(self, node):
        self.names.add(node.name)
        for item in node.decorator_list:
            self.visit(item)
        self._visit_arguments_defaults(node.args)
        if node.returns is not None:
            self.visit(node.returns)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _visit_arguments_defaults(self, args):
        for default in list(args.defaults) + [d for d in args.kw_defaults if d is not None]:
            self.visit(default)

    def visit_ClassDef(self, node):
        self.names.add(node.name)
        for item in list(node.decorator_list) + list(node.bases) + list(node.keywords):
            self.visit(item)

    def visit_Lambda(self, node):
        self._visit_arguments_defaults(node.args)

    def _visit_comprehension(self, node):
        # The first iterable is evaluated in the enclosing scope; an await there counts.
        self.visit(node.generators[0].iter)
        for child in _walk(node):
            if isinstance(child, ast.NamedExpr) and isinstance(child.target, ast.Name):
                self.names.add(child.target.id)
            if isinstance(child, (ast.Await,)) or (
                isinstance(child, ast.comprehension) and child.is_async
            ):
                self.awaits = True

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension

    def visit_Name(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.names.add(node.id)

    def visit_Import(self, node):
        for alias in node.names:
            self.names.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node):
        for alias in node.names:
            if alias.name != "*":
                self.names.add(alias.asname or alias.name)

    def visit_ExceptHandler(self, node):
        if node.name:
            self.names.add(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node):
        if node.name:
            self.names.add(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node):
        if node.name:
            self.names.add(node.name)

    def visit_MatchMapping(self, node):
        if node.rest:
            self.names.add(node.rest)
        self.generic_visit(node)

    def visit_Global(self, node):
        self.names.update(node.names)

    def visit_Await(self, node):
        self.awaits = True
        self.generic_visit(node)

    def visit_AsyncFor(self, node):
        self.awaits = True
        self.generic_visit(node)

    visit_AsyncWith = visit_AsyncFor

    def visit_Yield(self, node):
        self.yields = True

    visit_YieldFrom = visit_Yield


if "_ast" in sys.modules:  # the compiler's tree types, already imported by the start-up
    import _ast as ast
else:
    ast = None  # type: ignore[assignment]  # imported by _load_ast


def _load_ast():
    """Import the compiler's tree types, which building a program needs: about 1.5 ms, taken
    off a cold child's start by doing it once the hello is sent, while the host grades it."""
    global ast
    if ast is None:
        import _ast

        ast = _ast


def build_program(source):
    """Parse the model's program and wrap its body in a synthetic function.

    Returns (code, is_async). Raises SyntaxError with the program's own line and column.
    """
    _load_ast()
    tree = compile(source, PROGRAM_FILENAME, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    body = list(tree.body)  # type: ignore[attr-defined]
    futures = []
    while body and isinstance(body[0], ast.ImportFrom) and body[0].module == "__future__":
        futures.append(body.pop(0))
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        # A leading docstring is allowed before __future__ imports; keep it as a statement.
        pass
    walker = _ScopeWalker()
    for statement in body:
        walker.visit(statement)
    if walker.yields:
        first = next(n for s in body for n in _walk(s) if isinstance(n, (ast.Yield, ast.YieldFrom)))
        raise SyntaxError(
            "'yield' outside function",
            (PROGRAM_FILENAME, first.lineno, first.col_offset + 1, None),
        )
    # Module-level names stay module globals, as they would in a script: functions defined
    # by the program see them, and `global` inside those functions means what it says.
    body = [_unannotate(statement) for statement in body]
    body = [statement for statement in body if statement is not None]
    if body and isinstance(body[-1], ast.Expr):
        last = body[-1]
        body[-1] = _copy_location(ast.Return(value=last.value), last)
    anchor = body[0] if body else (futures[0] if futures else None)
    if not body:
        body = [ast.Pass()]
    if walker.names:
        body.insert(0, ast.Global(names=sorted(walker.names)))
    factory = ast.AsyncFunctionDef if walker.awaits else ast.FunctionDef
    arguments = ast.arguments(
        posonlyargs=[],
        args=[],
        vararg=None,
        kwonlyargs=[],
        kw_defaults=[],
        kwarg=None,
        defaults=[],
    )
    wrapper = factory(
        name=MAIN_NAME,
        args=arguments,
        body=body,
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    if sys.version_info >= (3, 12):
        wrapper.type_params = []
    module = ast.Module(body=[*futures, wrapper], type_ignores=[])
    if anchor is not None:
        # Anchor the synthetic nodes on the first real statement so every line number in a
        # traceback is a line of the model's text.
        for node in (wrapper, body[0]):
            _copy_location(node, anchor)
            node.end_lineno = anchor.end_lineno
            node.end_col_offset = anchor.end_col_offset
    _fix_missing_locations(module)
    # dont_inherit: this module's own compiler flags must not leak into the program.
    code = compile(module, PROGRAM_FILENAME, "exec", dont_inherit=True)
    return code, walker.awaits


def _unannotate(statement):
    # `x: int = 1` cannot stay annotated once `x` is declared global inside the wrapper.
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        if statement.value is None:
            return None
        return _copy_location(
            ast.Assign(targets=[statement.target], value=statement.value), statement
        )
    return statement
