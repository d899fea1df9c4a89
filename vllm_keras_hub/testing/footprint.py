"""How spread out the package is: the measures issue #55's redesign is judged by.

`python -m vllm_keras_hub.testing.footprint` prints, for the package's own
modules (tests and `testing/` aside): for each family, how many modules name
one of its KerasHub classes; the modules over 400 lines; the imports made
inside functions; and the `noqa: E402` lines.
"""

import ast
import pathlib
import re

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


def family_modules(modules=None):
    """{family name: sorted module paths that name one of its classes}."""
    prefixes = _prefixes()
    found = {family.name: set() for family in FAMILIES}
    for path in modules or package_modules():
        for identifier in _IDENTIFIER.findall(path.read_text()):
            name = _family_of(identifier, prefixes)
            if name:
                found[name].add(str(path.relative_to(PACKAGE)))
    return {name: sorted(paths) for name, paths in found.items()}


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
    print("modules naming a family's classes:")
    for name, paths in sorted(family_modules(modules).items(), key=lambda item: -len(item[1])):
        print(f"  {name:12} {len(paths):3}")
    long = long_modules(modules)
    print(f"modules over {MAX_LINES} lines: {len(long)}")
    for path, n in sorted(long.items(), key=lambda item: -item[1]):
        print(f"  {path} {n}")
    print(f"imports inside functions: {function_imports(modules)}")
    print(f"noqa: E402 lines: {late_imports(modules)}")


if __name__ == "__main__":
    main()
