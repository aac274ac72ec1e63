"""What identifies a stored result and where it lies: typed store keys, built here and nowhere
else (``keys``: a run's identity from the weights' digest, the task, the protocol and the score
revisions), and the content-addressed, resumable result store (``store``).

May import: the wings below it (the root modules, ``files``, ``data``, ``models``, ``forward``,
``scores``, ``interventions``, ``evaluation``, ``surgery``). Imported by: sweep and the wings
above it.
"""
