"""The op's modules import one another by public names only, without cycles."""
import ast
import os.path as osp
from pathlib import Path

import polaformerpp.ops

OPS_DIR = Path(osp.dirname(polaformerpp.ops.__file__))
# the compiled kernels: a private extension module, loaded by the CPU backend alone
PRIVATE_EXTENSION = '_pola_features_cpu'


def _modules():
    return sorted(OPS_DIR.rglob('*.py'))


def _module_name(path):
    parts = path.relative_to(OPS_DIR.parent.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


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
    for path in _modules():
        for module, name in _imports(path):
            if not module.startswith('polaformerpp'):
                continue
            names = [n for n in module.split('.') + [name or ''] if n.startswith('_') and n != '__init__']
            if names == [PRIVATE_EXTENSION] and path.name == 'cpu.py':
                continue
            if names:
                offenders.append(f'{path.relative_to(OPS_DIR)}: {module} {name or ""}')
    assert not offenders, 'private names imported across modules:\n' + '\n'.join(offenders)


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
