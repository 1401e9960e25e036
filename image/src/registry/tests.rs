//! tests (being written)
