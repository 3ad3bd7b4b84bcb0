//! The rendezvous wire format: a frame is a 24-byte [`Header`] followed by `len` payload bytes,
//! with `fds` file descriptors travelling beside it as `SCM_RIGHTS`. The header goes over the
//! socket as a `#[repr(C)]` Pod struct in the host's byte order (both ends are processes of one
//! host). Decoding is pure: [`Header::decode`] bounds the payload before anyone allocates it and
//! [`Frame::new`] checks what arrived against what the header announced. The socket code
//! (`rendezvous.rs`) is these two steps around its reads, and [`decode`] is the same two steps
//! over a byte slice, which is how `tests/fuzz_frames.rs` drives the decoder without a socket.

use std::os::fd::OwnedFd;

use bytemuck::{Pod, Zeroable};

/// The first four bytes of every frame.
pub const MAGIC: u32 = u32::from_le_bytes(*b"MMoE");
/// Bytes of a frame's header.
pub const HEADER_BYTES: usize = size_of::<Wire>();
/// Most file descriptors one frame carries (Linux allows 253 per message).
pub const MAX_FDS_PER_FRAME: usize = 64;
/// Largest payload of one frame.
pub const MAX_PAYLOAD_BYTES: usize = 16 << 20;

#[repr(u16)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A rank's first frame: its rank in the header, the world size as the payload.
    Hello = 1,
    /// One rank's contribution to a collective.
    Data = 2,
    /// Rank 0 gives up on a collective; the payload says why.
    Abort = 3,
}

impl Kind {
    fn from_wire(kind: u16) -> Result<Kind, FrameError> {
        match kind {
            1 => Ok(Kind::Hello),
            2 => Ok(Kind::Data),
            3 => Ok(Kind::Abort),
            k => Err(FrameError::Kind(k)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    /// Whose contribution this is.
    pub rank: u16,
    /// The collective's number: 1 for the rendezvous itself, then one more per collective.
    pub seq: u64,
    /// Payload bytes that follow the header.
    pub len: u32,
    /// File descriptors that travel with the frame.
    pub fds: u32,
}

/// The header as it travels; the Pod derive proves it has no padding.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Wire {
    magic: u32,
    kind: u16,
    rank: u16,
    seq: u64,
    len: u32,
    fds: u32,
}

/// Why bytes (and descriptors) received from a peer are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not a megamoe world frame (magic {0:#010x})")]
    Magic(u32),
    #[error("unknown frame kind {0}")]
    Kind(u16),
    #[error(
        "frame of {len} bytes and {fds} fds exceeds the limits ({MAX_PAYLOAD_BYTES} bytes, \
         {MAX_FDS_PER_FRAME} fds)"
    )]
    TooLarge { len: u32, fds: u32 },
    #[error("{0} bytes are shorter than a frame header ({HEADER_BYTES} bytes)")]
    Short(usize),
    #[error("the frame announced {announced} payload bytes but carried {carried}")]
    Payload { announced: u32, carried: usize },
    #[error("the frame announced {announced} fds but carried {carried}")]
    Fds { announced: u32, carried: usize },
    #[error("file descriptors were truncated (more than {MAX_FDS_PER_FRAME} sent)")]
    FdsTruncated,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        bytemuck::cast(Wire {
            magic: MAGIC,
            kind: self.kind as u16,
            rank: self.rank,
            seq: self.seq,
            len: self.len,
            fds: self.fds,
        })
    }

    /// The header in `bytes`, refused unless its magic and kind are known and its payload and fd
    /// counts are within the limits (so `len` is safe to allocate).
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> Result<Header, FrameError> {
        let wire: Wire = bytemuck::pod_read_unaligned(bytes);
        if wire.magic != MAGIC {
            return Err(FrameError::Magic(wire.magic));
        }
        let kind = Kind::from_wire(wire.kind)?;
        if wire.len as usize > MAX_PAYLOAD_BYTES || wire.fds as usize > MAX_FDS_PER_FRAME {
            return Err(FrameError::TooLarge {
                len: wire.len,
                fds: wire.fds,
            });
        }
        Ok(Header {
            kind,
            rank: wire.rank,
            seq: wire.seq,
            len: wire.len,
            fds: wire.fds,
        })
    }
}

/// One received frame.
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Frame {
    /// The frame of `header` with what arrived after it, refused unless that is exactly the
    /// payload length and fd count the header announced.
    pub fn new(header: Header, payload: Vec<u8>, fds: Vec<OwnedFd>) -> Result<Frame, FrameError> {
        if payload.len() != header.len as usize {
            return Err(FrameError::Payload {
                announced: header.len,
                carried: payload.len(),
            });
        }
        if fds.len() != header.fds as usize {
            return Err(FrameError::Fds {
                announced: header.fds,
                carried: fds.len(),
            });
        }
        Ok(Frame {
            header,
            payload,
            fds,
        })
    }
}

/// The frame whose header and payload are `bytes`, received with `fds`.
pub fn decode(bytes: &[u8], fds: Vec<OwnedFd>) -> Result<Frame, FrameError> {
    let (head, payload) = bytes
        .split_first_chunk::<HEADER_BYTES>()
        .ok_or(FrameError::Short(bytes.len()))?;
    Frame::new(Header::decode(head)?, payload.to_vec(), fds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_bad_ones_are_refused() {
        let h = Header {
            kind: Kind::Data,
            rank: 71,
            seq: 1 << 40,
            len: 12,
            fds: 3,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut bad = h.encode();
        bad[0] ^= 1;
        let err = Header::decode(&bad).unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
        let mut bad = h.encode();
        bad[4] = 9;
        assert_eq!(Header::decode(&bad), Err(FrameError::Kind(9)));
        let too_many = Header {
            fds: MAX_FDS_PER_FRAME as u32 + 1,
            ..h
        };
        assert!(matches!(
            Header::decode(&too_many.encode()),
            Err(FrameError::TooLarge { .. })
        ));
        assert_eq!(
            decode(&bad[..23], Vec::new()).unwrap_err(),
            FrameError::Short(23)
        );
        assert_eq!(
            decode(&h.encode(), Vec::new()).unwrap_err(),
            FrameError::Payload {
                announced: 12,
                carried: 0
            }
        );
    }
}
