//! The mutations: bit flips, bytes replaced or inserted with interesting values, integers
//! overwritten with boundary values, deletions, truncation, splicing with another seed, repeated
//! chunks, and tokens of the text formats (YAML, JSON, cron) inserted. Several are stacked per
//! execution. Deterministic for a seed, so a run can be repeated.

/// A small, fast PRNG (xorshift64*); a fuzzer needs speed, not quality.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Inputs never grow beyond this (a parser's size limit is tested by the seeds, not by growth).
pub const MAX_INPUT: usize = 1 << 20;

const INTERESTING_8: [u8; 10] = [0, 1, 2, 7, 8, 9, 0x7f, 0x80, 0xfe, 0xff];
const INTERESTING_64: [u64; 16] = [
    0,
    1,
    2,
    3,
    4,
    5,
    16,
    255,
    4096,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    u64::MAX,
];
/// Tokens of the text formats tb parses.
const TOKENS: [&[u8]; 41] = [
    b"\n",
    b": ",
    b"- ",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b"\"",
    b"'",
    b"*",
    b"/",
    b"-",
    b"@daily",
    b"&a ",
    b"*a",
    b"!!binary ",
    b"<<: ",
    b"---\n",
    b"\\u0000",
    b"\\ud800",
    b"1e999",
    b"-1",
    b"18446744073709551616",
    b"null",
    b"true",
    b"NaN",
    b"0x10",
    b"~",
    b"#",
    b"  ",
    b"\t",
    b"?",
    b"\xff",
    b"4294967295",
    b"4294967296",
    b"2147483648",
    b"65535",
    b"9223372036854775807",
    b"60",
    b"0",
];

/// Mutates `data` in place, stacking 1 to 4 mutations; `other` is a second seed to splice from.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let n = 1 + rng.below(4);
    for _ in 0..n {
        mutate_once(rng, data, other);
    }
    data.truncate(MAX_INPUT);
}

fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let len = data.len();
    match rng.below(12) {
        // Flip a bit.
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        // Replace a byte with an interesting one or a random one.
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = if rng.chance(2) {
                INTERESTING_8[rng.below(INTERESTING_8.len())]
            } else {
                rng.next_u64() as u8
            };
        }
        // Insert bytes.
        2 => {
            let i = rng.below(len + 1);
            let k = 1 + rng.below(8);
            for _ in 0..k {
                data.insert(i, rng.next_u64() as u8);
            }
        }
        // Overwrite 1, 2, 4 or 8 bytes with a boundary integer (little-endian, as GGUF and the
        // wire formats are).
        3 | 4 if len > 0 => {
            let width = 1 << rng.below(4);
            let mut v = INTERESTING_64[rng.below(INTERESTING_64.len())];
            if rng.chance(4) {
                v = v.wrapping_sub(1);
            }
            let bytes = v.to_le_bytes();
            let i = rng.below(len);
            for (k, b) in bytes.iter().take(width).enumerate() {
                if let Some(slot) = data.get_mut(i + k) {
                    *slot = *b;
                }
            }
        }
        // Delete a range.
        5 if len > 0 => {
            let i = rng.below(len);
            let k = 1 + rng.below((len - i).min(64));
            data.drain(i..i + k);
        }
        // Truncate.
        6 if len > 0 => {
            data.truncate(rng.below(len));
        }
        // Splice: our head, another seed's tail.
        7 if !other.is_empty() => {
            let i = rng.below(len + 1);
            let j = rng.below(other.len());
            data.truncate(i);
            data.extend_from_slice(&other[j..]);
        }
        // Repeat a chunk.
        8 if len > 0 => {
            let i = rng.below(len);
            let k = 1 + rng.below((len - i).min(256));
            let chunk = data[i..i + k].to_vec();
            let times = 1 + rng.below(16);
            let at = rng.below(len + 1);
            for _ in 0..times {
                data.splice(at..at, chunk.iter().copied());
            }
        }
        // Insert a token of a text format.
        9 | 10 => {
            let t = TOKENS[rng.below(TOKENS.len())];
            let i = rng.below(len + 1);
            data.splice(i..i, t.iter().copied());
        }
        // Copy a range of the input over another place in it.
        _ if len > 1 => {
            let from = rng.below(len);
            let to = rng.below(len);
            let k = 1 + rng.below((len - from).min(len - to).min(32));
            let chunk = data[from..from + k].to_vec();
            data[to..to + k].copy_from_slice(&chunk);
        }
        _ => data.push(rng.next_u64() as u8),
    }
}
