//! Content digests: BLAKE3-256 over raw bytes, printed as 64 lowercase hex characters.

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A BLAKE3-256 digest (32 bytes) of some content.
///
/// Displayed and serialized as 64 lowercase hex characters. This is the address of a blob in the
/// CAS and the "content hash" of every artifact and input in cudarl-pipe.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Digest of an in-memory byte slice.
    pub fn of_bytes(bytes: &[u8]) -> Digest {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    /// Digest of a file's content, streamed (memory use is constant in the file size).
    ///
    /// # Errors
    /// Any I/O error opening or reading `path`.
    pub fn of_file(path: &Path) -> std::io::Result<Digest> {
        let mut file = std::fs::File::open(path)?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(Digest(*hasher.finalize().as_bytes()))
    }

    /// Lowercase hex form (64 characters).
    pub fn to_hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }

    /// Parses the 64-character hex form.
    ///
    /// # Errors
    /// Not 64 hex digits ([`ParseDigestError`] names the text).
    pub fn from_hex(s: &str) -> Result<Digest, ParseDigestError> {
        s.parse()
    }

    /// First `n` hex characters, for human-facing output.
    pub fn short(&self, n: usize) -> String {
        let mut s = self.to_hex();
        s.truncate(n.min(64));
        s
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short(12))
    }
}

/// Error for a string that is not 64 hex characters.
#[derive(Debug, thiserror::Error)]
#[error("not a 64-character hex digest: {0:?}")]
pub struct ParseDigestError(pub String);

impl FromStr for Digest {
    type Err = ParseDigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        blake3::Hash::from_hex(s)
            .map(|h| Digest(*h.as_bytes()))
            .map_err(|_| ParseDigestError(s.to_string()))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_known_value() {
        // BLAKE3 of the empty input, from the BLAKE3 reference test vectors.
        let d = Digest::of_bytes(b"");
        assert_eq!(
            d.to_hex(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        let back: Digest = d.to_hex().parse().unwrap();
        assert_eq!(back, d);
        assert!("xyz".parse::<Digest>().is_err());
    }

    #[test]
    fn file_digest_equals_bytes_digest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        assert_eq!(Digest::of_file(&p).unwrap(), Digest::of_bytes(&data));
    }
}
