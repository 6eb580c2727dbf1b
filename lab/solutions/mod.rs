//! The reference solutions of the workshop exercises (compiled into leaklab-exercises as
//! `solutions`, so the tests can prove each one passes its check).

pub mod ex1_graph;
pub mod ex2_refs;
pub mod ex3_cache;
pub mod ex4_seed;
