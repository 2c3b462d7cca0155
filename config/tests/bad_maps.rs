//! Every file in `tests/bad/` is a core map that must be refused; its first line says
//! (`# expect: ...`) what the message must contain. Validation runs against a fixed topology:
//! 8 cores, 0-3 on NUMA node 0 and 4-7 on node 1, and device `mlx5_0` on node 0.

use corelink_config::{parse, Core, StaticTopology};

fn topology() -> StaticTopology {
    StaticTopology {
        cores: (0..8).map(|i| Core { os_index: i, numa_node: Some((i / 4) as u32) }).collect(),
        devices: vec![("mlx5_0".into(), 0)],
    }
}

#[test]
fn bad_maps_are_refused_with_their_message() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 10, "the bad maps are there");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let want =
            text.lines().next().and_then(|l| l.strip_prefix("# expect: ")).unwrap_or_else(|| {
                panic!("{}: first line must be `# expect: <message>`", f.display())
            });
        let got = match parse(&text) {
            Err(e) => e.to_string(),
            Ok(map) => match map.validate(&topology()) {
                Err(e) => e.to_string(),
                Ok(v) => panic!("{} was accepted: {v:?}", f.display()),
            },
        };
        assert!(got.contains(want), "{}:\n  got:      {got}\n  expected: {want}", f.display());
    }
}

#[test]
fn a_numa_warning_names_the_worker_and_the_nodes() {
    let map = parse("provider = \"ibverbs\"\ndevice = \"mlx5_0\"\nworkers = [1, 6]").unwrap();
    let v = map.validate(&topology()).unwrap();
    assert_eq!(v.warnings.len(), 1);
    assert!(
        v.warnings[0]
            .to_string()
            .starts_with("`workers[1] = 6` is on NUMA node 1 but device mlx5_0 is on node 0"),
        "{}",
        v.warnings[0]
    );
}
