//! The reader never panics, whatever the bytes: random input, and a valid snapshot cut or
//! corrupted at any byte, each give a value or an error.

use leaklab_snapshot::from_bytes;
use proptest::prelude::*;

/// A small snapshot as Python's pickle protocol 4 writes it (from tests/make_snapshots.py's
/// format, inlined so this property needs no Python).
fn valid() -> Vec<u8> {
    let mut p = vec![0x80, 4, b'}', 0x94];
    let s = |p: &mut Vec<u8>, t: &str| {
        p.push(0x8c);
        p.push(t.len() as u8);
        p.extend_from_slice(t.as_bytes());
        p.push(0x94);
    };
    s(&mut p, "segments");
    p.extend_from_slice(b"]\x94}\x94(");
    for (k, v) in [("address", 4096u32), ("total_size", 2048), ("stream", 0)] {
        s(&mut p, k);
        p.push(b'J');
        p.extend_from_slice(&v.to_le_bytes());
    }
    s(&mut p, "blocks");
    p.extend_from_slice(b"]\x94}\x94(");
    s(&mut p, "size");
    p.extend_from_slice(b"M\x00\x04");
    s(&mut p, "state");
    s(&mut p, "active_allocated");
    s(&mut p, "frames");
    p.extend_from_slice(b"]\x94}\x94(");
    s(&mut p, "filename");
    s(&mut p, "app.py");
    s(&mut p, "line");
    p.extend_from_slice(b"K\x07");
    s(&mut p, "name");
    s(&mut p, "handle");
    p.extend_from_slice(b"uaua"); // close the frame dict, append it; the block, append it
    p.extend_from_slice(b"uas."); // close the segment, append it; set segments on the top dict
    p
}

#[test]
fn the_valid_fixture_reads() {
    let snap = from_bytes(&valid()).unwrap();
    assert_eq!(snap.segments[0].blocks[0].size, 1024);
    assert_eq!(&*snap.segments[0].blocks[0].stack[0].name, "handle");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, rng_seed: proptest::test_runner::RngSeed::Fixed(7), ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = from_bytes(&bytes);
    }

    #[test]
    fn a_snapshot_cut_or_corrupted_anywhere_never_panics(cut in 0usize..400, at in 0usize..400, byte in any::<u8>()) {
        let mut data = valid();
        let n = data.len();
        data[at % n] = byte;
        data.truncate(cut % (n + 1));
        let _ = from_bytes(&data);
    }
}
