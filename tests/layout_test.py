"""The package's layout: folders by concern, and no import cycle among them."""

import ast
import os

import vllm_keras_hub

PACKAGE = os.path.dirname(vllm_keras_hub.__file__)


def _modules():
    """Module name -> path, for every non-test module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if not file.endswith(".py") or file.endswith("_test.py"):
                continue
            path = os.path.join(folder, file)
            parts = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(modules):
    """Module -> the package's modules it imports (at any depth of its code)."""
    graph = {}
    for name, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycle(graph):
    """One import cycle of `graph` as a list of modules, or `None`."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target, path + [target])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [node])
            if cycle:
                return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = _imports(_modules())
    assert "vllm_keras_hub.models.causal" in graph["vllm_keras_hub.models.hybrid"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_check_sees_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_folder_says_what_it_is_for():
    # A stand-in for another package, in that package's layout.
    stub = os.path.join(PACKAGE, "testing", "torchvision_stub")
    for folder, _, files in os.walk(PACKAGE):
        if "__init__.py" not in files or folder.startswith(stub):
            continue
        with open(os.path.join(folder, "__init__.py")) as f:
            docstring = ast.get_docstring(ast.parse(f.read()))
        assert docstring, f"{os.path.relpath(folder, PACKAGE)}/__init__.py has no docstring"
