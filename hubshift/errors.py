"""Errors a person can act on: the command line prints their message as one line and exits non-zero."""

import importlib.util
from collections.abc import Mapping


class UserError(Exception):
    """A problem with the input or the environment that the user can fix.

    The message names the resource or field at fault and what to do; it never carries a secret.
    """

    exit_code = 2


def one_line(error: BaseException, *, limit: int = 300, hide: Mapping[str, str] | None = None) -> str:
    """An error as one line for a message: its kind and its text, whitespace folded, cut at `limit`.
    `hide`: secrets the text may hold, each replaced by what to show instead, before the cut (a secret cut
    in half is no longer found)."""
    text = str(error)
    for secret, shown in (hide or {}).items():
        if secret:
            text = text.replace(secret, shown)
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def require_extra(module: str, extra: str, needed_by: str) -> None:
    """`UserError` naming the pip extra to install when `module` is not installed: the operator and the
    commands install without PySpark, Delta, pandas and psycopg (pyproject.toml's optional dependencies)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UserError(
            f"{needed_by} needs {module}, which is not installed: pip install 'hubshift[{extra}]'"
        )
