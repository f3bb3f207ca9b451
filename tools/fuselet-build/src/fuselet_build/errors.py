"""The one exception type the CLI turns into a clear message and a non-zero exit."""


class UserError(Exception):
    """Bad input or an environment problem, with a message that says what to do."""
