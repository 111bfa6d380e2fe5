"""The one exception type for bad user input; the CLI turns it into exit code 2."""


class InputError(ValueError):
    """Bad input or configuration: the message is one line a user can act on."""
