//! Tests of the fitness check.
