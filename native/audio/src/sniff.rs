//! Container sniffing by magic bytes and the declared-format table (§7.3 steps 1-2).

use std::fmt;

/// The containers the sidecar accepts; `as_str()` is the wire name (`PreparedAudioPcm16.container`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Container {
    Wav,
    Mp3,
    Flac,
    Ogg,
    M4a,
    Webm,
}

impl Container {
    /// Every container, in the order of the sniffing table.
    pub const ALL: [Container; 6] = [
        Container::Wav,
        Container::Flac,
        Container::Ogg,
        Container::Webm,
        Container::M4a,
        Container::Mp3,
    ];

    /// The wire name: one of `wav`, `mp3`, `flac`, `ogg`, `m4a`, `webm`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Container::Wav => "wav",
            Container::Mp3 => "mp3",
            Container::Flac => "flac",
            Container::Ogg => "ogg",
            Container::M4a => "m4a",
            Container::Webm => "webm",
        }
    }

    /// The declared format names (trimmed, lower-cased) that match this container.
    pub const fn format_names(self) -> &'static [&'static str] {
        match self {
            Container::Wav => &["wav", "wave", "audio/wav", "audio/x-wav"],
            Container::Mp3 => &["mp3", "mpeg", "mpga", "audio/mpeg"],
            Container::Flac => &["flac", "audio/flac"],
            Container::Ogg => &["ogg", "oga", "audio/ogg"],
            Container::M4a => &["m4a", "mp4", "audio/mp4", "audio/x-m4a"],
            Container::Webm => &["webm", "audio/webm"],
        }
    }
}

impl fmt::Display for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The container the magic bytes announce (first match of the §7.3 table), or None.
pub fn sniff(data: &[u8]) -> Option<Container> {
    if data.len() >= 12 && &data[0..4] == b"RIFF" && &data[8..12] == b"WAVE" {
        return Some(Container::Wav);
    }
    if data.starts_with(b"fLaC") {
        return Some(Container::Flac);
    }
    if data.starts_with(b"OggS") {
        return Some(Container::Ogg);
    }
    if data.starts_with(&[0x1A, 0x45, 0xDF, 0xA3]) {
        return Some(Container::Webm);
    }
    if data.len() >= 12 && &data[4..8] == b"ftyp" {
        return Some(Container::M4a);
    }
    if data.starts_with(b"ID3") || (data.len() >= 2 && data[0] == 0xFF && data[1] & 0xE0 == 0xE0) {
        return Some(Container::Mp3);
    }
    None
}

/// Whether a declared format (None, or trimmed empty, means "not declared") fits `container`.
/// Matching is case-insensitive; an unknown name never matches.
pub fn format_matches(declared: Option<&str>, container: Container) -> bool {
    let Some(declared) = declared.map(str::trim).filter(|s| !s.is_empty()) else {
        return true;
    };
    container
        .format_names()
        .iter()
        .any(|name| declared.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wav_header() -> Vec<u8> {
        let mut v = b"RIFF\x24\x00\x00\x00WAVEfmt ".to_vec();
        v.resize(44, 0);
        v
    }

    #[test]
    fn magic_table() {
        assert_eq!(sniff(&wav_header()), Some(Container::Wav));
        assert_eq!(sniff(b"fLaC\x00\x00\x00\x22"), Some(Container::Flac));
        assert_eq!(sniff(b"OggS\x00\x02"), Some(Container::Ogg));
        assert_eq!(
            sniff(&[0x1A, 0x45, 0xDF, 0xA3, 0x01]),
            Some(Container::Webm)
        );
        assert_eq!(sniff(b"\x00\x00\x00\x20ftypM4A \x00"), Some(Container::M4a));
        assert_eq!(sniff(b"ID3\x04\x00"), Some(Container::Mp3));
        assert_eq!(sniff(&[0xFF, 0xFB, 0x90, 0x64]), Some(Container::Mp3));
        assert_eq!(sniff(&[0xFF, 0xE0]), Some(Container::Mp3)); // top 3 bits of byte 2 set
    }

    #[test]
    fn magic_needs_enough_bytes_and_exact_positions() {
        assert_eq!(sniff(b""), None);
        assert_eq!(sniff(b"RIFF\x00\x00\x00\x00WAV"), None); // 11 bytes
        assert_eq!(sniff(b"RIFF\x00\x00\x00\x00AVI LIST"), None);
        assert_eq!(sniff(b"\x00\x00\x00ftyp"), None);
        assert_eq!(sniff(b"\x00\x00\x00\x00ftypM4A"), None); // 11 bytes
        assert_eq!(sniff(&[0xFF, 0xC0, 0x00]), None); // sync needs the top 3 bits
        assert_eq!(sniff(&[0xFF]), None);
        assert_eq!(sniff(b"fLa"), None);
        assert_eq!(sniff(b"not audio at all"), None);
        assert_eq!(sniff(b"xRIFF\x00\x00\x00WAVE"), None); // not at offset 0
    }

    #[test]
    fn first_match_wins() {
        // RIFF/WAVE also has no "ftyp" at 4, but a crafted blob could carry two magics: the
        // table order decides.
        let mut both = b"fLaCftyp".to_vec();
        both.resize(16, 0);
        assert_eq!(sniff(&both), Some(Container::Flac));
        let mut id3_ftyp = b"ID3\x00ftyp".to_vec();
        id3_ftyp.resize(16, 0);
        assert_eq!(sniff(&id3_ftyp), Some(Container::M4a));
    }

    #[test]
    fn declared_formats() {
        let table: [(Container, &[&str]); 6] = [
            (
                Container::Wav,
                &["wav", "WAVE", " audio/wav ", "audio/x-wav"],
            ),
            (Container::Mp3, &["mp3", "MPEG", "mpga", "audio/mpeg"]),
            (Container::Flac, &["flac", "Audio/FLAC"]),
            (Container::Ogg, &["ogg", "oga", "audio/ogg"]),
            (Container::M4a, &["m4a", "mp4", "audio/mp4", "audio/x-m4a"]),
            (Container::Webm, &["webm", "audio/webm"]),
        ];
        for (container, names) in table {
            for name in names {
                assert!(format_matches(Some(name), container), "{name} {container}");
                for other in Container::ALL.into_iter().filter(|c| *c != container) {
                    assert!(!format_matches(Some(name), other), "{name} {other}");
                }
            }
        }
        for c in Container::ALL {
            assert!(format_matches(None, c));
            assert!(format_matches(Some(""), c));
            assert!(format_matches(Some("  \t"), c));
            assert!(!format_matches(Some("opus"), c));
            assert!(!format_matches(Some("audio/opus"), c));
            assert!(!format_matches(Some("wav;codecs=1"), c));
        }
    }

    #[test]
    fn wire_names() {
        let names: Vec<_> = Container::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names, ["wav", "flac", "ogg", "webm", "m4a", "mp3"]);
    }
}
