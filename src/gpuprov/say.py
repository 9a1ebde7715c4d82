"""`Say`: how a use case tells the user what it is doing, one line at a time.

The CLI hands one in (`cli/common.say_to`: the console's line, silent under `--quiet`); the library only calls
it, so the cloud's and the hosts' steps print nothing of their own and a test can collect the lines in a list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

Say: TypeAlias = Callable[[str], None]
