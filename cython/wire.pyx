# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""String- and dict-heavy wire helpers: subjects, token normalisation and cancellation tombstones."""
include "_parts/subjects.pxi"
include "_parts/tombstones.pxi"
