//! Tests with two processes: the peer is the test binary itself, started with
//! [`ROLE`] set, which makes the binary's `peer_process` test run that role instead
//! of returning. The peer talks to the test on its standard output (lines starting
//! with `RDMA-PEER `, see [`say`]) and may wait on its standard input.

use std::{path::PathBuf, process::Stdio};

use tokio::{
    io::{AsyncBufReadExt, BufReader, Lines},
    process::{Child, ChildStdout, Command},
};

use super::{socket_path, GUARD};

/// The environment variable naming the role a peer process plays.
pub const ROLE: &str = "RPC_RDMA_TEST_ROLE";
/// The environment variable with the socket path the peer listens on or connects to.
pub const SOCKET: &str = "RPC_RDMA_TEST_SOCKET";

/// In a peer process: tells the test something.
pub fn say(what: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "RDMA-PEER {what}");
    let _ = out.flush();
}

/// In a peer process: the role and socket path, if this process is a peer.
pub fn role() -> Option<(String, PathBuf)> {
    let role = std::env::var(ROLE).ok()?;
    let path = PathBuf::from(std::env::var(SOCKET).expect("socket path"));
    Some((role, path))
}

/// A peer process, killed when dropped.
pub struct Peer {
    pub child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    pub path: PathBuf,
    /// Whether the peer listens on `path` (and leaves its socket file behind when
    /// killed), rather than connecting to the test's.
    owns_path: bool,
}

/// Starts a peer playing `role` on a fresh socket path.
pub async fn start_peer(role: &str) -> Peer {
    start_peer_at(role, socket_path(role)).await
}

/// Starts a peer playing `role` on `path`, which the peer listens on.
pub async fn start_peer_at(role: &str, path: PathBuf) -> Peer {
    let mut peer = start_client_peer(role, path).await;
    peer.owns_path = true;
    peer
}

/// Starts a peer playing `role` that connects to the test's socket at `path`.
pub async fn start_client_peer(role: &str, path: PathBuf) -> Peer {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["peer_process", "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(SOCKET, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    Peer {
        child,
        lines,
        path,
        owns_path: false,
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // A killed peer leaves its socket file behind.
        if self.owns_path {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Peer {
    /// Waits until the peer says `what` (and nothing else before).
    pub async fn wait_for(&mut self, what: &str) {
        let said = self.next_said().await;
        assert_eq!(said, what, "the peer said something else");
    }

    /// The next thing the peer says.
    pub async fn next_said(&mut self) -> String {
        tokio::time::timeout(GUARD, async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                // The test harness may have written to the same line before us.
                if let Some(at) = line.find("RDMA-PEER ") {
                    return line[at + "RDMA-PEER ".len()..].to_owned();
                }
            }
            panic!("the peer exited without saying anything more");
        })
        .await
        .expect("peer hung")
    }

    /// The peer's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Kills the peer (SIGKILL) and waits until it is gone.
    pub async fn kill(&mut self) {
        self.child.start_kill().unwrap();
        tokio::time::timeout(GUARD, self.child.wait())
            .await
            .expect("the killed peer hung")
            .unwrap();
    }
}

/// Context switches of every thread of process `pid`, by thread id: a thread that
/// never ran keeps both counts.
pub fn all_switches(pid: u32) -> std::collections::BTreeMap<u32, (u64, u64)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| {
            let tid: u32 = e.unwrap().file_name().to_string_lossy().parse().unwrap();
            (tid, switches(pid, tid))
        })
        .collect()
}

/// Voluntary and involuntary context switches of thread `tid` of process `pid`.
pub fn switches(pid: u32, tid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().parse::<u64>().unwrap())
            .unwrap()
    };
    (
        field("voluntary_ctxt_switches:"),
        field("nonvoluntary_ctxt_switches:"),
    )
}

/// The system call thread `tid` is blocked in (`/proc/.../syscall`'s first field;
/// 0 is `read` on x86-64 and 63 on aarch64).
pub fn blocked_in(pid: u32, tid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    text.split_whitespace().next().map(str::to_owned)
}

/// `read`'s number in [`blocked_in`].
pub const READ_SYSCALL: &str = if cfg!(target_arch = "aarch64") {
    "63"
} else {
    "0"
};
