//! Regression test: corelink-perf used to overwrite a `--config` core map's pools, batching,
//! CQ and send-queue depths without a word, so that a validation error could name a key the
//! user never set. Now it keeps every value that suffices and reports each one it changes
//! (`fit_map`, a pure function; and end to end, the notes the binary prints on stderr).

use std::path::{Path, PathBuf};
use std::process::Command;

use corelink_apps::perf::engine_run::{fit_map, MapChange};
use corelink_apps::perf::opts::{PerfOpts, Test};
use corelink_config::{CoreMap, Topology};

/// A small core map on soft: depths below what `-t 128` needs, batching and lanes of its own.
const MAP: &str = r#"
provider = "soft"
control_core = 0
workers = [1]

[worker]
cq_depth = 128
send_queue_depth = 64
recv_queue_depth = 32

[[worker.pools]]
size = 256
count = 1024

[[worker.pools]]
size = 4096
count = 64

[worker.batching]
post_list = 8
signal_every = 4

[worker.scheduler]
merge_reads = true

[worker.qps]
per_conn = 2
"#;

/// `MAP` written to a temporary file (as `--config` reads it).
fn map_file(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("corelink-{name}-{}.toml", std::process::id()));
    std::fs::write(&p, MAP).expect("write the core map");
    p
}

fn load(path: &Path) -> CoreMap {
    corelink_config::parse(&std::fs::read_to_string(path).expect("read")).expect("parse")
}

fn write_bw(config: &Path) -> PerfOpts {
    let mut o = PerfOpts::new(Test::WriteBw);
    o.sizes = vec![8];
    o.post_list = 16; // the command line's defaults, not given explicitly
    o.cq_mod = 16;
    o.config = Some(config.to_path_buf());
    o.check(false).expect("valid");
    o
}

fn keys(c: &[MapChange]) -> Vec<&str> {
    c.iter().map(|c| c.key.as_str()).collect()
}

#[test]
fn a_config_map_keeps_what_suffices_and_names_what_changes() {
    let path = map_file("fit");
    let o = write_bw(&path);
    let mut map = load(&path);
    let changes = fit_map(&mut map, &o, 2, None, true);
    // The run needs deeper queues; nothing else changes (the receives are registered apart
    // from the pools, and the map's defaults hold them).
    assert_eq!(keys(&changes), ["worker.send_queue_depth", "worker.cq_depth"], "{changes:#?}");
    let sq = &changes[0];
    assert_eq!((sq.from.as_str(), sq.to.as_str()), ("64", "144"));
    assert!(sq.why.contains("-t 128"), "{sq}");
    assert!(sq.to_string().starts_with("--config: worker.send_queue_depth 64 -> 144 ("), "{sq}");
    let w = &map.worker;
    assert_eq!((w.send_queue_depth, w.cq_depth, w.recv_queue_depth), (144, 1536, 32));
    // What sufficed is the user's.
    assert_eq!((w.batching.post_list, w.batching.signal_every), (8, 4));
    assert_eq!(w.qps.per_conn, 2);
    assert!(w.scheduler.merge_reads, "a write test leaves read merging alone");
    assert_eq!((w.pools[0].size, w.pools[0].count), (256, 1024));
    assert_eq!(w.pools.len(), 2);
    // The fitted map validates.
    map.validate(&corelink_config::StaticTopology::uniform(2)).expect("valid");

    // Flags given on the command line win, and say so.
    let mut o2 = o.clone();
    o2.cq_mod = 64;
    o2.explicit.post_list = true;
    o2.explicit.cq_mod = true;
    let mut map = load(&path);
    let changes = fit_map(&mut map, &o2, 2, None, true);
    let k = keys(&changes);
    assert!(k.contains(&"worker.batching.post_list"), "{k:?}");
    assert!(k.contains(&"worker.batching.signal_every"), "{k:?}");
    assert!(!k.contains(&"worker.qps.per_conn"), "{k:?}");
    assert_eq!((map.worker.batching.post_list, map.worker.batching.signal_every), (16, 64));

    // A plain read test needs merging off (one work request per read).
    let mut r = PerfOpts::new(Test::ReadBw);
    r.sizes = vec![64];
    r.config = Some(path.clone());
    let mut map = load(&path);
    let changes = fit_map(&mut map, &r, 2, None, true);
    assert!(keys(&changes).contains(&"worker.scheduler.merge_reads"), "{changes:#?}");
    assert!(!map.worker.scheduler.merge_reads);

    // A map made for the run (no --config) takes the run's values and reports nothing.
    let mut o3 = o.clone();
    o3.config = None;
    let mut map = CoreMap::default();
    assert!(fit_map(&mut map, &o3, 2, None, false).is_empty());
    assert_eq!((map.worker.batching.post_list, map.worker.batching.signal_every), (16, 16));
    assert_eq!(map.worker.qps.per_conn, 1);
    let _ = std::fs::remove_file(&path);
}

/// End to end: the binary prints one note per changed key on stderr, and none for the rest.
#[test]
fn the_binary_prints_the_notes() {
    let path = map_file("notes");
    let out = Command::new(env!("CARGO_BIN_EXE_corelink-perf"))
        .args(["write_bw", "-s", "8", "-n", "2000", "-Q", "32", "--json", "--config"])
        .arg(&path)
        .output()
        .expect("corelink-perf runs");
    let _ = std::fs::remove_file(&path);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("note: --config:")).collect();
    for k in
        ["worker.send_queue_depth 64 -> 144", "worker.cq_depth 128 -> ", "signal_every 4 -> 32"]
    {
        assert_eq!(notes.iter().filter(|n| n.contains(k)).count(), 1, "{k}: {err}");
    }
    for k in ["post_list", "per_conn", "merge_reads", "size=256"] {
        assert!(!notes.iter().any(|n| n.contains(k)), "{k} sufficed: {err}");
    }
    assert!(
        err.contains("Post list: 8   Signalled: one in 32"),
        "the header shows the map's: {err}"
    );
}

/// corelink-perf's own map has an idle worker yield its core exactly where the run's threads
/// (its workers, the control core, the main thread) outnumber the machine's cores, and the
/// header says so; a `--config` map keeps its own (here none).
#[test]
fn its_own_map_yields_idle_workers_only_where_threads_outnumber_cores() {
    let cores = corelink_config::MachineTopology::load().expect("the topology").cores().len();
    let run = |extra: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_corelink-perf"))
            .args(["write_bw", "-s", "8", "-n", "2000"])
            .args(extra)
            .output()
            .expect("corelink-perf runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        let line = text.lines().find(|l| l.contains("Workers")).expect("a Workers line");
        line.to_string()
    };
    let own = run(&[]);
    let yields = 1 + 2 > cores;
    assert_eq!(own.contains("yield their cores after 64 empty polls"), yields, "{cores}: {own}");
    let path = map_file("no-yield");
    let given = run(&["--config".as_ref(), path.as_os_str()]);
    let _ = std::fs::remove_file(&path);
    assert!(!given.contains("yield"), "{given}");
}
