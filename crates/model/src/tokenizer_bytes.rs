//! GPT-2's byte ↔ unicode table: byte-level BPE vocabularies spell every byte as a printable
//! character (space is `Ġ`, newline `Ċ`), so merges and tokens are plain strings.

use std::sync::OnceLock;

struct Table {
    to_char: [char; 256],
    // Printable stand-ins all lie below U+0144, so a flat array indexes them.
    to_byte: [Option<u8>; 0x144],
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut to_char = ['\0'; 256];
        let mut to_byte = [None; 0x144];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let cp = if printable(b) {
                u32::from(b)
            } else {
                next += 1;
                next - 1
            };
            // cp < 0x144, always a valid scalar value.
            let c = char::from_u32(cp).unwrap_or('\0');
            to_char[b as usize] = c;
            to_byte[cp as usize] = Some(b);
        }
        Table { to_char, to_byte }
    })
}

/// The printable character that stands for byte `b`.
pub fn byte_to_char(b: u8) -> char {
    table().to_char[b as usize]
}

/// The byte a printable stand-in character represents, if it is one.
pub fn char_to_byte(c: char) -> Option<u8> {
    table().to_byte.get(c as usize).copied().flatten()
}

/// Spells `bytes` with stand-in characters.
pub fn bytes_to_token_text(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

/// Decodes a token's stand-in spelling to bytes; `None` if a character is not a stand-in.
pub fn token_text_to_bytes(text: &str) -> Option<Vec<u8>> {
    text.chars().map(char_to_byte).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_table() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('日'), None);
    }
}
