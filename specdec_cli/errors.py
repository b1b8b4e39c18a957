"""The one exception type for problems a user can fix (bad setting, missing file, wrong index).

A library error about a setting names the setting as the library knows it (`top_p`, `max_new_tokens`) and
carries it in `setting`; the command line shows it as its flag (`--top-p`), the chat REPL as its `/set`
key. The CLI prints the message as one line and exits non-zero; any other exception is a bug and shows a
traceback only with SPECDEC_DEBUG=1.
"""

from __future__ import annotations

from typing import Optional, Sequence


class SpecdecError(Exception):
    """A user-facing error: the message is the whole story, no traceback needed."""

    def __init__(self, message: str, setting: Optional[str] = None):
        super().__init__(message)
        self.setting = setting  # the library's name of the setting at fault, when one is

    def naming(self, spelled: str) -> str:
        """The message with the setting's name, where it opens the message, spelled another way."""
        message = str(self)
        if self.setting and message.startswith(self.setting):
            return spelled + message[len(self.setting):]
        return message


def check_choice(value: str, choices: Sequence[str], setting: str, *, named: Optional[str] = None) -> str:
    """`value` when it is one of `choices`, else one line: "SETTING must be one of ..., got VALUE". `named` is how
    the message names a value that is not a setting (an environment variable); `setting` is then left off."""
    if value not in choices:
        raise SpecdecError(f"{named or setting} must be one of {', '.join(choices)}, got {value!r}",
                           setting=None if named else setting)
    return value


# settings whose flags are spelled as llama.cpp spells them, not after the setting
FLAG_NAMES = {"repetition_penalty": "--repeat-penalty", "penalty_last_n": "--repeat-last-n"}


def flag_of(setting: str) -> str:
    """The command-line flag of a library setting: `max_new_tokens` -> `--max-new-tokens`."""
    return FLAG_NAMES.get(setting, "--" + setting.replace("_", "-"))


TOKEN_LIMIT = 2**31  # token ids lie in [0, 2**31): automata and index files hold int32


class TokenIdError(SpecdecError, ValueError):
    """A token id outside the vocabulary: one line for the command line, a ValueError for library callers."""
