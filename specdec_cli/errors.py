"""The one exception type for problems a user can fix (bad flag, missing file, wrong index).

The CLI prints its message as one line and exits non-zero; any other exception is a bug and shows a
traceback only with SPECDEC_DEBUG=1.
"""


class SpecdecError(Exception):
    """A user-facing error: the message is the whole story, no traceback needed."""
