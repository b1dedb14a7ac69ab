"""The one exception type users see.

Library code raises :class:`LiveputError` for bad user input (a malformed trace, an unknown name, an
infeasible configuration). Its message is one line that says what is wrong and where; the CLI prints
it on stderr and exits with code 2, without a traceback.
"""

from __future__ import annotations


class LiveputError(ValueError):
    """Bad user input or an impossible request, explained in one line."""

    def __init__(self, message: str) -> None:
        # One line: a message with newlines would break the CLI's one-line contract.
        super().__init__(" ".join(str(message).split()))
