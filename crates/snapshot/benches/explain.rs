//! Reading and explaining a large snapshot: bytes per second of pickle, for the 1 GB goal.

fn main() {}
