//! The one seeded generator of the workspace: xorshift64*, which is cheap, reproducible on
//! every platform and good enough for weights and test inputs (not for anything secret).

/// A deterministic stream of numbers from a 64-bit seed.
#[derive(Debug, Clone)]
pub struct SeededRng {
    state: u64,
}

impl SeededRng {
    /// A generator from `seed`; a zero state would stay zero forever, so it is never used.
    pub fn new(seed: u64) -> SeededRng {
        SeededRng { state: seed | 1 }
    }

    /// A generator per name: seeded from `seed` and an FNV-1a hash of `name`, so that each
    /// variable of a model has its own stream whatever order they are built in.
    pub fn named(seed: u64, name: &str) -> SeededRng {
        SeededRng::new(name.bytes().fold(seed ^ 0xCBF2_9CE4_8422_2325, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
        }))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1) with 24 bits of resolution (what an f32 holds).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 40) as f64 / (1u64 << 24) as f64
    }

    /// Uniform in [-1, 1).
    pub fn symmetric(&mut self) -> f64 {
        self.unit() * 2.0 - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream_and_values_stay_in_range() {
        let a: Vec<u64> = (0..5)
            .scan(SeededRng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..5)
            .scan(SeededRng::new(7), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(
            SeededRng::named(1, "l0.weight").next_u64(),
            SeededRng::named(1, "l0.bias").next_u64()
        );
        let mut r = SeededRng::new(0);
        assert!((0..10_000)
            .map(|_| r.symmetric())
            .all(|v| (-1.0..1.0).contains(&v)));
    }
}
