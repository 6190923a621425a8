"""Proof-carrying models: the certificate a rewritten model carries (``certificate``), its replay on the input
(``replay``) and ``xflow check`` (``check``), which uses none of the search."""
