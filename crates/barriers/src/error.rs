//! The error word: what a failed barrier leaves in the symmetric buffer, or an in-kernel wait that
//! gave up in its kernel's own word, and its decoding. The bit layout is pinned against
//! `cuda/barriers.cuh` (constants of the same names, `kError*` and `kLocalWait*` there).

/// Bits 63..60: the kind of failure (0 = none).
pub const ERROR_KIND_SHIFT: u32 = 60;
/// Kind: a rank did not reach the cross-rank barrier in time.
pub const ERROR_KIND_RANK_TIMEOUT: u64 = 1;
/// Kind: a wait inside one kernel (on another CTA of the same grid) did not end in time.
pub const ERROR_KIND_LOCAL_TIMEOUT: u64 = 2;
/// Bits 59..52: the rank that was missing.
pub const ERROR_RANK_SHIFT: u32 = 52;
/// Bits 59..52 of a local timeout (where a rank timeout has the rank): which wait
/// ([`LocalWait`]); bits 31..0 its detail.
pub const ERROR_LOCAL_WAIT_SHIFT: u32 = 52;
/// Local wait code of [`LocalWait::SplitTailHandOver`].
pub const ERROR_LOCAL_WAIT_SPLIT_TAIL: u64 = 1;
/// Local wait code of [`LocalWait::RowArrivals`].
pub const ERROR_LOCAL_WAIT_ROW_ARRIVALS: u64 = 2;
/// Local wait code of [`LocalWait::Ring`].
pub const ERROR_LOCAL_WAIT_RING: u64 = 3;
/// Bits 51..32: how long the barrier waited, in units of 2^[`ERROR_WAIT_UNIT_LOG2`] ns, saturating.
pub const ERROR_WAIT_SHIFT: u32 = 32;
/// The wait is stored in units of 2^20 ns (about 1.05 ms): the device divides with a shift.
pub const ERROR_WAIT_UNIT_LOG2: u32 = 20;
/// Largest stored wait (about 18 minutes).
pub const ERROR_WAIT_MAX: u64 = (1 << 20) - 1;

/// The in-kernel waits that give up into an error word, by their code in bits 59..52.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalWait {
    /// The grouped GEMM's split-tail hand-over (megamoe-kernel's `sm90_moe_gemm.cuh`): a tile's
    /// head waits for a later part's FP32 sums from another CTA; the detail is the hand-over slot.
    SplitTailHandOver,
    /// The fused forward's L2 GEMM (megamoe-kernel's `sm90_mega_moe.cuh`): a tile's producer waits
    /// until every L1 tile of its pool rows has stored them; the detail is the tile's first row.
    RowArrivals,
    /// A grouped GEMM CTA's wait on its own ring (megamoe-kernel's `sm90_moe_gemm.cuh`): a stage's
    /// loads, a stage's release or the epilogue's hand-off never completed, so the CTA's roles
    /// fell out of step; the detail is the CTA.
    Ring,
}

impl LocalWait {
    /// The wait of code `code` (`kLocalWait*` in `cuda/barriers.cuh`).
    pub fn from_code(code: u64) -> Option<Self> {
        match code {
            ERROR_LOCAL_WAIT_SPLIT_TAIL => Some(Self::SplitTailHandOver),
            ERROR_LOCAL_WAIT_ROW_ARRIVALS => Some(Self::RowArrivals),
            ERROR_LOCAL_WAIT_RING => Some(Self::Ring),
            _ => None,
        }
    }
}

impl std::fmt::Display for LocalWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::SplitTailHandOver => "the GEMM's split-tail hand-over of slot",
            Self::RowArrivals => "the L2 GEMM's wait for the L1 tiles of pool row",
            Self::Ring => "the GEMM ring's wait (a stage, its release or the hand-off) of CTA",
        })
    }
}

/// A barrier failure, decoded from the error word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BarrierError {
    /// `missing_rank` had not entered barrier `epoch` when the waiting rank gave up after
    /// `waited_ns` (a lower bound, in steps of 2^20 ns).
    #[error(
        "cross-rank barrier timed out: rank {missing_rank} had not reached epoch {epoch} after {:.1} ms \
         (it died, hangs, or never launched the kernel)",
        *waited_ns as f64 / 1e6
    )]
    Timeout {
        missing_rank: u32,
        /// The low 32 bits of the barrier's epoch (1 for the first barrier on a fresh buffer).
        epoch: u32,
        waited_ns: u64,
    },
    /// An in-kernel wait gave up after `waited_ns` (a lower bound, in steps of 2^20 ns): what it
    /// waited for (another CTA's hand-over, or its own ring) never came, so the kernel's results
    /// are void.
    #[error(
        "in-kernel wait timed out: {wait} {detail} gave up after {:.1} ms (what it waited for never \
         came; the kernel's results are void)",
        *waited_ns as f64 / 1e6
    )]
    LocalTimeout {
        wait: LocalWait,
        detail: u32,
        waited_ns: u64,
    },
    #[error("the error word is {word:#018x}, which no barrier writes (another kernel's error?)")]
    Unknown { word: u64 },
}

/// `Ok` for a zero error word, else the failure it records.
pub fn check_error_word(word: u64) -> Result<(), BarrierError> {
    if word == 0 {
        return Ok(());
    }
    let waited_ns = ((word >> ERROR_WAIT_SHIFT) & ERROR_WAIT_MAX) << ERROR_WAIT_UNIT_LOG2;
    match word >> ERROR_KIND_SHIFT {
        ERROR_KIND_RANK_TIMEOUT => Err(BarrierError::Timeout {
            missing_rank: ((word >> ERROR_RANK_SHIFT) & 0xFF) as u32,
            epoch: word as u32,
            waited_ns,
        }),
        ERROR_KIND_LOCAL_TIMEOUT => {
            match LocalWait::from_code((word >> ERROR_LOCAL_WAIT_SHIFT) & 0xFF) {
                Some(wait) => Err(BarrierError::LocalTimeout {
                    wait,
                    detail: word as u32,
                    waited_ns,
                }),
                None => Err(BarrierError::Unknown { word }),
            }
        }
        _ => Err(BarrierError::Unknown { word }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_no_error() {
        assert_eq!(check_error_word(0), Ok(()));
    }

    #[test]
    fn decodes_each_timeout_field_by_field() {
        let rank_timeout = (1u64 << 60) | (71 << 52) | (5000 << 32) | 0xDEAD_BEEF;
        let local_timeout = (2u64 << 60) | (1 << 52) | (4768 << 32) | 42;
        let row_wait = (2u64 << 60) | (2 << 52) | (4768 << 32) | 4096;
        let ring_wait = (2u64 << 60) | (3 << 52) | (4768 << 32) | 131;
        for (word, decoded, in_message) in [
            (
                rank_timeout,
                BarrierError::Timeout {
                    missing_rank: 71,
                    epoch: 0xDEAD_BEEF,
                    waited_ns: 5000 << 20,
                },
                ["rank 71", "5242.9 ms"],
            ),
            (
                local_timeout,
                BarrierError::LocalTimeout {
                    wait: LocalWait::SplitTailHandOver,
                    detail: 42,
                    waited_ns: 4768 << 20,
                },
                ["split-tail hand-over of slot 42", "4999.6 ms"],
            ),
            (
                row_wait,
                BarrierError::LocalTimeout {
                    wait: LocalWait::RowArrivals,
                    detail: 4096,
                    waited_ns: 4768 << 20,
                },
                ["L1 tiles of pool row 4096", "4999.6 ms"],
            ),
            (
                ring_wait,
                BarrierError::LocalTimeout {
                    wait: LocalWait::Ring,
                    detail: 131,
                    waited_ns: 4768 << 20,
                },
                [
                    "ring's wait (a stage, its release or the hand-off) of CTA 131",
                    "4999.6 ms",
                ],
            ),
        ] {
            assert_eq!(check_error_word(word), Err(decoded));
            let message = decoded.to_string();
            for part in in_message {
                assert!(message.contains(part), "{message}");
            }
        }
    }

    #[test]
    fn the_largest_wait_saturates_every_field_independently() {
        let word = (1u64 << 60) | (0xFF << 52) | (ERROR_WAIT_MAX << 32) | 0xFFFF_FFFF;
        let Err(BarrierError::Timeout {
            missing_rank,
            epoch,
            waited_ns,
        }) = check_error_word(word)
        else {
            panic!("not a timeout");
        };
        assert_eq!((missing_rank, epoch), (255, u32::MAX));
        assert_eq!(waited_ns, ERROR_WAIT_MAX << 20);
        assert!(waited_ns > 18 * 60 * 1_000_000_000);
    }

    #[test]
    fn unknown_kinds_and_waits_are_reported_with_the_word() {
        for word in [
            3u64 << 60 | 7,
            15 << 60 | 7,
            2 << 60 | 7,
            2 << 60 | 0xFF << 52,
        ] {
            assert_eq!(check_error_word(word), Err(BarrierError::Unknown { word }));
        }
        assert_eq!(
            check_error_word(1),
            Err(BarrierError::Unknown { word: 1 }),
            "kind 0 with bits set is no barrier's word"
        );
    }
}
