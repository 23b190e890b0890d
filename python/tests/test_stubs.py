"""The .pyi stubs and __all__ name exactly what the compiled module has, so they cannot drift
from the bindings."""

import ast
import pathlib

import pagedkv as pk
from pagedkv import _pagedkv

STUB = pathlib.Path(__file__).resolve().parents[1] / "pagedkv" / "_pagedkv.pyi"


def stub_names():
    tree = ast.parse(STUB.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members[node.name] = {
                n.name if isinstance(n, ast.FunctionDef) else n.target.id
                for n in node.body if isinstance(n, (ast.FunctionDef, ast.AnnAssign))
            } | {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets}
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
    return top, members


def public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def test_stub_lists_every_module_name():
    top, _ = stub_names()
    assert top == public(_pagedkv)


def test_stub_lists_every_member():
    _, members = stub_names()
    for cls, names in members.items():
        obj = getattr(_pagedkv, cls)
        if issubclass(obj, BaseException):
            continue
        have = public(obj)
        if cls == "KVCacheManager":
            have |= {"__init__", "__contains__"}
            names = names | {"__init__"}
        elif issubclass(obj, __import__("enum").Enum):
            have = {m.name for m in obj}
        else:
            names = names - {"__init__"}
        assert names == have, cls


def test_all_reexports_the_module():
    assert set(pk.__all__) == public(_pagedkv) | {"batch_metadata_to_torch",
                                                  "replay_prefix_index"}
    for name in pk.__all__:
        assert hasattr(pk, name), name
