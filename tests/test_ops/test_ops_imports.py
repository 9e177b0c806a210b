"""The package's modules import one another by public names only (an op's package through its public
face), and the op's modules without cycles."""
import ast
import importlib
import importlib.util
import os.path as osp
from pathlib import Path

import polaformerpp
import polaformerpp.ops

PACKAGE_DIR = Path(osp.dirname(polaformerpp.__file__))
OPS_DIR = Path(osp.dirname(polaformerpp.ops.__file__))
# the compiled kernels: a private extension module, loaded by the one loader alone
PRIVATE_EXTENSION = '_C'
EXTENSION_LOADER = 'library.py'


def _modules(root=OPS_DIR):
    return sorted(root.rglob('*.py'))


def _module_name(path):
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _op_packages():
    """The packages under ``polaformerpp.ops`` (an op with its backends, the fused modules)."""
    return sorted(_module_name(p) for p in OPS_DIR.glob('*/__init__.py'))


def _imports(path):
    """``(module, name)`` of every ``from ... import name`` and ``(module, None)`` of every ``import``."""
    package = _module_name(path) if path.name == '__init__.py' else _module_name(path).rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition('.')[0]
            module = '.'.join(p for p in (base if node.level else '', node.module or '') if p)
            for alias in node.names:
                yield module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None


def test_no_private_names_imported_across_modules():
    offenders = []
    for path in _modules(PACKAGE_DIR):
        for module, name in _imports(path):
            if not module.startswith('polaformerpp'):
                continue
            names = [n for n in module.split('.') + [name or ''] if n.startswith('_') and not _dunder(n)]
            if names == [PRIVATE_EXTENSION] and path.name == EXTENSION_LOADER:
                continue
            if names:
                offenders.append(f'{path.relative_to(PACKAGE_DIR)}: {module} {name or ""}')
    assert not offenders, 'private names imported across modules:\n' + '\n'.join(offenders)


def _dunder(name):
    return name.startswith('__') and name.endswith('__')


def test_op_packages_are_used_through_their_public_face():
    """Outside an op's package, code imports the package itself, never one of its modules; and an import
    from outside a module's package names only what that module exports, where it declares ``__all__``."""
    packages = _op_packages()
    assert 'polaformerpp.ops.pola_attention' in packages and 'polaformerpp.ops.fusion' in packages
    offenders = []
    for path in _modules(PACKAGE_DIR):
        me = _module_name(path)
        for module, name in _imports(path):
            if not module.startswith('polaformerpp'):
                continue
            for package in packages:
                inside = me == package or me.startswith(package + '.')
                if not inside and module.startswith(package + '.'):
                    offenders.append(f'{me}: imports {module} (use {package})')
            package = module.rpartition('.')[0]
            if name is None or name == '*' or module == me or me == package or me.startswith(package + '.'):
                continue  # within one package its modules share what they need
            target = importlib.import_module(module)
            exported = getattr(target, '__all__', None)
            if exported is None or name in exported or _is_submodule(target, name):
                continue
            offenders.append(f'{me}: imports {name} from {module}, which does not export it')
    assert not offenders, 'imports past a public face:\n' + '\n'.join(sorted(set(offenders)))


def _is_submodule(package, name):
    """Whether ``name`` is a module of ``package`` (``from package import module``)."""
    return hasattr(package, '__path__') and importlib.util.find_spec(f'{package.__name__}.{name}') is not None


def test_no_import_cycles_between_op_modules():
    """Module-level imports among polaformerpp.ops form no cycle (packages import their children)."""
    known = {_module_name(p) for p in _modules()}
    graph = {}
    for path in _modules():
        me = _module_name(path)
        deps = set()
        for module, name in _imports(path):
            # `from pkg import sub` imports the module pkg.sub; `from mod import name`, the module mod
            target = f'{module}.{name}' if f'{module}.{name}' in known else module
            if target in known and target != me and not me.startswith(target + '.'):
                deps.add(target)
        graph[me] = deps
    assert graph['polaformerpp.ops.pola_attention.dispatch'] >= {'polaformerpp.ops.pola_attention.eager',
                                                                 'polaformerpp.ops.pola_attention.cpu'}

    def visit(node, stack):
        assert node not in stack, 'import cycle: ' + ' -> '.join(stack + [node])
        for dep in graph.get(node, ()):
            visit(dep, stack + [node])

    for node in graph:
        visit(node, [])
