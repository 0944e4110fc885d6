"""Errors a person can act on: the command line prints their message as one line and exits non-zero."""


class UserError(Exception):
    """A problem with the input or the environment that the user can fix.

    The message names the resource or field at fault and what to do; it never carries a secret.
    """

    exit_code = 2
