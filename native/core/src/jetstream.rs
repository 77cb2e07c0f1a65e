//! JetStream ACK subjects: how many times a message has been delivered, read from the reply
//! subject the server put on it, so a pulled batch's delivery attempts are counted without a
//! `Msg.metadata` object per message.

/// The delivery count in a JetStream ACK subject, or `None` when it is not one.
///
/// v1: `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` (9 tokens);
/// v2: `$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]`
/// (11 or more tokens). Read without UTF-8 validation (the field it reads is ASCII digits or
/// nothing): it runs once per pulled message, and the `str` split it replaced cost ~800
/// instructions a subject (docs/benchmarks.md).
pub fn delivered_count_bytes(ack_subject: &[u8]) -> Option<u64> {
    locate(ack_subject).map(|found| found.value)
}

/// What a full read of an ACK subject found: the count, where its field starts (everything before
/// it is the stream's and consumer's part, shared by a consumer's messages), and the format.
struct Located {
    value: u64,
    field_start: usize,
    v2: bool,
}

fn locate(ack_subject: &[u8]) -> Option<Located> {
    const PREFIX: &[u8] = b"$JS.ACK.";
    let rest = ack_subject.strip_prefix(PREFIX)?;
    // The first five dots and how many in all, eight bytes a step (SWAR): the byte-at-a-time walk
    // it replaced was ~500 instructions a subject, this ~150 (docs/benchmarks.md, "Tracing built
    // by the compiled core").
    let mut dots = [0usize; 5];
    let mut count = 0usize;
    let mut note = |at: usize, count: &mut usize| {
        if *count < dots.len() {
            dots[*count] = at;
        }
        *count += 1;
    };
    let mut chunks = rest.chunks_exact(8);
    for (i, chunk) in chunks.by_ref().enumerate() {
        let mut mask = dot_mask(u64::from_le_bytes(chunk.try_into().ok()?));
        while mask != 0 {
            if count >= 5 {
                count += mask.count_ones() as usize;
                break;
            }
            note(i * 8 + (mask.trailing_zeros() as usize) / 8, &mut count);
            mask &= mask - 1;
        }
    }
    let base = rest.len() - chunks.remainder().len();
    for (j, &b) in chunks.remainder().iter().enumerate() {
        if b == b'.' {
            note(base + j, &mut count);
        }
    }
    let token = |k: usize| -> &[u8] {
        let start = if k == 0 { 0 } else { dots[k - 1] + 1 };
        let end = if k < count { dots[k] } else { rest.len() };
        &rest[start..end]
    };
    let (k, v2) = match count + 3 {
        9 => (2, false),
        tokens if tokens >= 11 => (4, true),
        _ => return None,
    };
    Some(Located {
        value: digits(token(k))?,
        field_start: PREFIX.len() + dots[k - 1] + 1,
        v2,
    })
}

/// A non-empty run of ASCII digits as a u64 (None: empty, another byte, or past u64).
fn digits(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(value)
}

/// How many `.` in `bytes`, eight bytes a step.
fn count_dots(bytes: &[u8]) -> usize {
    let mut chunks = bytes.chunks_exact(8);
    let mut n = 0usize;
    for chunk in chunks.by_ref() {
        if let Ok(word) = <[u8; 8]>::try_from(chunk) {
            // One high bit per dot byte: shifted to the low bits, a multiply sums the eight bytes
            // into the top one (at most 8, no carry), 3 instructions against a software popcount's
            // ~12 on the baseline x86-64 target.
            n += ((dot_mask(u64::from_le_bytes(word)) >> 7).wrapping_mul(0x0101_0101_0101_0101)
                >> 56) as usize;
        }
    }
    // The last 0-7 bytes as one zero-padded word (zero is not a dot): one more step, not a byte loop
    // (the ~30-byte rest of an ACK subject ends in one, read for every pulled message).
    let tail = chunks.remainder();
    let mut last = [0u8; 8];
    last[..tail.len()].copy_from_slice(tail);
    n + ((dot_mask(u64::from_le_bytes(last)) >> 7).wrapping_mul(0x0101_0101_0101_0101) >> 56)
        as usize
}

/// The high bit of each byte of `word` that is `.`, and no other bit (exact: no false positives).
fn dot_mask(word: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let x = word ^ 0x2e2e_2e2e_2e2e_2e2e; // '.' bytes become zero
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// A batch's delivery counts, message by message: `(attempt, messages)` pairs kept ascending, and
/// how many subjects were not ACK subjects. Nothing is allocated per message.
///
/// A consumer's ACK subjects share everything before the count (`$JS.ACK.<stream>.<consumer>.`,
/// or with the domain and account hash): once one subject was read in full, a subject starting
/// with the same bytes is read from there, its remaining dots counted only to confirm the format
/// (four after the count in the 9-token form, four or more in the 11-token one). The result is the
/// full read's (a test compares them over mixed batches); it reads about half the bytes.
#[derive(Debug, Default)]
pub struct AttemptCounts {
    counts: Vec<(u64, u64)>,
    unknown: u64,
    /// The bytes before the count of the last subject read in full, and its format (v2 or not).
    shared: Option<(Vec<u8>, bool)>,
}

impl AttemptCounts {
    /// One message's ACK subject, read where it lies (None: it has none).
    pub fn add_bytes(&mut self, subject: Option<&[u8]>) {
        match subject.and_then(|s| self.read(s)) {
            Some(attempt) => self.count(attempt),
            None => self.unknown += 1,
        }
    }

    /// One more message at `attempt`, the pairs kept ascending.
    fn count(&mut self, attempt: u64) {
        match self.counts.binary_search_by_key(&attempt, |&(a, _)| a) {
            Ok(i) => self.counts[i].1 += 1,
            Err(i) => self.counts.insert(i, (attempt, 1)),
        }
    }

    fn read(&mut self, subject: &[u8]) -> Option<u64> {
        if let Some((head, v2)) = &self.shared {
            if let Some(rest) = subject.strip_prefix(head.as_slice()) {
                let after = count_dots(rest);
                if after == 4 || (*v2 && after > 4) {
                    let end = rest.iter().position(|&b| b == b'.').unwrap_or(rest.len());
                    return digits(&rest[..end]);
                }
            }
        }
        let found = locate(subject)?;
        let head = &subject[..found.field_start];
        match &mut self.shared {
            // The buffer of the previous shared part is reused: a batch mixing consumers does
            // not allocate per message.
            Some((kept, v2)) => {
                kept.clear();
                kept.extend_from_slice(head);
                *v2 = found.v2;
            }
            None => self.shared = Some((head.to_vec(), found.v2)),
        }
        Some(found.value)
    }

    pub fn finish(self) -> (Vec<(u64, u64)>, u64) {
        (self.counts, self.unknown)
    }

    /// What was counted so far, the counts starting again from zero (the shared part is kept).
    pub fn take(&mut self) -> (Vec<(u64, u64)>, u64) {
        (
            std::mem::take(&mut self.counts),
            std::mem::replace(&mut self.unknown, 0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered_count(ack_subject: &str) -> Option<u64> {
        delivered_count_bytes(ack_subject.as_bytes())
    }

    #[test]
    fn both_subject_forms_are_read() {
        assert_eq!(
            delivered_count("$JS.ACK.WORK.w1.3.10.7.1700000000000000000.4"),
            Some(3)
        );
        assert_eq!(
            delivered_count("$JS.ACK.hub.ACCHASH.WORK.w1.2.10.7.1700000000000000000.4.tok"),
            Some(2)
        );
        assert_eq!(
            delivered_count("$JS.ACK.hub.ACCHASH.WORK.w1.5.10.7.1700000000000000000.4"),
            Some(5)
        );
    }

    #[test]
    fn anything_else_is_none() {
        for s in [
            "",
            "_INBOX.x",
            "$JS.ACK",
            "$JS.ACK.",
            "$JS.ACK.WORK.w1.x.10.7.1.4",
            "$JS.ACK.WORK.w1.-1.10.7.1.4",
            "$JS.ACK.WORK.w1.3.10.7.1",
            "$JS.ACK.WORK.w1.3.10.7.1.4.5",
            "$JS.ACK.WORK.w1..10.7.1.4",
            "$JS.ACK.WORK.w1.99999999999999999999999.10.7.1.4",
        ] {
            assert_eq!(delivered_count(s), None, "{s}");
        }
    }

    /// The `str` split this replaced, kept as the reference.
    fn reference(ack_subject: &str) -> Option<u64> {
        let rest = ack_subject.strip_prefix("$JS.ACK.")?;
        let tokens: Vec<&str> = rest.split('.').collect();
        let field = match tokens.len() + 2 {
            9 => tokens[2],
            count if count >= 11 => tokens[4],
            _ => return None,
        };
        if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        field.parse().ok()
    }

    #[test]
    fn the_byte_reader_agrees_with_the_split_on_every_token_shape() {
        let tokens = [
            "",
            "1",
            "42",
            "x",
            "18446744073709551615",
            "18446744073709551616",
            "0",
        ];
        let mut seen = 0;
        for count in 1..=13usize {
            for pick in 0..tokens.len().pow(2) {
                let mut parts = vec!["t"; count];
                parts[2.min(count - 1)] = tokens[pick % tokens.len()];
                parts[4.min(count - 1)] = tokens[pick / tokens.len()];
                let subject = format!("$JS.ACK.{}", parts.join("."));
                assert_eq!(delivered_count(&subject), reference(&subject), "{subject}");
                seen += 1;
            }
        }
        assert!(seen > 500);
    }

    #[test]
    fn counts_are_grouped_and_sorted() {
        let subjects = [
            Some("$JS.ACK.S.c.2.1.1.1.0"),
            Some("$JS.ACK.S.c.1.2.2.1.0"),
            None,
            Some("$JS.ACK.S.c.2.3.3.1.0"),
            Some("nope"),
        ];
        let mut counts = AttemptCounts::default();
        for subject in subjects {
            counts.add_bytes(subject.map(str::as_bytes));
        }
        assert_eq!(counts.finish(), (vec![(1, 1), (2, 2)], 2));
    }

    #[test]
    fn a_take_returns_what_was_counted_since_the_last_and_starts_again() {
        let mut counts = AttemptCounts::default();
        counts.add_bytes(Some(b"$JS.ACK.S.c.2.1.1.1.0"));
        counts.add_bytes(None);
        assert_eq!(counts.take(), (vec![(2, 1)], 1));
        assert_eq!(counts.take(), (vec![], 0));
        // The shared part read before the take still reads the next subjects right.
        counts.add_bytes(Some(b"$JS.ACK.S.c.3.2.2.1.0"));
        counts.add_bytes(Some(b"$JS.ACK.S.c.x.2.2.1.0"));
        counts.add_bytes(Some(b"$JS.ACK.S.c.4.3.3.1.0.extra"));
        counts.add_bytes(Some(b"$JS.ACK.S.c.3.4.4.1.0"));
        assert_eq!(counts.take(), (vec![(3, 2)], 2));
    }

    #[test]
    fn dots_are_counted_as_a_byte_walk_counts_them() {
        let mut seed = 11u64;
        for len in 0..40 {
            for _ in 0..50 {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        [b'.', b'1', b'a', 0, 0xae, b'$'][(seed >> 33) as usize % 6]
                    })
                    .collect();
                let want = bytes.iter().filter(|&&b| b == b'.').count();
                assert_eq!(count_dots(&bytes), want, "{bytes:?}");
            }
        }
    }

    #[test]
    fn the_dot_mask_marks_exactly_the_dots() {
        for b in 0..=255u8 {
            for at in 0..8 {
                let mut bytes = [b'x'; 8];
                bytes[at] = b;
                let mask = dot_mask(u64::from_le_bytes(bytes));
                let want = if b == b'.' { 0x80u64 << (8 * at) } else { 0 };
                assert_eq!(mask, want, "byte {b} at {at}");
            }
        }
        assert_eq!(dot_mask(u64::from_le_bytes(*b"........")).count_ones(), 8);
    }

    #[test]
    fn long_subjects_agree_with_the_split() {
        // Dots on both sides of every 8-byte boundary, and more than five of them in one word.
        for pad in 0..24 {
            let name = "s".repeat(pad);
            for subject in [
                format!("$JS.ACK.{name}.c.7.1.2.3.4"),
                format!("$JS.ACK.d.{name}.s.c.12.1.2.3.4"),
                format!("$JS.ACK.d.h.s.{name}.3.1.2.3.4.tok"),
                format!("$JS.ACK.a.b.c.d.9.........{name}"),
                format!("$JS.ACK.{name}.{name}.5.6"),
            ] {
                assert_eq!(delivered_count(&subject), reference(&subject), "{subject}");
            }
        }
    }

    #[test]
    fn a_batch_reads_as_its_subjects_one_by_one() {
        // Both formats, shared parts that match another format's, missing and bad counts, in
        // random orders: the shared-part reading gives what reading each subject in full gives.
        let pool = [
            "$JS.ACK.S.C.1.10.7.1700000000000000000.4",
            "$JS.ACK.S.C.3.11.8.1700000000000000001.2",
            "$JS.ACK.S.C.x.11.8.1700000000000000001.2",
            "$JS.ACK.S.C..11.8.1700000000000000001.2",
            "$JS.ACK.S.C.2.11.8.17.2.extra",
            "$JS.ACK.S.C.S2.C2.5.1.2.3.4",
            "$JS.ACK.S.C.S2.C2.5.1.2.3.4.tok",
            "$JS.ACK.hub.H.S.C.1.10.7.1700000000000000000.4",
            "$JS.ACK.hub.H.S.C.6.10.7.1700000000000000000.4.tok",
            "$JS.ACK.hub.H.S.C.7.10.7.17.4.tok.more",
            "$JS.ACK.hub.H.S.C.8.10.7",
            "$JS.ACK.S.C.18446744073709551616.1.2.3.4",
            "_INBOX.abc",
            "$JS.ACK.S.C.1",
        ];
        let mut seed = 3u64;
        for _ in 0..2000 {
            let mut batch = AttemptCounts::default();
            let mut single = Vec::new();
            for _ in 0..(seed % 9) {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let s = pool[(seed >> 33) as usize % pool.len()];
                batch.add_bytes(Some(s.as_bytes()));
                single.push(Some(s));
            }
            let mut reference = AttemptCounts::default();
            for s in single {
                let mut fresh = AttemptCounts::default(); // no shared part: a full read
                fresh.add_bytes(s.map(str::as_bytes));
                let (counts, unknown) = fresh.finish();
                for (attempt, n) in counts {
                    for _ in 0..n {
                        reference.count(attempt);
                    }
                }
                reference.unknown += unknown;
            }
            assert_eq!(batch.finish(), reference.finish());
        }
    }

    #[test]
    fn truncations_never_panic() {
        let s = "$JS.ACK.hub.ACCHASH.WORK.w1.5.10.7.1700000000000000000.4.tok";
        for end in 0..=s.len() {
            let _ = delivered_count(&s[..end]);
        }
    }
}
