"""`import lancedb` without the REST client that kb never uses.

lancedb imports lance_namespace, and lance_namespace imports the models of
the package lance_namespace_urllib3_client. The __init__ of that package
also imports its REST API classes: 366 methods with pydantic's
@validate_call, and pydantic builds a validator for each one at import.
That was 2.1 s of the 3.6 s of CPU of `import lancedb` (lancedb 0.40), in
each process that opens LanceDB: kb web, kb-mcp, each run worker that
writes the index. kb opens folders and S3, never a REST namespace.

lancedb_module() first puts the package into sys.modules without running
its __init__. Its submodules (the models) import as usual. The first read
of a name of the package itself (for example its ApiClient) runs the
__init__, so nothing that uses the REST client breaks.
"""

from __future__ import annotations

import importlib.util
import sys
import threading

REST_CLIENT = "lance_namespace_urllib3_client"
_LOCK = threading.Lock()


def lancedb_module():
    """The lancedb module, imported on the first call."""
    with _LOCK:
        if "lancedb" not in sys.modules:
            _register_lazy_package(REST_CLIENT)
    import lancedb

    return lancedb


def _register_lazy_package(name: str) -> None:
    spec = importlib.util.find_spec(name)
    if name in sys.modules or spec is None or spec.loader is None:
        return
    package = importlib.util.module_from_spec(spec)

    def run_init(attribute: str):
        # Runs once: the __init__ defines the names, so this hook is not asked again for them.
        del package.__getattr__
        spec.loader.exec_module(package)
        return getattr(package, attribute)

    package.__getattr__ = run_init
    sys.modules[name] = package
