# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""String- and dict-heavy wire helpers: subjects, token normalisation, cancellation tombstones and the
inbound MSG fast path."""
include "_parts/subjects.pxi"
include "_parts/tombstones.pxi"
include "_parts/inbound.pxi"
