//! Sealed transfer frames: the transfer connection authenticated (and optionally encrypted)
//! per frame, under a secret that never crosses it (I11), as the alternative to TLS on the
//! stream.
//!
//! - Decode holds a random [`SealMaster`]. Each grant's secret is an HMAC-SHA-256 of the grant
//!   key under it ([`SealMaster::grant`]); decode hands it to the router inside the grant over
//!   mutual-TLS gRPC, and the router to prefill. The receiver derives it again from the key in
//!   the frame, so no table of secrets is kept.
//! - A sealing listener opens each connection with a HELLO carrying 16 random bytes. The frame
//!   key of a grant on that connection is an HMAC of the grant secret over the challenge and
//!   the mode: a frame recorded on one connection does not verify on another.
//! - Every sender → receiver frame carries an AES-128-GCM tag under that key, with the frame
//!   type and the connection's frame counter as the nonce: a frame replayed, dropped or
//!   reordered within the connection does not verify either.
//! - [`SealMode::Aead`] encrypts a WRITE's page bytes and authenticates its fields;
//!   [`SealMode::Mac`] authenticates fields and page bytes, leaving the bytes in clear (GMAC).
//!
//! A frame that fails its check closes the connection before any of it reaches the pool.

use std::collections::HashMap;
use std::fmt;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
use ring::hmac;

pub use pagewarden_types::seal_mode::SealMode;

use crate::frame::{FrameError, FrameType, Header, CHALLENGE_LEN, WRITE_FIXED_LEN};
use crate::types::GrantKey;

/// Bytes of a seal's tag after a sealed frame's payload.
pub const TAG_LEN: usize = 16;

/// Bytes of a grant's seal secret.
pub const SECRET_LEN: usize = 32;

/// Decode's secret, from which every grant's seal secret is derived. Random per process:
/// grants do not outlive it.
#[derive(Clone)]
pub struct SealMaster(hmac::Key);

impl SealMaster {
    /// A fresh random master.
    pub fn random() -> Self {
        Self::from_bytes(&rand::random::<[u8; SECRET_LEN]>())
    }

    /// A master from fixed bytes (tests).
    pub fn from_bytes(b: &[u8; SECRET_LEN]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, b))
    }

    /// The seal of grant `key`.
    pub fn grant(&self, mode: SealMode, key: GrantKey) -> GrantSeal {
        let mut msg = Vec::with_capacity(32);
        msg.extend_from_slice(b"pagewarden grant seal v1\0");
        msg.extend_from_slice(&key.0);
        let tag = hmac::sign(&self.0, &msg);
        let secret = tag.as_ref().try_into().expect("HMAC-SHA-256 is 32 bytes");
        GrantSeal { mode, secret }
    }
}

impl fmt::Debug for SealMaster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealMaster(..)")
    }
}

/// One grant's seal: its mode and secret, as the sender receives it inside the grant.
#[derive(Clone, PartialEq, Eq)]
pub struct GrantSeal {
    /// What the seal protects.
    pub mode: SealMode,
    secret: [u8; SECRET_LEN],
}

impl GrantSeal {
    /// A seal from its parts (the grant as received).
    pub fn new(mode: SealMode, secret: [u8; SECRET_LEN]) -> Self {
        Self { mode, secret }
    }

    /// The secret, to put in the grant.
    pub fn secret(&self) -> &[u8; SECRET_LEN] {
        &self.secret
    }

    /// The frame key of this grant on the connection that sent `challenge`.
    pub(crate) fn on_connection(&self, challenge: &[u8; CHALLENGE_LEN]) -> FrameSealer {
        let k = hmac::Key::new(hmac::HMAC_SHA256, &self.secret);
        let mut msg = Vec::with_capacity(48);
        msg.extend_from_slice(b"pagewarden frame seal v1\0");
        msg.extend_from_slice(challenge);
        msg.push(self.mode.flag() as u8);
        let okm = hmac::sign(&k, &msg);
        let key = UnboundKey::new(&AES_128_GCM, &okm.as_ref()[..16]).expect("16-byte AES key");
        FrameSealer {
            key: LessSafeKey::new(key),
            mode: self.mode,
        }
    }
}

impl fmt::Debug for GrantSeal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GrantSeal({}, ..)", self.mode)
    }
}

/// A grant's frame key on one connection.
pub(crate) struct FrameSealer {
    key: LessSafeKey,
    mode: SealMode,
}

/// The nonce of the `counter`-th frame of a connection, of type `t`.
fn nonce(t: FrameType, counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[0] = t as u8;
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

impl FrameSealer {
    /// What this key's seal protects.
    pub(crate) fn mode(&self) -> SealMode {
        self.mode
    }

    /// Bytes of a payload of type `t` and `len` bytes that stay in clear: a WRITE's fields
    /// under AEAD, everything else.
    pub(crate) fn clear_len(&self, t: FrameType, len: usize) -> usize {
        match (self.mode, t) {
            (SealMode::Aead, FrameType::Write) => WRITE_FIXED_LEN.min(len),
            _ => len,
        }
    }

    /// Seals the `counter`-th frame of the connection: authenticates `clear` and encrypts
    /// `secret` in place; the tag goes after both on the wire.
    pub(crate) fn seal(
        &self,
        t: FrameType,
        counter: u64,
        clear: &[u8],
        secret: &mut [u8],
    ) -> [u8; TAG_LEN] {
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(t, counter), Aad::from(clear), secret)
            .expect("a frame is far below AES-GCM's length limit");
        tag.as_ref().try_into().expect("16-byte tag")
    }

    /// Checks and strips the tag of the `counter`-th frame, `payload` being its payload and
    /// tag; decrypts what [`Self::seal`] encrypted. Returns the payload's length.
    fn open(&self, t: FrameType, counter: u64, payload: &mut [u8]) -> Result<usize, FrameError> {
        let len = payload
            .len()
            .checked_sub(TAG_LEN)
            .ok_or(FrameError::Truncated)?;
        let (clear, rest) = payload.split_at_mut(self.clear_len(t, len));
        self.key
            .open_in_place(nonce(t, counter), Aad::from(&*clear), rest)
            .map_err(|_| FrameError::BadSeal(t))?;
        Ok(len)
    }
}

/// What a sealing listener requires of its connections.
#[derive(Clone, Debug)]
pub struct SealPolicy {
    /// The mode every frame must be sealed with.
    pub mode: SealMode,
    /// Decode's master, to derive each grant's secret.
    pub master: SealMaster,
}

/// Frame keys derived on one connection, at most this many at once.
const CACHED_KEYS: usize = 64;

/// The receiving side of one sealed connection: its challenge, frame counter and the frame
/// keys of the grants seen on it.
pub(crate) struct ConnectionSeal {
    policy: SealPolicy,
    challenge: [u8; CHALLENGE_LEN],
    counter: u64,
    keys: HashMap<GrantKey, FrameSealer>,
}

impl ConnectionSeal {
    /// A connection under `policy`, with a fresh challenge.
    pub(crate) fn new(policy: SealPolicy) -> Self {
        Self {
            policy,
            challenge: rand::random(),
            counter: 0,
            keys: HashMap::new(),
        }
    }

    /// The challenge the HELLO carries.
    pub(crate) fn challenge(&self) -> &[u8; CHALLENGE_LEN] {
        &self.challenge
    }

    /// Checks the next frame's seal and strips it from `buf` (the frame's wire payload),
    /// leaving the payload [`crate::frame::decode_payload`] reads.
    pub(crate) fn open(&mut self, h: &Header, buf: &mut Vec<u8>) -> Result<(), FrameError> {
        if h.seal != Some(self.policy.mode) {
            return Err(FrameError::NotSealed {
                got: h.seal,
                want: self.policy.mode,
            });
        }
        // Every frame a sender may send starts with its grant key.
        let key = buf
            .first_chunk::<16>()
            .map(|k| GrantKey(*k))
            .ok_or(FrameError::Truncated)?;
        if !self.keys.contains_key(&key) && self.keys.len() >= CACHED_KEYS {
            self.keys.clear();
        }
        let (policy, challenge) = (&self.policy, &self.challenge);
        let sealer = self.keys.entry(key).or_insert_with(|| {
            policy
                .master
                .grant(policy.mode, key)
                .on_connection(challenge)
        });
        let len = sealer.open(h.frame_type, self.counter, buf)?;
        self.counter += 1;
        buf.truncate(len);
        if h.frame_type == FrameType::Drain {
            self.keys.remove(&key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_header, encode, encode_write_prefix, mark_sealed, Frame};
    use crate::frame::{BatchId, WriteFrame, HEADER_LEN};
    use crate::types::{Generation, PageId};

    const KEY: GrantKey = GrantKey([3; 16]);

    /// A sealed WRITE of `data`, as the TCP sender builds it: header and fields, the page
    /// bytes (encrypted under AEAD), the tag.
    fn sealed_write(seal: &GrantSeal, challenge: &[u8; 16], counter: u64, data: &[u8]) -> Vec<u8> {
        let w = WriteFrame {
            key: KEY,
            batch: BatchId(1),
            page: PageId(2),
            generation: Generation(3),
            tokens: 4,
            checksum: 5,
            data,
        };
        let mut out = Vec::new();
        encode_write_prefix(&mut out, &w);
        mark_sealed(&mut out, seal.mode);
        let s = seal.on_connection(challenge);
        let mut body = data.to_vec();
        let tag = match seal.mode {
            SealMode::Aead => s.seal(FrameType::Write, counter, &out[HEADER_LEN..], &mut body),
            SealMode::Mac => {
                let mut aad = out[HEADER_LEN..].to_vec();
                aad.extend_from_slice(data);
                s.seal(FrameType::Write, counter, &aad, &mut [])
            }
        };
        out.extend_from_slice(&body);
        out.extend_from_slice(&tag);
        out
    }

    fn open(conn: &mut ConnectionSeal, frame: &[u8]) -> Result<Vec<u8>, FrameError> {
        let h = decode_header(frame[..HEADER_LEN].try_into().unwrap(), 1 << 20)?;
        let mut buf = frame[HEADER_LEN..].to_vec();
        assert_eq!(buf.len(), h.wire_len());
        conn.open(&h, &mut buf)?;
        Ok(buf)
    }

    #[test]
    fn a_sealed_frame_opens_once_on_its_connection_and_nowhere_else() {
        let master = SealMaster::from_bytes(&[9; 32]);
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        for mode in [SealMode::Mac, SealMode::Aead] {
            let policy = SealPolicy {
                mode,
                master: master.clone(),
            };
            let mut conn = ConnectionSeal::new(policy.clone());
            let seal = master.grant(mode, KEY);
            let f0 = sealed_write(&seal, conn.challenge(), 0, &data);
            let f1 = sealed_write(&seal, conn.challenge(), 1, &data);
            // Under AEAD the page bytes on the wire are not the page.
            let on_wire = &f0[HEADER_LEN + WRITE_FIXED_LEN..][..data.len()];
            assert_eq!(on_wire == &data[..], mode == SealMode::Mac, "{mode}");
            let p = open(&mut conn, &f0).unwrap();
            assert_eq!(
                &p[WRITE_FIXED_LEN..],
                &data[..],
                "{mode}: opened to the page"
            );
            // The same frame again (a replay) is checked against the next counter.
            assert_eq!(
                open(&mut conn, &f0).unwrap_err(),
                FrameError::BadSeal(FrameType::Write)
            );
            // The frame that was sealed as the second one still opens as the second.
            assert_eq!(&open(&mut conn, &f1).unwrap()[WRITE_FIXED_LEN..], &data[..]);
            // Another connection (another challenge) refuses both.
            let mut other = ConnectionSeal::new(policy.clone());
            assert!(open(&mut other, &f0).is_err(), "{mode}: replay elsewhere");
            // A flipped page byte, a flipped field (the token count), a wrong grant secret.
            let mut conn = ConnectionSeal::new(policy.clone());
            let f0 = sealed_write(&seal, conn.challenge(), 0, &data);
            for at in [
                HEADER_LEN + WRITE_FIXED_LEN + 100,
                HEADER_LEN + 16 + 8 + 4 + 8,
            ] {
                let mut bad = f0.clone();
                bad[at] ^= 1;
                assert_eq!(
                    open(&mut clone_conn(&conn), &bad).unwrap_err(),
                    FrameError::BadSeal(FrameType::Write),
                    "{mode}: byte {at} altered"
                );
            }
            let forged = sealed_write(
                &SealMaster::from_bytes(&[8; 32]).grant(mode, KEY),
                conn.challenge(),
                0,
                &data,
            );
            assert!(
                open(&mut clone_conn(&conn), &forged).is_err(),
                "{mode}: forged"
            );
            assert!(open(&mut conn, &f0).is_ok());
            // Other frames: sealed BATCH_END verifies at its counter; an unsealed one is
            // refused, as is one sealed the other way.
            let mut end = Vec::new();
            encode(
                &mut end,
                &Frame::BatchEnd {
                    key: KEY,
                    batch: BatchId(1),
                    pages: 1,
                },
            );
            assert!(matches!(
                open(&mut clone_conn(&conn), &end),
                Err(FrameError::NotSealed { got: None, .. })
            ));
            let clear = end.clone();
            mark_sealed(&mut end, mode);
            let tag = seal.on_connection(conn.challenge()).seal(
                FrameType::BatchEnd,
                1,
                &clear[HEADER_LEN..],
                &mut [],
            );
            end.extend_from_slice(&tag);
            let mut wrong = end.clone();
            let other_mode = match mode {
                SealMode::Mac => SealMode::Aead,
                SealMode::Aead => SealMode::Mac,
            };
            wrong[6..8].copy_from_slice(&other_mode.flag().to_le_bytes());
            assert!(matches!(
                open(&mut clone_conn(&conn), &wrong),
                Err(FrameError::NotSealed { .. })
            ));
            assert_eq!(open(&mut conn, &end).unwrap(), clear[HEADER_LEN..]);
        }
    }

    fn clone_conn(c: &ConnectionSeal) -> ConnectionSeal {
        ConnectionSeal {
            policy: c.policy.clone(),
            challenge: c.challenge,
            counter: c.counter,
            keys: HashMap::new(),
        }
    }

    #[test]
    fn grant_secrets_differ_per_grant_and_master_and_never_print() {
        let m = SealMaster::from_bytes(&[1; 32]);
        let a = m.grant(SealMode::Aead, GrantKey([1; 16]));
        assert_eq!(a, m.grant(SealMode::Aead, GrantKey([1; 16])));
        assert_ne!(
            a.secret(),
            m.grant(SealMode::Aead, GrantKey([2; 16])).secret()
        );
        let other = SealMaster::from_bytes(&[2; 32]).grant(SealMode::Aead, GrantKey([1; 16]));
        assert_ne!(a.secret(), other.secret());
        assert_eq!(format!("{a:?}"), "GrantSeal(aead, ..)");
        assert_eq!(format!("{m:?}"), "SealMaster(..)");
    }
}
