//! JetStream ACK subjects: how many times a message has been delivered, read from the reply
//! subject the server put on it, so a pulled batch's delivery attempts are counted without a
//! `Msg.metadata` object per message.

/// The delivery count in a JetStream ACK subject, or `None` when it is not one.
///
/// v1: `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` (9 tokens);
/// v2: `$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]`
/// (11 or more tokens).
pub fn delivered_count(ack_subject: &str) -> Option<u64> {
    let rest = ack_subject.strip_prefix("$JS.ACK.")?;
    let mut tokens = [""; 10];
    let mut n = 0;
    for token in rest.split('.') {
        if n < tokens.len() {
            tokens[n] = token;
        }
        n += 1;
    }
    let field = match n + 2 {
        9 => tokens[2],
        count if count >= 11 => tokens[4],
        _ => return None,
    };
    if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    field.parse().ok()
}

/// A batch's delivery counts as `(attempt, messages)` pairs, ascending, plus how many subjects were
/// not ACK subjects.
pub fn attempt_counts<'a>(
    subjects: impl IntoIterator<Item = Option<&'a str>>,
) -> (Vec<(u64, u64)>, u64) {
    let mut counts: Vec<(u64, u64)> = Vec::new();
    let mut unknown = 0;
    for subject in subjects {
        match subject.and_then(delivered_count) {
            Some(attempt) => match counts.binary_search_by_key(&attempt, |&(a, _)| a) {
                Ok(i) => counts[i].1 += 1,
                Err(i) => counts.insert(i, (attempt, 1)),
            },
            None => unknown += 1,
        }
    }
    (counts, unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn counts_are_grouped_and_sorted() {
        let subjects = [
            Some("$JS.ACK.S.c.2.1.1.1.0"),
            Some("$JS.ACK.S.c.1.2.2.1.0"),
            None,
            Some("$JS.ACK.S.c.2.3.3.1.0"),
            Some("nope"),
        ];
        assert_eq!(attempt_counts(subjects), (vec![(1, 1), (2, 2)], 2));
    }

    #[test]
    fn truncations_never_panic() {
        let s = "$JS.ACK.hub.ACCHASH.WORK.w1.5.10.7.1700000000000000000.4.tok";
        for end in 0..=s.len() {
            let _ = delivered_count(&s[..end]);
        }
    }
}
