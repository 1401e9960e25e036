//! xorshift64*: deterministic pseudo-random numbers for benchmark data, fast enough that
//! generating hundreds of megabytes is not a run's cost, and bytes no compressor shrinks (not for
//! secrets). One generator for every benchmark that makes data.

/// The generator; its state must not be 0.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, (low, high): (u64, u64)) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    /// Fills `buf` with pseudo-random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}
