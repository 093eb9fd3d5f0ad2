"""Errors a user can cause. The CLI turns each into one line on stderr and exit code 2."""


class HelmInputError(ValueError):
    """Bad input from a user: a CLI value, a profile, a trace file. The message names the value."""


class TraceFormatError(HelmInputError):
    """A malformed line in a trace file; the message names the file and the line number."""

    def __init__(self, path: str, line: int, reason: str):
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = path, line, reason

    def __reduce__(self):
        """Pickled with its three fields (a worker process sends it back whole)."""
        return type(self), (self.path, self.line, self.reason)
