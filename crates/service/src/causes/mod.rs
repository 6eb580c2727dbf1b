//! The reference scenario's three causes and the zoo's conv cause, one module each, the leaky
//! and the fixed code side by side.
//!
//! Every leaky line is marked `LEAK(<cause>)` and its twin `FIX(<cause>)`, so
//! `grep -rn 'LEAK(' crates/service` lists every deliberate leak in the lab.

pub mod cache;
pub mod conv;
pub mod graph;
pub mod refs;
