//! PWSUM64, the page checksum the GPU computes (`page_checksum` in pages.cu), and its CPU twin.
//!
//! The bytes are read as little-endian u32 words `w_i`; then
//! `h = sum_i fmix64(((i << 32) | w_i) + 0x9E3779B97F4A7C15)` (wrapping) and the checksum is
//! `fmix64(h ^ len_bytes)`, with fmix64 MurmurHash3's 64-bit finalizer. Each term depends on
//! the word and its index through a bijection, so any single changed word changes the sum, and
//! a sum reduces in any order across GPU threads (xxh3 is sequential per stripe). It detects
//! corruption and misplaced writes, not an adversary: the wire checksum stays xxh3 (kvcache).

/// MurmurHash3's 64-bit finalizer.
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// PWSUM64 of `bytes` (`bytes.len()` must be a multiple of 4, as every page is).
pub fn pwsum64(bytes: &[u8]) -> u64 {
    assert_eq!(bytes.len() % 4, 0, "pwsum64 works on whole 32-bit words");
    let h = bytes.chunks_exact(4).enumerate().fold(0u64, |h, (i, c)| {
        let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64;
        h.wrapping_add(fmix64(
            ((i as u64) << 32 | w).wrapping_add(0x9E37_79B9_7F4A_7C15),
        ))
    });
    fmix64(h ^ bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_single_word_change_and_swap_is_seen() {
        let base: Vec<u8> = (0..256u32).flat_map(|i| (i * 7919).to_le_bytes()).collect();
        let h = pwsum64(&base);
        for at in 0..base.len() {
            let mut b = base.clone();
            b[at] ^= 1;
            assert_ne!(pwsum64(&b), h, "flip at byte {at}");
        }
        let mut swapped = base.clone();
        swapped.swap(0, 4);
        assert_ne!(pwsum64(&swapped), h, "swapped words");
        assert_ne!(pwsum64(&base[..base.len() - 4]), h, "length");
        assert_eq!(pwsum64(&base), h, "deterministic");
    }
}
