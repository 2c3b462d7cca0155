//! `corelink-conformance`: runs the conformance suite's scenarios on a provider and reports what
//! each observed (completions, atomics' old values, a checksum of the memory read back), one
//! JSON object per scenario with `--json`; `compare A B` compares two such reports.
//!
//! ```text
//! corelink-conformance --provider soft --json > soft.jsonl
//! corelink-conformance --provider soft --processes 2 --json > soft-2.jsonl  # side B in a peer
//! corelink-conformance --provider ibverbs --device rxe0 --json > rxe.jsonl   # in the guest
//! corelink-conformance compare soft.jsonl rxe.jsonl
//! ```

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use corelink_apps::fidelity::{compare, Row};
use corelink_tests::{record, split, Case, Target};
use corelink_verbs::Provider;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ProviderArg {
    Soft,
    Ibverbs,
}

#[derive(Parser, Debug)]
#[command(version, about = "corelink's fidelity report: the conformance scenarios on one provider")]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Provider to run on.
    #[arg(long, value_enum, default_value = "soft")]
    provider: ProviderArg,
    /// Device (default: soft0 for soft; $CORELINK_IBV_DEVICE for ibverbs).
    #[arg(long)]
    device: Option<String>,
    /// Port (default: $CORELINK_IBV_PORT or 1).
    #[arg(long)]
    port: Option<u8>,
    /// GID index (default: $CORELINK_IBV_GID_INDEX or the first IPv4-mapped GID).
    #[arg(long)]
    gid_index: Option<u32>,
    /// IP address the connection-manager scenarios listen on (default: $CORELINK_IP or the GID's).
    #[arg(long)]
    ip: Option<std::net::IpAddr>,
    /// Print one JSON object per scenario instead of a table.
    #[arg(long)]
    json: bool,
    /// Run only the scenarios whose names contain this.
    #[arg(long)]
    filter: Option<String>,
    /// Processes a scenario runs in: 2 puts each scenario's side B in a second process (this
    /// program again), across `soft`'s fabric (soft only).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    processes: u8,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Compares two JSON reports scenario by scenario; exits 1 if any scenario differs.
    Compare {
        /// The first report (JSON lines).
        left: std::path::PathBuf,
        /// The second report.
        right: std::path::PathBuf,
    },
}

fn target(a: &Args) -> Result<Target, String> {
    let mut t = match a.provider {
        ProviderArg::Soft if a.processes == 2 => Target::soft_two_processes(),
        ProviderArg::Ibverbs if a.processes == 2 => {
            return Err("--processes 2 runs on soft only".into())
        }
        ProviderArg::Soft => Target::soft(),
        ProviderArg::Ibverbs => {
            if let Some(d) = &a.device {
                std::env::set_var("CORELINK_IBV_DEVICE", d);
            }
            Target::from_env().map_err(|e| format!("{e}: pass --device NAME"))?
        }
    };
    if let Some(d) = &a.device {
        t.device = d.clone();
    }
    if let Some(p) = a.port {
        t.port = p;
    }
    if a.gid_index.is_some() {
        t.gid_index = a.gid_index;
    }
    if a.ip.is_some() {
        t.cm_ip = a.ip;
    }
    Ok(t)
}

fn run<P: Provider>(a: &Args, t: &Target) -> ExitCode {
    let cases: Vec<Case> = corelink_tests::all::<P>()
        .into_iter()
        .filter(|c| a.filter.as_deref().is_none_or(|f| c.name.contains(f)))
        .collect();
    let mut failed = 0;
    let mut out = std::io::stdout().lock();
    for c in &cases {
        record::start();
        let res = (c.run)(t);
        let obs = record::take();
        if let Err(e) = &res {
            eprintln!("{}: FAILED: {e}", c.name);
            failed += 1;
        }
        let row = Row::new(c.name, res.is_ok(), &obs);
        if writeln!(out, "{}", if a.json { row.to_json() } else { row.summary() }).is_err() {
            return ExitCode::FAILURE; // the reader went away
        }
    }
    let peer = t.peer_device.as_deref().map(|d| format!(", side B on {d}")).unwrap_or_default();
    eprintln!(
        "{} scenarios on {} ({}{peer}): {} passed, {failed} failed",
        cases.len(),
        P::NAME,
        t.device,
        cases.len() - failed
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn compare_files(left: &std::path::Path, right: &std::path::Path) -> ExitCode {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let c = match read(left).and_then(|l| read(right).and_then(|r| compare(&l, &r))) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("corelink-conformance compare: {e}");
            return ExitCode::from(2);
        }
    };
    for (name, side, why) in &c.unsupported {
        let file = if *side == "left" { left } else { right };
        println!("unsupported  {name} ({}): {why}", file.display());
    }
    for (name, l, r) in &c.differ {
        println!("DIFFERS      {name}");
        println!("  {:<10} {}", left.display(), l.as_deref().unwrap_or("(missing)"));
        println!("  {:<10} {}", right.display(), r.as_deref().unwrap_or("(missing)"));
    }
    println!(
        "{} scenarios identical, {} unsupported on one side, {} differ",
        c.identical,
        c.unsupported.len(),
        c.differ.len()
    );
    if c.differ.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    // Started as the peer of a two-process run: serve the runner, nothing else.
    if let Some(res) = split::serve_if_peer() {
        return match res {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("corelink-conformance (peer process): {e}");
                ExitCode::FAILURE
            }
        };
    }
    let a = Args::parse();
    if let Some(Cmd::Compare { left, right }) = &a.cmd {
        return compare_files(left, right);
    }
    let t = match target(&a) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("corelink-conformance: {e}");
            return ExitCode::from(2);
        }
    };
    match a.provider {
        ProviderArg::Soft if a.processes == 2 => run::<split::Split>(&a, &t),
        ProviderArg::Soft => run::<corelink_verbs::soft::Soft>(&a, &t),
        #[cfg(feature = "ibverbs")]
        ProviderArg::Ibverbs => run::<corelink_verbs::ibverbs::Ibverbs>(&a, &t),
        #[cfg(not(feature = "ibverbs"))]
        ProviderArg::Ibverbs => {
            eprintln!("corelink-conformance: built without the ibverbs feature");
            ExitCode::from(2)
        }
    }
}
