"""How spread out the package is: the measures issue #55's redesign is judged by.

`python -m vllm_keras_hub.testing.footprint` prints, for the package's own
modules (tests and `testing/` aside): for each family, how many modules
name one of its KerasHub classes, in all and outside its own place (its
module `families/<name>.py` or its folder `families/<name>/`, and the
folder it shares parts with), and of those outside, how many name one in
their code (comments and docstrings aside: most cite KerasHub's source as
the reason for shared code); the modules over 400 lines; the imports made
inside functions; and the `noqa: E402` lines.

A name counts by its prefix, so a vLLM class of the same prefix counts too.
"""

import ast
import io
import pathlib
import re
import tokenize

from vllm_keras_hub.families import FAMILIES

PACKAGE = pathlib.Path(__file__).resolve().parents[1]
MAX_LINES = 400
_IDENTIFIER = re.compile(r"\b[A-Z][A-Za-z0-9_]*")


def package_modules():
    """The package's own modules, tests and `testing/` aside."""
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if not path.name.endswith("_test.py") and "testing" not in path.parts
    )


def _prefixes():
    # Longest first, so "Qwen3MoeBackbone" counts for Qwen3-MoE, not Qwen3.
    prefixes = {family.backbone.removesuffix("Backbone"): family.name for family in FAMILIES}
    return sorted(prefixes.items(), key=lambda item: -len(item[0]))


def _family_of(identifier, prefixes):
    for prefix, name in prefixes:
        rest = identifier[len(prefix) :]
        if identifier.startswith(prefix) and rest[:1].isupper():
            return name
    return None


def _code_text(source):
    """`source` without its comments and docstrings."""
    docstrings = {
        node.body[0].value.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }
    return " ".join(
        token.string
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type != tokenize.COMMENT
        and not (token.type == tokenize.STRING and token.start[0] in docstrings)
    )


def family_modules(modules=None, code_only=False):
    """{family name: sorted module paths that name one of its classes}.

    Args:
        modules: The modules to read; the package's by default.
        code_only: Whether to read their code alone, without comments and
            docstrings.
    """
    prefixes = _prefixes()
    found = {family.name: set() for family in FAMILIES}
    for path in modules or package_modules():
        text = path.read_text()
        for identifier in _IDENTIFIER.findall(_code_text(text) if code_only else text):
            name = _family_of(identifier, prefixes)
            if name:
                found[name].add(str(path.relative_to(PACKAGE)))
    return {name: sorted(paths) for name, paths in found.items()}


def own_place(family, path):
    """Whether `path` (relative to the package) is in `family`'s own place."""
    places = {family.name, family.parts or family.name}
    parts = pathlib.PurePath(path).parts
    if parts[0] != "families" or len(parts) < 2:
        return False
    return parts[1].removesuffix(".py") in places


def outside_modules(found=None):
    """{family name: the modules outside its own place that name its classes}."""
    found = found or family_modules()
    by_name = {family.name: family for family in FAMILIES}
    return {
        name: [path for path in paths if not own_place(by_name[name], path)]
        for name, paths in found.items()
    }


def long_modules(modules=None):
    """{module: lines} for the modules over `MAX_LINES` lines."""
    lengths = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in modules or package_modules()
    }
    return {path: n for path, n in lengths.items() if n > MAX_LINES}


def function_imports(modules=None):
    """How many import statements sit inside a function body."""
    count = 0
    for path in modules or package_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                count += sum(
                    isinstance(inner, ast.Import | ast.ImportFrom)
                    for inner in ast.walk(node)
                    if inner is not node
                )
    return count


def late_imports(modules=None):
    """How many lines say `noqa: E402` (an import after code)."""
    return sum(
        path.read_text().count("noqa: E402") for path in modules or package_modules()
    )


def main():
    modules = package_modules()
    print(f"{len(modules)} package modules (tests and testing/ aside)")
    print("modules naming a family's classes: in all, outside its own place, of those in code")
    found = family_modules(modules)
    outside = outside_modules(found)
    code = outside_modules(family_modules(modules, code_only=True))
    for name in sorted(found, key=lambda name: (-len(code[name]), -len(outside[name]))):
        counts = f"{len(found[name]):3} {len(outside[name]):3} {len(code[name]):3}"
        print(f"  {name:12} {counts}  {' '.join(code[name])}")
    long = long_modules(modules)
    print(f"modules over {MAX_LINES} lines: {len(long)}")
    for path, n in sorted(long.items(), key=lambda item: -item[1]):
        print(f"  {path} {n}")
    print(f"imports inside functions: {function_imports(modules)}")
    print(f"noqa: E402 lines: {late_imports(modules)}")


if __name__ == "__main__":
    main()
