"""Device harness only (not lexiflow's): the sharded stages never call gensim, whose cp312 wheel would not
fit the 64 MiB the device call carries; any `gensim.*` import gets a module whose names are inert."""
import importlib.abc
import importlib.machinery
import sys
import types


class _Inert:
    def __init__(self, *args, **kwargs):
        pass


class _Module(types.ModuleType):
    __path__: list = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.startswith("gensim.") else None

    def create_module(self, spec):
        return _Module(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.insert(0, _Finder())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Inert
