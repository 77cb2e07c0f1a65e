//! The item rules of a local-ingest request (sidecar-behaviour §11), checked on the request's
//! msgpack bytes without building a value per field, and each item's bytes re-emitted with its
//! `reply_subject` replaced (or added) so the pipeline can route its result back.
//!
//! The pure-Python twin is `sie_sidecar._twins.local_items`; both give the same slots and the same
//! error text for the same input.

use crate::msgpack::{write_map_header, write_str, Reader, Token};

pub const MAX_ITEMS: usize = 4096;
pub const MEDIA_LIMIT: usize = 16 * 1024 * 1024;
pub const AUDIO_LIMIT: usize = 24 * 1024 * 1024;

/// The envelope fields every item must agree with.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    pub request_id: &'a str,
    pub endpoint: &'a str,
    pub model: &'a str,
    pub engine: &'a str,
    pub bundle_config_hash: &'a str,
    /// The body's `admission_pool`, trimmed and lowercased.
    pub admission_pool: &'a str,
    /// The lane's pool, trimmed and lowercased.
    pub lane_pool: &'a str,
}

/// One checked item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The item's bytes with `reply_subject` set (see [`check_items`]).
    pub data: Vec<u8>,
    pub item_index: u64,
    /// The item's admission pool agrees with the body's and the lane's.
    pub admitted: bool,
}

fn media_limit(key: &[u8]) -> Option<usize> {
    match key {
        b"image" | b"images" | b"document" => Some(MEDIA_LIMIT),
        b"audio" => Some(AUDIO_LIMIT),
        _ => None,
    }
}

/// How deep `item`, `query_item` and `score_items` may nest (the twin's bound too).
pub const MAX_MEDIA_DEPTH: usize = 64;

/// Every binary value under a media key (or nested inside one) within its limit; a nested key of
/// another name keeps the enclosing limit. Recursion is bounded by [`MAX_MEDIA_DEPTH`].
fn check_media(
    r: &mut Reader<'_>,
    limit: Option<usize>,
    where_: &str,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_MEDIA_DEPTH {
        return Err(format!("{where_}: nested too deeply"));
    }
    match r
        .next_token()
        .map_err(|e| format!("items are not msgpack: {e}"))?
    {
        Token::Bin(b) => {
            if let Some(max) = limit {
                if b.len() > max {
                    return Err(format!(
                        "{where_}: binary of {} bytes is over the limit of {max} bytes",
                        b.len()
                    ));
                }
            }
        }
        Token::Array(n) => {
            for _ in 0..n {
                check_media(r, limit, where_, depth + 1)?;
            }
        }
        Token::Map(n) => {
            for _ in 0..n {
                let own = match r
                    .next_token()
                    .map_err(|e| format!("items are not msgpack: {e}"))?
                {
                    Token::Str(k) => media_limit(k).or(limit),
                    Token::Array(_) | Token::Map(_) => {
                        return Err(format!(
                            "items are not msgpack: {where_} has a map key that is not a scalar"
                        ))
                    }
                    _ => limit,
                };
                check_media(r, own, where_, depth + 1)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn str_or_nil<'a>(r: &mut Reader<'a>, where_: &str, key: &str) -> Result<&'a str, String> {
    match r.next_token().map_err(|e| format!("{where_}: {e}"))? {
        Token::Nil => Ok(""),
        Token::Str(s) => {
            std::str::from_utf8(s).map_err(|_| format!("{where_}: {key} is not UTF-8"))
        }
        other => Err(format!(
            "{where_}: {key} must be a str, got {}",
            other.type_name()
        )),
    }
}

fn uint(r: &mut Reader<'_>, where_: &str, key: &str) -> Result<Option<u64>, String> {
    match r.next_token().map_err(|e| format!("{where_}: {e}"))? {
        Token::UInt(v) => Ok(Some(v)),
        Token::Int(v) if v >= 0 => Ok(Some(v as u64)),
        Token::Nil => Ok(None),
        other => Err(format!(
            "{where_}: {key} must be an unsigned int, got {}",
            other.type_name()
        )),
    }
}

/// The §11 rules over the msgpack array `items`; one [`Slot`] per item, in order. Each item's
/// `reply_subject` becomes `{reply_prefix}{slot}`, or `reply_prefix` itself when not `numbered`.
pub fn check_items(
    items: &[u8],
    rules: &Rules<'_>,
    reply_prefix: &str,
    numbered: bool,
) -> Result<Vec<Slot>, String> {
    let rid = rules.request_id;
    if rid.is_empty() {
        return Err("request_id is empty".into());
    }
    if rid.len() > 128 {
        return Err("request_id is over 128 bytes".into());
    }
    if rid.chars().any(char::is_whitespace) {
        return Err("request_id contains whitespace".into());
    }
    let mut r = Reader::new(items);
    let count = match r.next_token() {
        Ok(Token::Array(n)) => n,
        Ok(other) => {
            return Err(format!(
                "items must be a msgpack array (got {})",
                other.type_name()
            ))
        }
        Err(e) => return Err(format!("items must be a msgpack array ({e})")),
    };
    if count > MAX_ITEMS {
        return Err(format!("{count} items is over the limit of {MAX_ITEMS}"));
    }
    if count == 0 {
        if !r.is_empty() {
            return Err("items have trailing bytes after the array".into());
        }
        return Err("items is empty".into());
    }
    let mut seen = vec![false; count];
    let mut slots = Vec::with_capacity(count);
    for slot in 0..count {
        let where_ = format!("item {slot}");
        let start = r.position();
        let pairs = match r
            .next_token()
            .map_err(|e| format!("items are not msgpack: {e}"))?
        {
            Token::Map(n) => n,
            other => return Err(format!("{where_}: not a map (got {})", other.type_name())),
        };
        let body_start = r.position();
        let mut reply: Option<(usize, usize)> = None;
        let (mut request_id, mut work_item_id, mut operation) = (None, None, None);
        let (mut model_id, mut engine, mut hash, mut pool) = (None, "", "", "");
        let (mut total, mut index) = (None, None);
        let (mut has_pool_name, mut has_profile) = (false, false);
        let mut refused: Option<&'static str> = None;
        for _ in 0..pairs {
            let key = match r
                .next_token()
                .map_err(|e| format!("items are not msgpack: {e}"))?
            {
                Token::Str(k) => k,
                other => {
                    return Err(format!(
                        "{where_}: map key must be a str, got {}",
                        other.type_name()
                    ))
                }
            };
            match key {
                b"request_id" => request_id = Some(str_or_nil(&mut r, &where_, "request_id")?),
                b"work_item_id" => {
                    work_item_id = Some(str_or_nil(&mut r, &where_, "work_item_id")?)
                }
                b"operation" => operation = Some(str_or_nil(&mut r, &where_, "operation")?),
                b"model_id" => model_id = Some(str_or_nil(&mut r, &where_, "model_id")?),
                b"engine" => engine = str_or_nil(&mut r, &where_, "engine")?,
                b"bundle_config_hash" => hash = str_or_nil(&mut r, &where_, "bundle_config_hash")?,
                b"admission_pool" => pool = str_or_nil(&mut r, &where_, "admission_pool")?,
                b"pool_name" => {
                    str_or_nil(&mut r, &where_, "pool_name")?;
                    has_pool_name = true;
                }
                b"machine_profile" => {
                    str_or_nil(&mut r, &where_, "machine_profile")?;
                    has_profile = true;
                }
                b"total_items" => total = uint(&mut r, &where_, "total_items")?,
                b"item_index" => index = uint(&mut r, &where_, "item_index")?,
                b"payload_ref" | b"query_payload_ref" => {
                    let k = if key == b"payload_ref" {
                        "payload_ref"
                    } else {
                        "query_payload_ref"
                    };
                    if !str_or_nil(&mut r, &where_, k)?.is_empty() {
                        return Err(format!(
                            "{where_}: payload references are not accepted locally"
                        ));
                    }
                }
                b"reply_subject" => {
                    let at = r.position();
                    str_or_nil(&mut r, &where_, "reply_subject")?;
                    reply = Some((at, r.position()));
                }
                b"item" | b"query_item" | b"score_items" => {
                    let name = std::str::from_utf8(key).unwrap_or("item");
                    check_media(&mut r, None, &format!("{where_} {name}"), 0)?;
                }
                b"numerical_admission_sha256" | b"fallback_reason" => {
                    refused.get_or_insert(if key == b"fallback_reason" {
                        "fallback_reason"
                    } else {
                        "numerical_admission_sha256"
                    });
                    r.skip_value().map_err(|e| format!("{where_}: {e}"))?;
                }
                _ => {
                    r.skip_value().map_err(|e| format!("{where_}: {e}"))?;
                }
            }
        }
        let end = r.position();
        if request_id != Some(rid) {
            return Err(format!("{where_}: request_id differs from the request's"));
        }
        if total != Some(count as u64) {
            return Err(format!("{where_}: total_items must be {count}"));
        }
        let index = match index {
            Some(i) if i < count as u64 => i,
            _ => return Err(format!("{where_}: item_index must be below {count}")),
        };
        if seen[index as usize] {
            return Err(format!("{where_}: item_index {index} is repeated"));
        }
        seen[index as usize] = true;
        let expected_id = format!("{rid}.{index}");
        if work_item_id != Some(expected_id.as_str()) {
            return Err(format!("{where_}: work_item_id must be {rid}.{index}"));
        }
        let operation = operation.unwrap_or("");
        if operation == "load" {
            return Err(format!("{where_}: operation load is not accepted"));
        }
        if operation != rules.endpoint {
            return Err(format!("{where_}: operation differs from the endpoint"));
        }
        if model_id != Some(rules.model) {
            return Err(format!(
                "{where_}: model_id differs from the request's model"
            ));
        }
        if engine != rules.engine {
            return Err(format!("{where_}: engine differs from the request's"));
        }
        if hash != rules.bundle_config_hash {
            return Err(format!(
                "{where_}: bundle_config_hash differs from the request's"
            ));
        }
        if let Some(key) = refused {
            if operation == "encode" || operation == "score" {
                return Err(format!("{where_}: {key} is not accepted on {operation}"));
            }
        }
        if !has_pool_name || !has_profile {
            let missing = if has_pool_name {
                "machine_profile"
            } else {
                "pool_name"
            };
            return Err(format!("{where_}: missing required field {missing}"));
        }
        let own = pool.trim().to_lowercase();
        let admitted = rules.admission_pool == own
            && (rules.admission_pool.is_empty() || rules.admission_pool == rules.lane_pool);
        // Re-emit: a fresh map header, the pairs with reply_subject's value replaced (or the pair
        // appended when the item had none).
        let subject = if numbered {
            format!("{reply_prefix}{slot}")
        } else {
            reply_prefix.to_string()
        };
        let mut data = Vec::with_capacity(end - start + subject.len() + 16);
        match reply {
            Some((at, value_end)) => {
                write_map_header(&mut data, pairs);
                data.extend_from_slice(&items[body_start..at]);
                write_str(&mut data, &subject);
                data.extend_from_slice(&items[value_end..end]);
            }
            None => {
                write_map_header(&mut data, pairs + 1);
                data.extend_from_slice(&items[body_start..end]);
                write_str(&mut data, "reply_subject");
                write_str(&mut data, &subject);
            }
        }
        slots.push(Slot {
            data,
            item_index: index,
            admitted,
        });
    }
    if !r.is_empty() {
        return Err("items have trailing bytes after the array".into());
    }
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack::{write_array_header, write_bin, write_uint};

    fn rules<'a>() -> Rules<'a> {
        Rules {
            request_id: "r",
            endpoint: "encode",
            model: "m",
            engine: "",
            bundle_config_hash: "",
            admission_pool: "",
            lane_pool: "default",
        }
    }

    type Field<'a> = (&'a str, &'a dyn Fn(&mut Vec<u8>));

    fn item(index: u64, total: u64, extra: &[Field<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        write_map_header(&mut out, 8 + extra.len());
        for (k, v) in [
            ("work_item_id", format!("r.{index}")),
            ("request_id", "r".into()),
            ("operation", "encode".into()),
            ("model_id", "m".into()),
            ("pool_name", "default".into()),
            ("machine_profile", "cpu".into()),
        ] {
            write_str(&mut out, k);
            write_str(&mut out, &v);
        }
        write_str(&mut out, "item_index");
        write_uint(&mut out, index);
        write_str(&mut out, "total_items");
        write_uint(&mut out, total);
        for (k, f) in extra {
            write_str(&mut out, k);
            f(&mut out);
        }
        out
    }

    fn array(items: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        write_array_header(&mut out, items.len());
        for i in items {
            out.extend_from_slice(i);
        }
        out
    }

    #[test]
    fn good_items_get_their_reply_subject_added() {
        let items = array(&[item(0, 2, &[]), item(1, 2, &[])]);
        let slots = check_items(&items, &rules(), "_INBOX.local.1.", true).unwrap();
        assert_eq!(slots.len(), 2);
        assert!(slots[0].admitted);
        let mut r = Reader::new(&slots[1].data);
        let n = r.read_map_len("item").unwrap();
        assert_eq!(n, 9);
        let mut found = None;
        for _ in 0..n {
            let k = r.read_key().unwrap();
            if k == b"reply_subject" {
                found = Some(r.read_str("reply_subject").unwrap().to_string());
            } else {
                r.skip_value().unwrap();
            }
        }
        assert_eq!(found.as_deref(), Some("_INBOX.local.1.1"));
    }

    #[test]
    fn an_existing_reply_subject_is_replaced_in_place() {
        let set = |o: &mut Vec<u8>| write_str(o, "_INBOX.gw.r");
        let items = array(&[item(0, 1, &[("reply_subject", &set)])]);
        let slots = check_items(&items, &rules(), "_INBOX.local.9.", true).unwrap();
        let expected = item(
            0,
            1,
            &[("reply_subject", &|o: &mut Vec<u8>| {
                write_str(o, "_INBOX.local.9.0")
            })],
        );
        assert_eq!(slots[0].data, expected);
    }

    #[test]
    fn media_over_its_limit_is_refused_and_other_binaries_are_not() {
        let big = vec![0u8; MEDIA_LIMIT + 1];
        let image = |o: &mut Vec<u8>| {
            write_map_header(o, 1);
            write_str(o, "images");
            write_array_header(o, 1);
            write_map_header(o, 1);
            write_str(o, "data");
            write_bin(o, &big);
        };
        let err = check_items(
            &array(&[item(0, 1, &[("item", &image)])]),
            &rules(),
            "p.",
            true,
        )
        .unwrap_err();
        assert!(err.contains("over the limit"), "{err}");
        let blob = |o: &mut Vec<u8>| {
            write_map_header(o, 1);
            write_str(o, "blob");
            write_bin(o, &big);
        };
        assert!(check_items(
            &array(&[item(0, 1, &[("item", &blob)])]),
            &rules(),
            "p.",
            true
        )
        .is_ok());
    }

    #[test]
    fn rules_give_the_twins_messages() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (array(&[item(0, 2, &[])]), "item 0: total_items must be 1"),
            (
                array(&[item(0, 2, &[]), item(0, 2, &[])]),
                "item 1: item_index 0 is repeated",
            ),
            (
                array(&[item(3, 1, &[])]),
                "item 0: item_index must be below 1",
            ),
            (vec![0x90], "items is empty"),
            (vec![0xc1], "items must be a msgpack array"),
        ];
        for (input, want) in cases {
            let err = check_items(&input, &rules(), "p.", true).unwrap_err();
            assert!(err.starts_with(want), "{err} vs {want}");
        }
    }

    #[test]
    fn hostile_bytes_never_panic() {
        let good = array(&[item(0, 1, &[])]);
        for cut in 0..good.len() {
            let _ = check_items(&good[..cut], &rules(), "p.", true);
        }
        let mut seed: u64 = 7;
        for _ in 0..20_000 {
            let mut bytes = good.clone();
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = (seed >> 33) as usize % bytes.len();
            bytes[at] = (seed >> 17) as u8;
            let _ = check_items(&bytes, &rules(), "p.", true);
        }
    }
}
