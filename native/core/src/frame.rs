//! IPC framing: a 4-byte big-endian length, then one msgpack body (wire-protocol §1.1).
//!
//! The splitter is incremental: it is fed whatever a socket read returned and reports complete
//! bodies either as ranges of the current input (no copy needed) or, for a body that spanned
//! several reads, as a buffer that was allocated once at its declared length.

use std::fmt;

/// Body ceiling in either direction: 32 MiB.
pub const MAX_FRAME: usize = 32 * 1024 * 1024;
pub const HEADER_LEN: usize = 4;

/// A declared or encoded body over the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTooLarge {
    pub declared: u64,
    pub limit: usize,
}

impl fmt::Display for FrameTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPC frame body of {} bytes exceeds the {} byte limit",
            self.declared, self.limit
        )
    }
}

impl std::error::Error for FrameTooLarge {}

/// One complete body found by [`FrameSplitter::feed`].
#[derive(Debug, PartialEq, Eq)]
pub enum Body {
    /// `input[start..end]` of the slice passed to this `feed` call.
    InInput { start: usize, end: usize },
    /// A body assembled across reads (allocated once at its declared length).
    Assembled(Vec<u8>),
}

/// Incremental frame splitter.
#[derive(Debug)]
pub struct FrameSplitter {
    max_body: usize,
    header: [u8; HEADER_LEN],
    header_len: usize,
    partial: Option<Vec<u8>>,
    expected: usize,
    failed: Option<FrameTooLarge>,
}

impl FrameSplitter {
    pub fn new(max_body: usize) -> Self {
        Self {
            max_body,
            header: [0; HEADER_LEN],
            header_len: 0,
            partial: None,
            expected: 0,
            failed: None,
        }
    }

    /// Bytes held for a frame that is not complete yet.
    pub fn buffered(&self) -> usize {
        self.header_len + self.partial.as_ref().map_or(0, |p| HEADER_LEN + p.len())
    }

    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// Feed one read. Complete bodies are appended to `out` in stream order.
    ///
    /// After a `FrameTooLarge` the stream is desynchronised: every later call fails the same way.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<Body>) -> Result<(), FrameTooLarge> {
        if let Some(err) = self.failed {
            return Err(err);
        }
        let mut pos = 0;
        while pos < input.len() {
            if let Some(partial) = self.partial.as_mut() {
                let want = self.expected - partial.len();
                let take = want.min(input.len() - pos);
                partial.extend_from_slice(&input[pos..pos + take]);
                pos += take;
                if partial.len() == self.expected {
                    out.push(Body::Assembled(self.partial.take().unwrap_or_default()));
                }
                continue;
            }
            // Collect the header, possibly across reads.
            let take = (HEADER_LEN - self.header_len).min(input.len() - pos);
            self.header[self.header_len..self.header_len + take]
                .copy_from_slice(&input[pos..pos + take]);
            self.header_len += take;
            pos += take;
            if self.header_len < HEADER_LEN {
                break;
            }
            self.header_len = 0;
            let declared = match declared_len(self.header, self.max_body) {
                Ok(len) => len,
                Err(err) => {
                    self.failed = Some(err);
                    return Err(err);
                }
            };
            if input.len() - pos >= declared {
                out.push(Body::InInput {
                    start: pos,
                    end: pos + declared,
                });
                pos += declared;
            } else {
                let mut partial = Vec::with_capacity(declared);
                partial.extend_from_slice(&input[pos..]);
                pos = input.len();
                self.expected = declared;
                self.partial = Some(partial);
            }
        }
        Ok(())
    }
}

/// The body length a frame header declares; `FrameTooLarge` over `max_body`.
pub fn declared_len(header: [u8; HEADER_LEN], max_body: usize) -> Result<usize, FrameTooLarge> {
    let declared = u32::from_be_bytes(header) as usize;
    if declared > max_body {
        return Err(FrameTooLarge {
            declared: declared as u64,
            limit: max_body,
        });
    }
    Ok(declared)
}

/// Prefix `body` with its length, refusing bodies over `MAX_FRAME` before writing anything.
pub fn encode_frame(body: &[u8]) -> Result<Vec<u8>, FrameTooLarge> {
    check_len(body.len())?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    Ok(out)
}

pub fn check_len(len: usize) -> Result<(), FrameTooLarge> {
    if len > MAX_FRAME {
        Err(FrameTooLarge {
            declared: len as u64,
            limit: MAX_FRAME,
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(bodies: &[&[u8]]) -> Vec<u8> {
        bodies
            .iter()
            .flat_map(|b| encode_frame(b).unwrap())
            .collect()
    }

    fn bodies_of(input: &[u8], out: Vec<Body>) -> Vec<Vec<u8>> {
        out.into_iter()
            .map(|b| match b {
                Body::InInput { start, end } => input[start..end].to_vec(),
                Body::Assembled(v) => v,
            })
            .collect()
    }

    #[test]
    fn many_frames_in_one_read() {
        let input = frames(&[b"a", b"", b"hello"]);
        let mut s = FrameSplitter::new(MAX_FRAME);
        let mut out = Vec::new();
        s.feed(&input, &mut out).unwrap();
        assert_eq!(
            bodies_of(&input, out),
            vec![b"a".to_vec(), vec![], b"hello".to_vec()]
        );
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn every_split_point_gives_the_same_bodies() {
        let input = frames(&[b"first body", b"x", b"third"]);
        for cut in 0..=input.len() {
            let mut s = FrameSplitter::new(MAX_FRAME);
            let mut got = Vec::new();
            for part in [&input[..cut], &input[cut..]] {
                let mut out = Vec::new();
                s.feed(part, &mut out).unwrap();
                got.extend(bodies_of(part, out));
            }
            assert_eq!(
                got,
                vec![b"first body".to_vec(), b"x".to_vec(), b"third".to_vec()]
            );
        }
    }

    #[test]
    fn byte_at_a_time() {
        let input = frames(&[b"abc", b"defg"]);
        let mut s = FrameSplitter::new(MAX_FRAME);
        let mut got = Vec::new();
        for b in &input {
            let mut out = Vec::new();
            s.feed(std::slice::from_ref(b), &mut out).unwrap();
            got.extend(bodies_of(std::slice::from_ref(b), out));
        }
        assert_eq!(got, vec![b"abc".to_vec(), b"defg".to_vec()]);
    }

    #[test]
    fn oversize_declared_length_fails_and_stays_failed() {
        let mut out = Vec::new();
        let mut at_limit = FrameSplitter::new(MAX_FRAME);
        assert!(at_limit.feed(&[0x02, 0x00, 0x00, 0x00], &mut out).is_ok());
        assert_eq!(at_limit.buffered(), 4);
        let mut s = FrameSplitter::new(MAX_FRAME);
        let err = s.feed(&[0x02, 0x00, 0x00, 0x01], &mut out).unwrap_err();
        assert_eq!(err.declared, 33_554_433);
        assert!(s.feed(b"", &mut out).is_err());
    }

    #[test]
    fn encoder_limit_is_inclusive() {
        assert!(check_len(MAX_FRAME).is_ok());
        assert!(check_len(MAX_FRAME + 1).is_err());
    }
}
