"""One exception type for mistakes a user can fix. The CLI, train.py and eval.py print its
message as one line on stderr and exit with code 2; anything else is a bug and keeps its traceback."""


class UserError(Exception):
    """A mistake in the user's input (file, name, config, image), reported as one clear line."""
