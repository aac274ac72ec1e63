class LensHeadsError(Exception):
    """A user-facing error: one clear message, no traceback needed."""
