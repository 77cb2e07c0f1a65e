//! UTF-8 checks of wire strings, ASCII first. The strings the sidecar reads per item (ids, subjects,
//! names, keys) are short and almost always ASCII: `[u8]::is_ascii` is inlined and reads a word at
//! a time, where `std::str::from_utf8` is a call with its own set-up, ~100 instructions for a
//! 20-40 byte string, and ran ~50 times an item (docs/benchmarks.md). Non-ASCII strings still go
//! through `from_utf8`, so what is accepted does not change.

/// Whether `bytes` are valid UTF-8.
#[inline]
pub(crate) fn valid_utf8(bytes: &[u8]) -> bool {
    bytes.is_ascii() || std::str::from_utf8(bytes).is_ok()
}

/// `bytes` as a `str`, or `None` when they are not valid UTF-8.
#[inline]
pub(crate) fn text(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: every ASCII byte sequence is valid UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_agree_with_from_utf8_on_every_kind_of_byte_string() {
        let mut seed = 7u64;
        let alphabet: [&[u8]; 8] = [
            b"a",
            b".",
            b"\x7f",
            b"\xc3\xa9",
            b"\xe2\x82\xac",
            b"\xff",
            b"\x80",
            b"\xf0\x9f\x98\x80",
        ];
        for len in 0..48 {
            for _ in 0..200 {
                let mut bytes = Vec::new();
                while bytes.len() < len {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    bytes.extend_from_slice(alphabet[(seed >> 33) as usize % alphabet.len()]);
                }
                let want = std::str::from_utf8(&bytes).ok();
                assert_eq!(text(&bytes), want, "{bytes:?}");
                assert_eq!(valid_utf8(&bytes), want.is_some(), "{bytes:?}");
            }
        }
    }
}
