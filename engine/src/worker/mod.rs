//! A worker: one pinned thread that owns its CQ, its connections' QPs, its buffer pool and its
//! requests, and runs one fixed-order loop that never blocks while it has connections
//! (`run/`): poll a bounded batch of completions and dispatch them; run the handler; take
//! external clients' submissions; post what was queued (one doorbell per connection); post
//! again the receives whose messages were handled; drain the control core's ring; finish
//! closing connections; fire due timers.
//!
//! The files here are the worker's parts, each a type with its invariants and unit tests; the
//! loop (`run/`) uses them, and they neither reach back into it nor import each other in a
//! cycle (`parts_import_no_cycle` below checks it).

mod admit;
mod cfg;
mod clients;
mod coarse;
mod completions;
mod conn;
mod conns;
mod cx;
mod handler;
mod ids;
mod intake;
mod keepalive;
mod notice;
mod on;
mod outbox;
mod primes;
mod queues;
mod ready;
mod recvs;
mod redial;
mod requests;
mod run;
mod sched;
mod timers;
mod untrusted;
mod words;

#[cfg(test)]
mod testing;

pub(crate) use cfg::WorkerCfg;
pub use completions::Completions;
pub use cx::Cx;
pub use handler::Handler;
pub use on::On;
pub use redial::{Reconnect, Redial};
pub(crate) use run::{Owned, Worker};

#[cfg(all(test, not(loom)))]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    /// The first path segments after each `super::` and `crate::worker::` in `src` (its tests
    /// and comment lines left out): the files of `worker/` that `src` imports.
    fn imports(src: &str) -> BTreeSet<String> {
        let src = src.split("#[cfg(test)]").next().unwrap_or("");
        let code: String = src
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let ident = |s: &str| -> String {
            s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
        };
        let mut out = BTreeSet::new();
        for prefix in ["super::", "crate::worker::"] {
            for (i, _) in code.match_indices(prefix) {
                let rest = &code[i + prefix.len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    // `super::{a::X, b}`: each top-level item's first segment.
                    let (mut depth, mut start) = (0usize, 0usize);
                    for (j, c) in group.char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 0 => {
                                out.insert(ident(&group[start..j]));
                                break;
                            }
                            '}' => depth -= 1,
                            ',' if depth == 0 => {
                                out.insert(ident(&group[start..j]));
                                start = j + 1;
                            }
                            _ => {}
                        }
                    }
                } else {
                    out.insert(ident(rest));
                }
            }
        }
        out.remove("");
        out
    }

    /// The worker's parts (the files of `worker/`, the loop in `run/` aside) import only other
    /// parts, never the loop or `mod.rs`'s re-exports, and never in a cycle.
    #[test]
    fn parts_import_no_cycle() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/worker");
        let mut graph = BTreeMap::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
                graph.insert(name, imports(&std::fs::read_to_string(&path).unwrap()));
            }
        }
        assert!(graph.len() > 10, "the parts were found: {:?}", graph.keys());
        for (part, deps) in &graph {
            for d in deps {
                assert!(graph.contains_key(d), "{part}.rs imports `{d}`, which is not a part");
            }
        }
        // Depth-first: a part met again while on the path closes a cycle.
        fn visit<'a>(
            g: &'a BTreeMap<String, BTreeSet<String>>,
            n: &'a str,
            path: &mut Vec<&'a str>,
            done: &mut BTreeSet<&'a str>,
        ) {
            if done.contains(n) {
                return;
            }
            assert!(!path.contains(&n), "an import cycle: {} -> {n}", path.join(" -> "));
            path.push(n);
            for d in &g[n] {
                visit(g, d, path, done);
            }
            path.pop();
            done.insert(n);
        }
        let mut done = BTreeSet::new();
        for part in graph.keys() {
            visit(&graph, part, &mut Vec::new(), &mut done);
        }
    }

    #[test]
    fn imports_are_read_from_paths_and_groups() {
        let src = "use super::a::X;\nuse super::{b::{Y, Z}, c};\n// use super::d;\n\
                   fn f() { crate::worker::e::g(); }\n#[cfg(test)]\nmod tests { use super::*; }";
        let got: Vec<String> = imports(src).into_iter().collect();
        assert_eq!(got, ["a", "b", "c", "e"]);
    }
}
