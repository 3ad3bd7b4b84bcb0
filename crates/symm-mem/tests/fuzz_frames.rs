//! Fuzzing of the rendezvous frame decoder (`world::frame`), without sockets: valid frames round
//! trip, and arbitrary or mutated bytes with any number of descriptors decode to exactly what an
//! independent reading of the wire format says — a frame or the typed error for the first thing
//! wrong — never a panic, and never an allocation larger than the bytes given.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::time::Duration;

use fuzz_harness::{LargestAllocation, fuzz};
use proptest::prelude::*;
use symm_mem::world::frame::{
    self, FrameError, HEADER_BYTES, Header, Kind, MAGIC, MAX_FDS_PER_FRAME, MAX_PAYLOAD_BYTES,
};

#[global_allocator]
static ALLOC: LargestAllocation = LargestAllocation;

/// Each target's wall-clock budget; a run of each is a few seconds on one core.
const BUDGET: Duration = Duration::from_secs(30);

/// `n` descriptors of one open file (what arrived with a frame, as far as the decoder knows).
fn fds(n: usize) -> Vec<OwnedFd> {
    let file = OwnedFd::from(File::open("/dev/null").expect("/dev/null opens"));
    (0..n)
        .map(|_| file.try_clone().expect("dup succeeds"))
        .collect()
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Hello), Just(Kind::Data), Just(Kind::Abort)]
}

/// Any header the encoder may send, with a payload length of at most `max_len`.
fn header(max_len: u32) -> impl Strategy<Value = Header> {
    (
        kind(),
        any::<u16>(),
        any::<u64>(),
        0..=max_len,
        0..=MAX_FDS_PER_FRAME as u32,
    )
        .prop_map(|(kind, rank, seq, len, fds)| Header {
            kind,
            rank,
            seq,
            len,
            fds,
        })
}

/// What decoding `bytes` with `fds` descriptors must give, read off the layout documented in
/// `world::frame` field by field: the header on success, else the first error.
fn expected(bytes: &[u8], fds: usize) -> Result<Header, FrameError> {
    let Some((head, payload)) = bytes.split_first_chunk::<HEADER_BYTES>() else {
        return Err(FrameError::Short(bytes.len()));
    };
    let field = |at: usize, n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&head[at..at + n]);
        u64::from_ne_bytes(b)
    };
    let (magic, kind, rank, seq, len, nfds) = (
        field(0, 4) as u32,
        field(4, 2) as u16,
        field(6, 2) as u16,
        field(8, 8),
        field(16, 4) as u32,
        field(20, 4) as u32,
    );
    if magic != MAGIC {
        return Err(FrameError::Magic(magic));
    }
    let kind = match kind {
        1 => Kind::Hello,
        2 => Kind::Data,
        3 => Kind::Abort,
        k => return Err(FrameError::Kind(k)),
    };
    if len as usize > MAX_PAYLOAD_BYTES || nfds as usize > MAX_FDS_PER_FRAME {
        return Err(FrameError::TooLarge { len, fds: nfds });
    }
    if payload.len() != len as usize {
        return Err(FrameError::Payload {
            announced: len,
            carried: payload.len(),
        });
    }
    if fds != nfds as usize {
        return Err(FrameError::Fds {
            announced: nfds,
            carried: fds,
        });
    }
    Ok(Header {
        kind,
        rank,
        seq,
        len,
        fds: nfds,
    })
}

/// Decodes `bytes` with `nfds` descriptors and checks the outcome against [`expected`] and the
/// allocation bound.
fn check_decode(bytes: &[u8], nfds: usize) -> Result<(), TestCaseError> {
    let fds = fds(nfds);
    let (result, largest) = LargestAllocation::during(|| frame::decode(bytes, fds));
    // The payload copy is the only allocation, and never larger than the input.
    prop_assert!(
        largest <= bytes.len(),
        "allocated {largest} bytes decoding {} bytes",
        bytes.len()
    );
    match (result, expected(bytes, nfds)) {
        (Ok(frame), Ok(header)) => {
            prop_assert_eq!(frame.header, header);
            prop_assert_eq!(&frame.payload[..], &bytes[HEADER_BYTES..]);
            prop_assert_eq!(frame.fds.len(), nfds);
        }
        (Err(got), Err(want)) => prop_assert_eq!(got, want),
        (got, want) => prop_assert!(false, "decoded {got:?}, expected {want:?}"),
    }
    Ok(())
}

#[test]
fn valid_frames_round_trip() {
    let frames = header(4096).prop_flat_map(|h| {
        (
            Just(h),
            proptest::collection::vec(any::<u8>(), h.len as usize),
        )
    });
    fuzz(
        "frames/round-trip",
        50_000,
        BUDGET,
        frames,
        |(header, payload)| {
            let mut bytes = header.encode().to_vec();
            bytes.extend_from_slice(&payload);
            let frame = frame::decode(&bytes, fds(header.fds as usize))?;
            prop_assert_eq!(frame.header, header);
            prop_assert_eq!(frame.payload, payload);
            prop_assert_eq!(frame.fds.len(), header.fds as usize);
            Ok(())
        },
    );
}

#[test]
fn valid_headers_round_trip_up_to_the_largest_payload() {
    fuzz(
        "frames/headers",
        200_000,
        BUDGET,
        header(MAX_PAYLOAD_BYTES as u32),
        |h| {
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
            Ok(())
        },
    );
}

/// Bytes that start with a valid magic and kind half of the time, so that most cases get past
/// the first two checks.
fn arbitrary_frame() -> impl Strategy<Value = (Vec<u8>, usize)> {
    let start = prop_oneof![
        Just(Vec::new()),
        (1u16..=3).prop_map(|kind| {
            let mut b = MAGIC.to_ne_bytes().to_vec();
            b.extend_from_slice(&kind.to_ne_bytes());
            b
        }),
    ];
    (
        start,
        proptest::collection::vec(any::<u8>(), 0..96),
        0..=MAX_FDS_PER_FRAME + 4,
    )
        .prop_map(|(mut bytes, rest, fds)| {
            bytes.extend(rest);
            (bytes, fds)
        })
}

#[test]
fn arbitrary_bytes_decode_to_a_frame_or_a_typed_error() {
    fuzz(
        "frames/arbitrary",
        100_000,
        BUDGET,
        arbitrary_frame(),
        |(bytes, fds)| check_decode(&bytes, fds),
    );
}

/// One change to an encoded frame.
#[derive(Clone, Debug)]
enum Mutation {
    /// Sets byte `at` (modulo the length) to `value`.
    Set {
        at: usize,
        value: u8,
    },
    /// Overwrites the u32 at header offset 16 (`len`) or 20 (`fds`).
    Field {
        at: usize,
        value: u32,
    },
    Truncate(usize),
    Append(Vec<u8>),
    /// Receives this many more (or fewer) descriptors than the header announces.
    Fds(i8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let count = prop_oneof![
        Just(0),
        Just(1),
        Just(MAX_FDS_PER_FRAME as u32),
        Just(MAX_FDS_PER_FRAME as u32 + 1),
        Just(MAX_PAYLOAD_BYTES as u32),
        Just(MAX_PAYLOAD_BYTES as u32 + 1),
        Just(u32::MAX),
        any::<u32>(),
    ];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mutation::Set { at, value }),
        (prop_oneof![Just(16), Just(20)], count)
            .prop_map(|(at, value)| Mutation::Field { at, value }),
        (0..HEADER_BYTES + 64).prop_map(Mutation::Truncate),
        proptest::collection::vec(any::<u8>(), 1..8).prop_map(Mutation::Append),
        (-3i8..=3).prop_map(Mutation::Fds),
    ]
}

#[test]
fn mutated_frames_decode_to_a_frame_or_a_typed_error() {
    let cases = header(48).prop_flat_map(|h| {
        (
            Just(h),
            proptest::collection::vec(any::<u8>(), h.len as usize),
            proptest::collection::vec(mutation(), 1..4),
        )
    });
    fuzz(
        "frames/mutated",
        100_000,
        BUDGET,
        cases,
        |(header, payload, mutations)| {
            let mut bytes = header.encode().to_vec();
            bytes.extend_from_slice(&payload);
            let mut nfds = header.fds as usize;
            for m in mutations {
                match m {
                    Mutation::Set { at, value } => {
                        if !bytes.is_empty() {
                            let at = at % bytes.len();
                            bytes[at] = value;
                        }
                    }
                    Mutation::Field { at, value } => {
                        if bytes.len() >= at + 4 {
                            bytes[at..at + 4].copy_from_slice(&value.to_ne_bytes());
                        }
                    }
                    Mutation::Truncate(n) => bytes.truncate(n),
                    Mutation::Append(more) => bytes.extend(more),
                    Mutation::Fds(d) => nfds = nfds.saturating_add_signed(d.into()),
                }
            }
            check_decode(&bytes, nfds)
        },
    );
}
