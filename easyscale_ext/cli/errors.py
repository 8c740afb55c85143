"""What every command raises for input it cannot act on."""


class UsageError(Exception):
    """Input the command cannot act on: one line on stderr saying what to do, exit status 2."""
