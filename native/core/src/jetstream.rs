//! JetStream ACK subjects: how many times a message has been delivered, read from the reply
//! subject the server put on it, so a pulled batch's delivery attempts are counted without a
//! `Msg.metadata` object per message.

/// The delivery count in a JetStream ACK subject, or `None` when it is not one.
///
/// v1: `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` (9 tokens);
/// v2: `$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]`
/// (11 or more tokens). Read in one pass and without UTF-8 validation (the field it reads is
/// ASCII digits or nothing): it runs once per pulled message, and the `str` split it replaced
/// cost ~800 instructions a subject (docs/benchmarks.md).
pub fn delivered_count_bytes(ack_subject: &[u8]) -> Option<u64> {
    let rest = ack_subject.strip_prefix(b"$JS.ACK.")?;
    // Where the tokens after the prefix end: the first five dots, and how many tokens in all.
    let mut dots = [0usize; 5];
    let mut n = 1usize;
    for (i, &b) in rest.iter().enumerate() {
        if b == b'.' {
            if n <= dots.len() {
                dots[n - 1] = i;
            }
            n += 1;
        }
    }
    let token = |k: usize| -> &[u8] {
        let start = if k == 0 { 0 } else { dots[k - 1] + 1 };
        let end = if k < n - 1 { dots[k] } else { rest.len() };
        &rest[start..end]
    };
    let field = match n + 2 {
        9 => token(2),
        count if count >= 11 => token(4),
        _ => return None,
    };
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

/// A batch's delivery counts, message by message: `(attempt, messages)` pairs kept ascending, and
/// how many subjects were not ACK subjects. Nothing is allocated per message.
#[derive(Debug, Default)]
pub struct AttemptCounts {
    counts: Vec<(u64, u64)>,
    unknown: u64,
}

impl AttemptCounts {
    /// One message's ACK subject, read where it lies (None: it has none).
    pub fn add_bytes(&mut self, subject: Option<&[u8]>) {
        match subject.and_then(delivered_count_bytes) {
            Some(attempt) => match self.counts.binary_search_by_key(&attempt, |&(a, _)| a) {
                Ok(i) => self.counts[i].1 += 1,
                Err(i) => self.counts.insert(i, (attempt, 1)),
            },
            None => self.unknown += 1,
        }
    }

    pub fn finish(self) -> (Vec<(u64, u64)>, u64) {
        (self.counts, self.unknown)
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
    fn truncations_never_panic() {
        let s = "$JS.ACK.hub.ACCHASH.WORK.w1.5.10.7.1700000000000000000.4.tok";
        for end in 0..=s.len() {
            let _ = delivered_count(&s[..end]);
        }
    }
}
