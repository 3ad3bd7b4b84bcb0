//! Packing of sub-byte and scale formats: two E2M1 codes per byte (element 2i in the low
//! nibble), four UE8M0 bytes per u32 (byte i of word w is group 4w+i, little-endian).

/// Packs E2M1 codes (one per byte, low nibble used) two per byte. `codes.len()` must be even.
pub fn pack_e2m1(codes: &[u8]) -> Vec<u8> {
    assert!(
        codes.len().is_multiple_of(2),
        "E2M1 packing needs an even count, got {}",
        codes.len()
    );
    codes
        .chunks_exact(2)
        .map(|p| (p[0] & 0xf) | (p[1] << 4))
        .collect()
}

/// Unpacks two E2M1 codes per byte, low nibble first.
pub fn unpack_e2m1(packed: &[u8]) -> Vec<u8> {
    packed.iter().flat_map(|&b| [b & 0xf, b >> 4]).collect()
}

/// The E2M1 code of element `i` of a packed row.
#[inline]
pub fn e2m1_at(packed: &[u8], i: usize) -> u8 {
    (packed[i / 2] >> ((i % 2) * 4)) & 0xf
}

/// Packs UE8M0 bytes four per u32; a tail shorter than four is padded with 127 (scale 1).
pub fn pack_ue8m0(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [127u8; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(w)
        })
        .collect()
}

/// Unpacks `count` UE8M0 bytes from u32 words.
pub fn unpack_ue8m0(words: &[u32], count: usize) -> Vec<u8> {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take(count)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_low_nibble_first() {
        assert_eq!(pack_e2m1(&[0x1, 0xf, 0x7, 0x8]), vec![0xf1, 0x87]);
        let codes: Vec<u8> = (0..64).map(|i| (i * 7 % 16) as u8).collect();
        let packed = pack_e2m1(&codes);
        assert_eq!(unpack_e2m1(&packed), codes);
        for (i, &c) in codes.iter().enumerate() {
            assert_eq!(e2m1_at(&packed, i), c);
        }
    }

    #[test]
    fn ue8m0_little_endian() {
        assert_eq!(pack_ue8m0(&[1, 2, 3, 4, 5]), vec![0x0403_0201, 0x7f7f_7f05]);
        assert_eq!(
            unpack_ue8m0(&[0x0403_0201, 0x7f7f_7f05], 5),
            vec![1, 2, 3, 4, 5]
        );
    }
}
