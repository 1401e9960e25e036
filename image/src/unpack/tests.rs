//! Tests of unpack.
