"""Files lens_heads writes, and what names their content: atomic writes (``atomic``), claim
files that let processes share a folder (``claims``), the on-disk cache (``cache``), content
digests (``hashing``) and the package versions recorded with every result (``provenance``).

Floor 1 of docs/architecture.md. May import: the root modules only. Imported by: any wing that
writes a file or names its content (``models`` and every wing above it).
"""
