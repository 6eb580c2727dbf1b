//! The three causes, one module each, the leaky and the fixed code side by side.
//!
//! Every leaky line is marked `LEAK(<cause>)` and its twin `FIX(<cause>)`, so
//! `grep -rn 'LEAK(' crates/service` lists every deliberate leak in the lab.

pub mod cache;
pub mod graph;
pub mod refs;
