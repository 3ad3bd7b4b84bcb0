//! [`Rendezvous`]: how the processes of a one-process-per-GPU world on one host find each other and
//! exchange what they must (allocation fds, addresses, barriers). Rank 0 listens on a Unix socket,
//! every other rank connects to it, and the connections stay open for every collective. A
//! collective is an all-gather of bytes and file descriptors: each rank sends rank 0 one frame,
//! rank 0 relays all of them to everyone, the fds as `SCM_RIGHTS`. A rank that never arrives makes
//! rank 0 fail after the timeout, naming it, and tell the others why; a rank whose process dies
//! closes its socket, which its peers see at once.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recv, recvmsg, sendmsg};

use super::frame::{
    Frame, FrameError, HEADER_BYTES, Header, Kind, MAX_FDS_PER_FRAME, MAX_PAYLOAD_BYTES,
};
use super::{ProcessEnv, WorldError};

/// How often rank 0 polls its listener while ranks are still connecting.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// How often a rank retries connecting while rank 0 is not listening yet.
const CONNECT_POLL: Duration = Duration::from_millis(20);

/// What one rank put into a collective.
#[derive(Debug)]
pub struct Contribution {
    pub bytes: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// Why talking to one peer failed, before it is put into a [`WorldError`] with context.
#[derive(Debug)]
enum LinkError {
    Closed,
    TimedOut,
    Bad(FrameError),
    Io(io::Error),
}

impl From<io::Error> for LinkError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe => Self::Closed,
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Self::TimedOut,
            _ => Self::Io(e),
        }
    }
}

impl From<Errno> for LinkError {
    fn from(e: Errno) -> Self {
        io::Error::from(e).into()
    }
}

/// Time left until `deadline`, at least 1 ms (a zero socket timeout would mean "none").
fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn send_frame(
    stream: &UnixStream,
    header: Header,
    payload: &[u8],
    fds: &[OwnedFd],
) -> Result<(), LinkError> {
    let head = header.encode();
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsgs: Vec<ControlMessage> = if raw.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    let iov = [IoSlice::new(&head), IoSlice::new(payload)];
    let sent = loop {
        match sendmsg::<()>(
            stream.as_raw_fd(),
            &iov,
            &cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(Errno::EINTR) => continue,
            other => break other?,
        }
    };
    // A short send delivered the fds with its first byte; the rest is plain bytes.
    let mut writer = stream;
    if sent < HEADER_BYTES {
        writer.write_all(&head[sent..])?;
        writer.write_all(payload)?;
    } else {
        writer.write_all(&payload[sent - HEADER_BYTES..])?;
    }
    Ok(())
}

/// Reads one frame. The header is read with `recvmsg`, which collects the frame's fds (they travel
/// with its first byte); exact-length reads never consume bytes of the next frame. The payload is
/// allocated only once [`Header::decode`] has bounded its length.
fn recv_frame(stream: &UnixStream, deadline: Instant) -> Result<Frame, LinkError> {
    let mut head = [0u8; HEADER_BYTES];
    let mut got = 0;
    let mut fds = Vec::new();
    let mut cmsg_space = nix::cmsg_space!([RawFd; MAX_FDS_PER_FRAME]);
    while got < HEADER_BYTES {
        stream.set_read_timeout(Some(remaining(deadline)))?;
        let mut iov = [IoSliceMut::new(&mut head[got..])];
        let msg = match recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            other => other?,
        };
        for cmsg in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel just installed these descriptors for us; nobody else owns them.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(LinkError::Bad(FrameError::FdsTruncated));
        }
        if msg.bytes == 0 {
            return Err(LinkError::Closed);
        }
        got += msg.bytes;
    }
    let header = Header::decode(&head).map_err(LinkError::Bad)?;
    let mut payload = vec![0u8; header.len as usize];
    let mut filled = 0;
    while filled < payload.len() {
        stream.set_read_timeout(Some(remaining(deadline)))?;
        match (&*stream).read(&mut payload[filled..]) {
            Ok(0) => return Err(LinkError::Closed),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Frame::new(header, payload, fds).map_err(LinkError::Bad)
}

/// Whether `stream` has bytes waiting (`Some(true)`), nothing yet (`Some(false)`), or is closed.
fn pending(stream: &UnixStream) -> Option<bool> {
    let mut byte = [0u8; 1];
    match recv(
        stream.as_raw_fd(),
        &mut byte,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(0) => None,
        Ok(_) => Some(true),
        Err(Errno::EAGAIN) => Some(false),
        Err(_) => None,
    }
}

enum Link {
    /// A world of one.
    Alone,
    /// Rank 0: the connection of rank r at index r − 1.
    Hub(Vec<UnixStream>),
    /// Every other rank: the connection to rank 0.
    Spoke(UnixStream),
}

/// One rank's end of the host-side rendezvous. Collectives must be called by every rank in the
/// same order; after a failure every further call fails with [`WorldError::Poisoned`].
pub struct Rendezvous {
    rank: usize,
    size: usize,
    timeout: Duration,
    path: PathBuf,
    seq: u64,
    link: Link,
    failed: Option<String>,
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendezvous")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("path", &self.path)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Rendezvous {
    /// Meets the other ranks at `env.socket_path()`.
    pub fn connect(env: &ProcessEnv) -> Result<Self, WorldError> {
        Self::connect_at(&env.socket_path(), env.rank, env.world_size, env.timeout)
    }

    /// Meets the other ranks of a `size`-rank world at the Unix socket `path`: rank 0 binds it
    /// (replacing a stale file) and waits up to `timeout` for every other rank to connect; they
    /// retry until then. Returns once all `size` ranks are connected.
    pub fn connect_at(
        path: &Path,
        rank: usize,
        size: usize,
        timeout: Duration,
    ) -> Result<Self, WorldError> {
        let deadline = Instant::now() + timeout;
        let socket_err = |what, source| WorldError::Socket {
            rank,
            what,
            path: path.to_owned(),
            source,
        };
        if rank >= size {
            return Err(WorldError::Env {
                var: "RANK",
                reason: format!("{rank} is not below the world size {size}"),
            });
        }
        let link = match (rank, size) {
            (0, 1) => Link::Alone,
            (0, _) => Link::Hub(accept_all(path, size, timeout, deadline)?),
            _ => {
                let stream = loop {
                    match UnixStream::connect(path) {
                        Ok(s) => break s,
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                            ) =>
                        {
                            if Instant::now() >= deadline {
                                return Err(WorldError::Timeout {
                                    rank,
                                    during: "the rendezvous (rank 0 never listened)".into(),
                                    missing: vec![0],
                                    waited: timeout,
                                });
                            }
                            std::thread::sleep(CONNECT_POLL);
                        }
                        Err(e) => return Err(socket_err("cannot connect", e)),
                    }
                };
                stream
                    .set_write_timeout(Some(timeout))
                    .map_err(|e| socket_err("cannot set a timeout", e))?;
                let hello = Header {
                    kind: Kind::Hello,
                    rank: rank as u16,
                    seq: 0,
                    len: 4,
                    fds: 0,
                };
                send_frame(&stream, hello, &(size as u32).to_le_bytes(), &[]).map_err(
                    |e| match e {
                        LinkError::Io(e) => socket_err("cannot greet rank 0", e),
                        _ => WorldError::PeerLost {
                            rank,
                            peer: 0,
                            during: "the rendezvous".into(),
                        },
                    },
                )?;
                Link::Spoke(stream)
            }
        };
        let mut rendezvous = Self {
            rank,
            size,
            timeout,
            path: path.to_owned(),
            seq: 0,
            link,
            failed: None,
        };
        rendezvous.barrier("the rendezvous")?;
        tracing::debug!(rank, size, path = %path.display(), "world rendezvous complete");
        Ok(rendezvous)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Every rank's `bytes` and `fds`, indexed by rank (this rank's own come back as given).
    /// `during` names the collective in errors.
    pub fn all_gather(
        &mut self,
        during: &str,
        bytes: &[u8],
        fds: Vec<OwnedFd>,
    ) -> Result<Vec<Contribution>, WorldError> {
        if let Some(reason) = &self.failed {
            return Err(WorldError::Poisoned {
                rank: self.rank,
                reason: reason.clone(),
            });
        }
        if bytes.len() > MAX_PAYLOAD_BYTES || fds.len() > MAX_FDS_PER_FRAME {
            return Err(WorldError::Protocol {
                rank: self.rank,
                during: during.into(),
                reason: format!(
                    "{} bytes and {} fds exceed one frame ({MAX_PAYLOAD_BYTES} bytes, \
                     {MAX_FDS_PER_FRAME} fds)",
                    bytes.len(),
                    fds.len()
                ),
            });
        }
        self.seq += 1;
        let during = format!("{during} (collective #{})", self.seq);
        let own = Contribution {
            bytes: bytes.to_vec(),
            fds,
        };
        let result = match &self.link {
            Link::Alone => Ok(vec![own]),
            Link::Hub(peers) => self.gather_as_hub(peers, &during, own),
            Link::Spoke(hub) => self.gather_as_spoke(hub, &during, own),
        };
        if let Err(e) = &result {
            self.failed = Some(e.to_string());
        }
        result
    }

    /// Returns once every rank has called it.
    pub fn barrier(&mut self, during: &str) -> Result<(), WorldError> {
        self.all_gather(during, &[], Vec::new()).map(drop)
    }

    fn header(&self, kind: Kind, rank: usize, contribution: (&[u8], &[OwnedFd])) -> Header {
        Header {
            kind,
            rank: rank as u16,
            seq: self.seq,
            len: contribution.0.len() as u32,
            fds: contribution.1.len() as u32,
        }
    }

    fn gather_as_hub(
        &self,
        peers: &[UnixStream],
        during: &str,
        own: Contribution,
    ) -> Result<Vec<Contribution>, WorldError> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut all = vec![own];
        for (i, stream) in peers.iter().enumerate() {
            let peer = i + 1;
            let failure = match recv_frame(stream, deadline) {
                Ok(Frame {
                    header: h,
                    payload: bytes,
                    fds,
                }) if h.kind == Kind::Data && h.rank as usize == peer => {
                    if h.seq == self.seq {
                        all.push(Contribution { bytes, fds });
                        continue;
                    }
                    WorldError::Protocol {
                        rank: 0,
                        during: during.into(),
                        reason: format!(
                            "rank {peer} is in collective #{} instead: the ranks called \
                             different collectives",
                            h.seq
                        ),
                    }
                }
                Ok(Frame { header: h, .. }) => WorldError::Protocol {
                    rank: 0,
                    during: during.into(),
                    reason: format!("unexpected {:?} frame from rank {peer}", h.kind),
                },
                Err(LinkError::TimedOut) => {
                    // This peer and every later one that has sent nothing yet.
                    let missing = std::iter::once(peer)
                        .chain(
                            (peer + 1..self.size).filter(|&r| pending(&peers[r - 1]) != Some(true)),
                        )
                        .collect();
                    WorldError::Timeout {
                        rank: 0,
                        during: during.into(),
                        missing,
                        waited: start.elapsed(),
                    }
                }
                Err(e) => self.link_error(e, peer, during),
            };
            self.abort(peers, &failure.to_string());
            return Err(failure);
        }
        for (i, stream) in peers.iter().enumerate() {
            for (r, c) in all.iter().enumerate() {
                let header = self.header(Kind::Data, r, (&c.bytes, &c.fds));
                if let Err(e) = send_frame(stream, header, &c.bytes, &c.fds) {
                    let failure = self.link_error(e, i + 1, during);
                    self.abort(peers, &failure.to_string());
                    return Err(failure);
                }
            }
        }
        Ok(all)
    }

    fn gather_as_spoke(
        &self,
        hub: &UnixStream,
        during: &str,
        own: Contribution,
    ) -> Result<Vec<Contribution>, WorldError> {
        let start = Instant::now();
        let header = self.header(Kind::Data, self.rank, (&own.bytes, &own.fds));
        send_frame(hub, header, &own.bytes, &own.fds).map_err(|e| self.link_error(e, 0, during))?;
        // Longer than rank 0 waits, so that its diagnosis (which rank is missing) arrives first.
        let deadline = start + self.timeout + (self.timeout / 2).max(Duration::from_secs(1));
        let mut all = Vec::with_capacity(self.size);
        while all.len() < self.size {
            let Frame {
                header: h,
                payload: bytes,
                fds,
            } = recv_frame(hub, deadline).map_err(|e| match e {
                LinkError::TimedOut => WorldError::Timeout {
                    rank: self.rank,
                    during: during.into(),
                    missing: vec![0],
                    waited: start.elapsed(),
                },
                e => self.link_error(e, 0, during),
            })?;
            match h.kind {
                Kind::Abort => {
                    return Err(WorldError::Aborted {
                        rank: self.rank,
                        during: during.into(),
                        reason: String::from_utf8_lossy(&bytes).into_owned(),
                    });
                }
                Kind::Data if h.seq == self.seq && h.rank as usize == all.len() => {
                    all.push(Contribution { bytes, fds });
                }
                _ => {
                    return Err(WorldError::Protocol {
                        rank: self.rank,
                        during: during.into(),
                        reason: format!(
                            "rank 0 relayed {:?} of rank {} from collective #{}",
                            h.kind, h.rank, h.seq
                        ),
                    });
                }
            }
        }
        Ok(all)
    }

    /// Best effort: tells every connected rank why this collective failed.
    fn abort(&self, peers: &[UnixStream], reason: &str) {
        let header = self.header(Kind::Abort, 0, (reason.as_bytes(), &[]));
        for stream in peers {
            let _ = send_frame(stream, header, reason.as_bytes(), &[]);
        }
    }

    fn link_error(&self, e: LinkError, peer: usize, during: &str) -> WorldError {
        match e {
            LinkError::Closed => WorldError::PeerLost {
                rank: self.rank,
                peer,
                during: during.into(),
            },
            LinkError::TimedOut => WorldError::Timeout {
                rank: self.rank,
                during: during.into(),
                missing: vec![peer],
                waited: self.timeout,
            },
            LinkError::Bad(reason) => WorldError::Protocol {
                rank: self.rank,
                during: during.into(),
                reason: format!("with rank {peer}: {reason}"),
            },
            LinkError::Io(source) => WorldError::Socket {
                rank: self.rank,
                what: "socket error",
                path: self.path.clone(),
                source,
            },
        }
    }
}

/// Rank 0's side of the rendezvous: binds `path` and accepts one connection from every other rank.
fn accept_all(
    path: &Path,
    size: usize,
    timeout: Duration,
    deadline: Instant,
) -> Result<Vec<UnixStream>, WorldError> {
    let socket_err = |what, source| WorldError::Socket {
        rank: 0,
        what,
        path: path.to_owned(),
        source,
    };
    // A file left by an earlier run refuses connections; replace it.
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(socket_err("cannot remove the stale socket", e));
        }
        _ => {}
    }
    let listener = UnixListener::bind(path).map_err(|e| socket_err("cannot listen", e))?;
    // Nobody needs the path once everyone is connected (or we gave up).
    struct Unlink<'a>(&'a Path);
    impl Drop for Unlink<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _unlink = Unlink(path);
    listener
        .set_nonblocking(true)
        .map_err(|e| socket_err("cannot poll the listener", e))?;
    let mut peers: Vec<Option<UnixStream>> = (1..size).map(|_| None).collect();
    let during = "the rendezvous";
    while peers.iter().any(Option::is_none) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = (1..size).filter(|&r| peers[r - 1].is_none()).collect();
                    let failure = WorldError::Timeout {
                        rank: 0,
                        during: during.into(),
                        missing,
                        waited: timeout,
                    };
                    abort_connected(&peers, &failure);
                    return Err(failure);
                }
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
            Err(e) => return Err(socket_err("cannot accept", e)),
        };
        let setup = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_write_timeout(Some(timeout)));
        setup.map_err(|e| socket_err("cannot configure a connection", e))?;
        let refuse = |reason: String| {
            let failure = WorldError::Protocol {
                rank: 0,
                during: during.into(),
                reason,
            };
            abort_connected(&peers, &failure);
            let header = Header {
                kind: Kind::Abort,
                rank: 0,
                seq: 0,
                len: 0,
                fds: 0,
            };
            let _ = send_frame(&stream, header, &[], &[]);
            failure
        };
        let Frame {
            header: hello,
            payload,
            ..
        } = match recv_frame(&stream, deadline) {
            Ok(frame) => frame,
            Err(LinkError::Closed) => continue,
            Err(e) => return Err(refuse(format!("a connecting rank sent no greeting: {e:?}"))),
        };
        let their_size = <[u8; 4]>::try_from(payload.as_slice())
            .ok()
            .map(u32::from_le_bytes);
        let peer = hello.rank as usize;
        if hello.kind != Kind::Hello || their_size != Some(size as u32) {
            return Err(refuse(format!(
                "rank {peer} greeted with {:?} for a world of {their_size:?} ranks, this one has {size}",
                hello.kind
            )));
        }
        if !(1..size).contains(&peer) || peers[peer - 1].is_some() {
            return Err(refuse(format!(
                "a second rank {peer} connected (two jobs on one MASTER_ADDR:MASTER_PORT?)"
            )));
        }
        peers[peer - 1] = Some(stream);
    }
    Ok(peers.into_iter().flatten().collect())
}

/// Tells every rank connected so far that the rendezvous failed.
fn abort_connected(peers: &[Option<UnixStream>], failure: &WorldError) {
    let reason = failure.to_string();
    let header = Header {
        kind: Kind::Abort,
        rank: 0,
        seq: 1,
        len: reason.len() as u32,
        fds: 0,
    };
    for stream in peers.iter().flatten() {
        let _ = send_frame(stream, header, reason.as_bytes(), &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_bytes_and_fds_back_to_back() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let fd = OwnedFd::from(file);
        let deadline = Instant::now() + Duration::from_secs(5);
        let header = |len: usize, fds: u32| Header {
            kind: Kind::Data,
            rank: 1,
            seq: 2,
            len: len as u32,
            fds,
        };
        let big = vec![7u8; 300_000];
        let fds = [fd.try_clone().unwrap(), fd];
        std::thread::scope(|s| {
            s.spawn(|| {
                send_frame(&a, header(3, 2), b"abc", &fds).unwrap();
                send_frame(&a, header(big.len(), 0), &big, &[]).unwrap();
                send_frame(&a, header(0, 1), &[], &fds[..1]).unwrap();
            });
            let frame = recv_frame(&b, deadline).unwrap();
            assert_eq!(
                (frame.header, frame.payload.as_slice(), frame.fds.len()),
                (header(3, 2), &b"abc"[..], 2)
            );
            let frame = recv_frame(&b, deadline).unwrap();
            assert_eq!(
                (
                    frame.header.len as usize,
                    frame.payload == big,
                    frame.fds.len()
                ),
                (big.len(), true, 0)
            );
            let Frame {
                payload, fds: got, ..
            } = recv_frame(&b, deadline).unwrap();
            assert_eq!((payload.len(), got.len()), (0, 1));
            // A new descriptor for the same file.
            use std::os::unix::fs::MetadataExt;
            let inode = |fd: &OwnedFd| {
                std::fs::File::from(fd.try_clone().unwrap())
                    .metadata()
                    .unwrap()
                    .ino()
            };
            assert_ne!(got[0].as_raw_fd(), fds[0].as_raw_fd());
            assert_eq!(inode(&got[0]), inode(&fds[0]));
        });
        drop(a);
        assert!(matches!(recv_frame(&b, deadline), Err(LinkError::Closed)));
    }

    #[test]
    fn a_silent_peer_times_out() {
        let (_a, b) = UnixStream::pair().unwrap();
        let start = Instant::now();
        let result = recv_frame(&b, start + Duration::from_millis(50));
        assert!(matches!(result, Err(LinkError::TimedOut)), "{result:?}");
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(pending(&b), Some(false));
    }
}
