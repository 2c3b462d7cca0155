//! `corelink-perf` on `soft` as two processes (`--server`, and a client given the server's
//! address), meeting on a fabric of their own (`CORELINK_SOFT_FABRIC`): every engine test and a
//! verbs one (`-c UC`) run, the client reports with the test's JSON keys, both exit 0. A few
//! hundred iterations each; nothing is timed.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A server process, killed if the test ends before it exits (it would wait for ever).
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn perf(fabric: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_corelink-perf"));
    c.args(args).env("CORELINK_SOFT_FABRIC", fabric);
    c
}

/// Runs `test` (with `extra` options) as a server and a client on port `port`.
fn pair(test: &str, port: u16, extra: &[&str]) -> serde_json::Value {
    let fabric = format!("perf-test-{}-{port}", std::process::id());
    let p = port.to_string();
    let mut common = vec![test, "--provider", "soft", "-p", &p, "-n", "200"];
    common.extend_from_slice(extra);
    let mut server = Server(
        perf(&fabric, &[&common[..], &["--server"]].concat())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the server starts"),
    );
    // The client tries again while the server is not listening yet.
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = loop {
        let out = perf(&fabric, &[&common[..], &["--json", "127.0.0.1"]].concat())
            .output()
            .expect("the client runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains("rejected") || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{test} client: {stderr}");
    let st = server.0.wait().expect("the server exits");
    assert!(st.success(), "{test} server: {st}");
    let line = String::from_utf8(out.stdout).expect("utf-8");
    let j: serde_json::Value =
        serde_json::from_str(line.lines().last().expect("a line")).expect("JSON");
    assert_eq!(j["test"], test, "{j}");
    assert_eq!(j["provider"], "soft", "{j}");
    j
}

#[test]
fn every_engine_test_runs_as_two_processes() {
    let base = 21000 + (std::process::id() % 1000) as u16 * 16;
    for (i, test) in
        ["send_lat", "write_lat", "read_lat", "atomic_lat", "send_bw", "write_bw", "read_bw"]
            .into_iter()
            .enumerate()
    {
        let j = pair(test, base + i as u16, &[]);
        assert!(j["iterations"].as_u64().is_some_and(|n| n >= 200), "{j}");
    }
}

#[test]
fn rpc_and_verbs_tests_run_as_two_processes() {
    let base = 21000 + (std::process::id() % 1000) as u16 * 16 + 8;
    pair("rpc_lat", base, &[]);
    pair("send_bw", base + 1, &["-c", "UC"]);
}

/// Starts `send_bw` for about a minute as a server and a client on `port`, with both sides'
/// stderr in files of `dir`, and waits until the client runs (its header is out).
fn long_pair(port: u16, dir: &std::path::Path) -> (Server, Server) {
    let fabric = format!("perf-kill-{}-{port}", std::process::id());
    let p = port.to_string();
    let common = ["send_bw", "--provider", "soft", "-p", &p, "-D", "60", "-s", "64"];
    let err = |name: &str| std::fs::File::create(dir.join(name)).expect("a file");
    let server = Server(
        perf(&fabric, &[&common[..], &["--server"]].concat())
            .stdout(Stdio::null())
            .stderr(err("server.err"))
            .spawn()
            .expect("the server starts"),
    );
    std::thread::sleep(Duration::from_millis(200)); // (a client tried too early only retries)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let client = Server(
            perf(&fabric, &[&common[..], &["--json", "127.0.0.1"]].concat())
                .stdout(Stdio::null())
                .stderr(err("client.err"))
                .spawn()
                .expect("the client starts"),
        );
        loop {
            let text = std::fs::read_to_string(dir.join("client.err")).unwrap_or_default();
            if text.contains(" Sizes ") {
                // (the header is out once the run has started; a moment more and it sends)
                std::thread::sleep(Duration::from_millis(500));
                return (server, client);
            }
            if text.contains("rejected") || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(Instant::now() < deadline, "the client never ran");
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `p` to exit (a guard against hangs, not a timing check) and returns its status
/// and what it said on stderr.
fn ended(p: &mut Server, err: &std::path::Path) -> (Option<i32>, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = p.0.try_wait().expect("wait") {
            return (st.code(), std::fs::read_to_string(err).unwrap_or_default());
        }
        assert!(Instant::now() < deadline, "still running after its peer was killed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_kill_of_either_process_is_reported_by_the_other() {
    let base = 21000 + (std::process::id() % 1000) as u16 * 16 + 12;
    for (i, kill_server) in [true, false].into_iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("perf-kill-{}-{i}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let (mut server, mut client) = long_pair(base + i as u16, &dir);
        let (victim, mut other, err) = if kill_server {
            (&mut server, client, dir.join("client.err"))
        } else {
            (&mut client, server, dir.join("server.err"))
        };
        victim.0.kill().expect("kill -9");
        let _ = victim.0.wait();
        let (code, said) = ended(&mut other, &err);
        assert_eq!(code, Some(1), "{said}");
        // (as a NIC shows it: the disconnect, or a request's retries exceeded, whichever the
        // process hears first)
        let told = said.contains("the peer went away") || said.contains("RETRY_EXC_ERR");
        assert!(told, "{said}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
