//! The pristine exercises, exactly as shipped: what `reset` restores, and what the workshop's
//! own tests check, so a learner's edits in `src/` never change the test suite's answer.

pub mod ex1_graph;
pub mod ex2_refs;
pub mod ex3_cache;
pub mod ex4_seed;
