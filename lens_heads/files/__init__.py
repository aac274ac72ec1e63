"""Files lens_heads writes, and what names their content: atomic writes (``atomic``), claim
files that let processes share a folder (``claims``), the on-disk cache (``cache``), content
digests (``hashing``) and the package versions recorded with every result (``provenance``).

May import: the root modules (``errors``, ``registry``, ``progress``) and nothing else of
lens_heads. Imported by: any wing that writes a file or names its content.
"""
