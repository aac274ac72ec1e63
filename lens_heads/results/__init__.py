"""What identifies a stored result and where it lies: typed store keys, built here and nowhere
else (``keys``: a run's identity from the weights' digest, the task, the protocol and the score
revisions), and the content-addressed, resumable result store (``store``).

Floor 7 of docs/architecture.md. May import: the wings below it (up to ``evaluation`` and
``surgery``). Imported by: ``sweep`` and every wing above it.
"""
