"""Your code, as a manifest names it: `module:function`, imported from the consumer's image or from the
files a ConfigMap puts on its `PYTHONPATH` (`spec.consumer.code`). A reference that cannot be imported is one
line at start-up naming what is wrong."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from hubshift.errors import UserError, one_line

# `module:function`, as the manifest names a user's function.
FUNCTION_REFERENCE = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


def load_function(reference: str, what: str = "function") -> Callable[..., Any]:
    """Import `module:function`; `UserError` (one line, `what` naming the field) when it cannot be."""
    where = f"{what} {reference!r}"
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise UserError(f"{where}: expected module:function, e.g. mypackage.jobs:enrich")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(f"{missing}."):
            raise UserError(
                f"{where}: no module named {missing!r} (install it in the consumer's image, put it in "
                "spec.consumer.code, or add it to PYTHONPATH)"
            ) from None
        raise UserError(f"{where}: importing {module_name} failed: no module named {missing!r}") from None
    except (Exception, SystemExit) as exc:  # a module written as a script exits when imported
        raise UserError(f"{where}: importing {module_name} failed: {one_line(exc)}") from None
    function = getattr(module, attribute, None)
    if function is None:
        raise UserError(f"{where}: module {module_name} has no attribute {attribute!r}")
    if not callable(function):
        raise UserError(f"{where}: {attribute} is a {type(function).__name__}, not a function")
    loaded: Callable[..., Any] = function
    return loaded
