//! `corelink-perf`: perftest-style benchmarks on the corelink engine.
//!
//! ```text
//! corelink-perf TEST [options] [SERVER_ADDR]
//!   TEST: write_bw write_lat read_bw read_lat send_bw send_lat atomic_bw atomic_lat
//!         rpc_lat rpc_bw (through corelink-rpc; --with-send runs send_lat / send_bw beside)
//! corelink-perf baseline memcpy|ring_pingpong|tcp_lat|tcp_bw [-s SIZE | -a] [-n ITERS] [--json] [SERVER_ADDR]
//! corelink-perf baseline raw_write|raw_TEST [the test's options] [SERVER_ADDR]
//! ```
//!
//! Without SERVER_ADDR on `ibverbs` it is the server (it serves one client, until that client
//! disconnects); with it, the client, which runs the test and prints perftest's table (or, with
//! `--json`, one JSON object per size). On `soft` server and client run in one process on one
//! engine connected to itself (`--loopback`, the default there), or as two processes
//! (`--server`, and a client given SERVER_ADDR) on one host. See
//! `corelink_apps::perf::engine_run` for how each test is measured.
//!
//! Exit status: 0 on success, 1 on a failure at run time, 2 on bad usage, on a combination
//! verbs forbids, or on something the engine does not support yet.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use corelink_apps::perf::baseline::{self, BaselineKind, BaselineOpts};
use corelink_apps::perf::engine_run::{self, RunInfo};
use corelink_apps::perf::opts::{
    Explicit, PerfError, PerfOpts, Prov, Role, Test, Transport, DEFAULT_PORT, MAX_BYTES_IN_FLIGHT,
    RAW_BASELINES, SEND_WINDOW,
};
use corelink_apps::perf::verbs_run::{self, VerbsInfo};
use corelink_apps::perf::{all_sizes, plot, Latency, Report};

const AFTER_HELP: &str = "\
Tests run on RC over the corelink engine. Latency is one-way (half the round trip) for
send_lat and write_lat (ping-pongs; write_lat's writes land where the other side polls its
memory, as perftest's do), the full round trip for read_lat and atomic_lat, as perftest
reports them. With --quiet a ping-pong's pings and pongs go quiet (Cx::send_quiet,
Cx::write_quiet: each answer says its request arrived, so one completion in -Q is asked for;
perftest, and the default, ask for each). Not supported by the engine yet (exit 2): one-sided
messages over 1 MiB. -c UC, -c UD and --use-srq run on verbs directly, as perftest does (queue
pairs connected by hand after an exchange over a TCP socket on -p; -T 1 there; latency tests
on one QP; UD messages of at most the port MTU, which is also UD send_bw's default size).

Examples:
  corelink-perf write_bw -s 65536 -n 1000                     # soft, loopback
  corelink-perf send_lat -a --json --plot send_lat.svg
  corelink-perf read_bw --provider ibverbs                    # server
  corelink-perf read_bw --provider ibverbs 10.0.0.1           # client
  corelink-perf send_lat --provider soft --server             # soft, two processes: server
  corelink-perf send_lat --provider soft 127.0.0.1            # and client
  corelink-perf baseline memcpy -a
  corelink-perf baseline raw_write -l 16 -Q 64                # write_bw 8 B, a verbs loop
  corelink-perf baseline raw_read_lat -s 8                    # read_lat, a verbs loop
  corelink-perf rpc_lat -s 8 --with-send --rounds 5 --json    # send_lat, rpc_lat, 5 times

rpc_lat and rpc_bw are send_lat and send_bw through the RPC layer (corelink-rpc), on the
same engine, core map and receives: rpc_lat echo calls one at a time (one-way, half the round
trip, as send_lat), rpc_bw a window of calls answered with empty responses (the message rate
counts calls). --with-send runs the engine's send_lat (send_bw) with the same options before
each, in the same process; --rounds N alternates the two N times.

baseline raw_write is write_bw (8 B unless -s) as a hand-written verbs loop on RC, no engine,
with write_bw's -l, -Q, -t, -n/-D and provider options: the floor any engine on that provider
can reach (the loop that -c UC runs; reported as baseline_raw_write). baseline raw_TEST does
the same for the other tests but the RPC ones (raw_write_lat, raw_read_bw, raw_read_lat,
raw_send_bw, raw_send_lat, raw_atomic_bw, raw_atomic_lat; reported as baseline_raw_TEST).";

#[derive(Parser, Debug)]
#[command(
    name = "corelink-perf",
    about = "perftest-style benchmarks on the corelink engine",
    after_help = AFTER_HELP
)]
struct Cli {
    // (help in the attribute: a doc comment's brackets would be links to rustdoc)
    #[arg(
        required = true,
        num_args = 1..=3,
        value_name = "TEST [SERVER_ADDR]",
        help = "TEST [SERVER_ADDR], or: baseline KIND [SERVER_ADDR]"
    )]
    args: Vec<String>,
    /// transport: RC, UC or UD
    #[arg(short = 'c', long = "connection", default_value = "RC")]
    connection: String,
    /// message size in bytes (K and M suffixes allowed)
    #[arg(short = 's', long = "size", value_parser = parse_size)]
    size: Option<usize>,
    /// all sizes from 2 B to 8 MiB
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// iterations per size (default 5000 for bandwidth, 1000 for latency)
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// run each size for this many seconds instead of -n
    #[arg(short = 'D', long = "duration")]
    duration: Option<u64>,
    /// queue pairs per connection [default: 1; with --config: the map's worker.qps.per_conn]
    #[arg(short = 'q', long = "qp")]
    qps: Option<u32>,
    /// requests posted with one doorbell at most (1: doorbell batching off) [default: 16; with
    /// --config: the map's worker.batching.post_list]
    #[arg(short = 'l', long = "post_list")]
    post_list: Option<u32>,
    /// one request in this many asks for a completion (1: selective signalling off) [default:
    /// 16; with --config: the map's worker.batching.signal_every]
    #[arg(short = 'Q', long = "cq-mod")]
    cq_mod: Option<u32>,
    /// post each request at once, bypassing the engine's scheduler (the flat path)
    #[arg(long)]
    flat: bool,
    /// send_lat, write_lat: pings and pongs go quiet, one completion in -Q asked for (each
    /// answer says its request arrived; perftest asks for each); give the server --quiet too
    #[arg(long)]
    quiet: bool,
    /// no read merging (with --hot-records)
    #[arg(long = "no-merge")]
    no_merge: bool,
    /// requests in arrival order (no priority classes)
    #[arg(long = "no-priority")]
    no_priority: bool,
    /// reads hit one of N hot records 9 times in 10 (a skewed workload; merging on)
    #[arg(long = "hot-records", default_value_t = 0)]
    hot_records: u32,
    /// during a read test, keep N background writes in flight on the connection (mixed load)
    #[arg(long = "bg-writes", default_value_t = 0)]
    bg_writes: usize,
    /// bytes per background write
    #[arg(long = "bg-size", default_value_t = 4096, value_parser = parse_size)]
    bg_size: usize,
    /// work requests per QP on the device at most (more wait in the engine's scheduler)
    #[arg(long = "max-outstanding")]
    max_outstanding: Option<u32>,
    /// inline bytes (the core map's worker.max_inline)
    #[arg(short = 'I', long = "inline_size")]
    inline: Option<u32>,
    /// use a shared receive queue
    #[arg(long = "use-srq")]
    use_srq: bool,
    /// requests a bandwidth test keeps in flight
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: usize,
    /// RDMA device
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// device port
    #[arg(short = 'i', long = "ib-port")]
    ib_port: Option<u8>,
    /// GID index
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<u32>,
    /// the server's port (rdma_cm)
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    port: u16,
    /// server: the address to listen on (default: $CORELINK_IP on ibverbs, else any)
    #[arg(long)]
    bind: Option<IpAddr>,
    /// provider (default: the core map's, else soft)
    #[arg(long, value_parser = ["soft", "ibverbs"])]
    provider: Option<String>,
    /// core map (TOML)
    #[arg(long)]
    config: Option<PathBuf>,
    /// workers, each running one client (needs that many worker cores)
    #[arg(short = 'T', long = "workers", default_value_t = 1)]
    workers: usize,
    /// server and client in this process, on one engine connected to itself (default on soft)
    #[arg(long)]
    loopback: bool,
    /// serve one client (the default on ibverbs without SERVER_ADDR); on soft, server and
    /// client meet on the fabric CORELINK_SOFT_FABRIC names (default: corelink-perf)
    #[arg(long, conflicts_with = "loopback")]
    server: bool,
    /// one JSON object per size on stdout, nothing else there
    #[arg(long)]
    json: bool,
    /// draw bandwidth or latency against message size into this SVG file
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// rpc_lat / rpc_bw: run the engine's send_lat / send_bw with the same options before
    /// each, in this process
    #[arg(long = "with-send")]
    with_send: bool,
    /// rpc_lat / rpc_bw: run this many times (with --with-send: send, rpc, send, rpc, ...)
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// rpc_lat / rpc_bw: send every RPC message alone (by default the small messages of one
    /// pass of the worker's loop to one peer go packed in one send)
    #[arg(long = "no-pack")]
    no_pack: bool,
    /// give up after this many seconds (default: 600 for a client; a server waits for ever)
    #[arg(long)]
    timeout: Option<u64>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{s:?} is not a size"))
}

fn server_addr(s: &str, port: u16) -> Result<SocketAddr, PerfError> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, port)))
        .map_err(|_| PerfError::Usage(format!("SERVER_ADDR {s:?}: an IP address or IP:PORT")))
}

fn provider_of(cli: &Cli) -> Result<Prov, PerfError> {
    Ok(match cli.provider.as_deref() {
        Some("ibverbs") => Prov::Ibverbs,
        Some(_) => Prov::Soft,
        None => match &cli.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| PerfError::Usage(format!("{}: {e}", p.display())))?;
                match corelink_config::parse(&text)
                    .map_err(|e| PerfError::Usage(format!("{}: {e}", p.display())))?
                    .provider
                {
                    corelink_config::ProviderKind::Ibverbs => Prov::Ibverbs,
                    corelink_config::ProviderKind::Soft => Prov::Soft,
                }
            }
            None => Prov::Soft,
        },
    })
}

fn sizes(cli: &Cli, default: usize) -> Vec<usize> {
    match (cli.all, cli.size) {
        (true, _) => all_sizes(),
        (false, Some(s)) => vec![s],
        (false, None) => vec![default],
    }
}

/// Builds the options of a `TEST` run (with `raw`: of `baseline raw_TEST`, the test on the
/// verbs runner; `raw_write`, `write_bw`'s, 8 B by default); returns them with notes for the header.
fn perf_opts(
    cli: &Cli,
    test: Test,
    addr: Option<&str>,
    raw: bool,
) -> Result<(PerfOpts, Vec<String>), PerfError> {
    let mut o = PerfOpts::new(test);
    o.raw = raw;
    o.no_pack = cli.no_pack;
    o.transport = Transport::parse(&cli.connection)
        .ok_or_else(|| PerfError::Usage(format!("-c {}: RC, UC or UD", cli.connection)))?;
    o.sizes = sizes(cli, if raw && test == Test::WriteBw { 8 } else { o.sizes[0] });
    if o.transport == Transport::Ud && cli.size.is_none() && !cli.all && !test.is_lat() {
        o.sizes.clear(); // verbs_run: one message of the port MTU
    }
    if let Some(n) = cli.iters {
        o.iters = n;
    }
    o.duration = cli.duration.map(Duration::from_secs);
    o.qps = cli.qps.unwrap_or(1);
    o.post_list = cli.post_list.unwrap_or(16);
    o.cq_mod = cli.cq_mod.unwrap_or(16);
    o.explicit = Explicit {
        post_list: cli.post_list.is_some(),
        cq_mod: cli.cq_mod.is_some(),
        qps: cli.qps.is_some(),
    };
    o.sched = corelink_apps::perf::opts::SchedOpts {
        flat: cli.flat,
        no_merge: cli.no_merge,
        no_priority: cli.no_priority,
        hot_records: cli.hot_records,
        bg_writes: cli.bg_writes,
        bg_size: cli.bg_size,
        max_outstanding: cli.max_outstanding,
        quiet: cli.quiet,
    };
    o.inline = cli.inline;
    o.use_srq = cli.use_srq;
    o.tx_depth = cli.tx_depth;
    o.device = cli.device.clone();
    o.port = cli.ib_port;
    o.gid_index = cli.gid_index;
    o.config = cli.config.clone();
    o.workers = cli.workers;
    let prov = provider_of(cli)?;
    o.provider = cli.provider.as_ref().map(|_| prov);
    o.role = match (addr, cli.loopback) {
        (Some(_), true) => {
            return Err(PerfError::Usage("--loopback runs both ends: no SERVER_ADDR".into()))
        }
        (Some(_), _) if cli.server => {
            return Err(PerfError::Usage("--server serves: no SERVER_ADDR".into()))
        }
        (Some(a), false) => Role::Client(server_addr(a, cli.port)?),
        (None, true) => Role::Loopback,
        (None, false) if cli.server => Role::Server,
        (None, false) if prov == Prov::Soft => Role::Loopback,
        (None, false) => Role::Server,
    };
    o.bind = cli.bind.map(|ip| SocketAddr::new(ip, cli.port));
    if o.role == Role::Server && o.bind.is_none() {
        let ip = std::env::var("CORELINK_IP")
            .ok()
            .and_then(|v| v.parse::<IpAddr>().ok())
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
        o.bind = Some(SocketAddr::new(ip, cli.port));
    }
    o.timeout = match (cli.timeout, o.role) {
        (Some(0), _) => None,
        (Some(t), _) => Some(Duration::from_secs(t)),
        (None, Role::Server) => None,
        (None, _) => Some(Duration::from_secs(600)),
    };
    o.progress = o.sizes.len() > 1 || o.duration.is_some();
    let notes = o.check(cli.all)?;
    Ok((o, notes))
}

fn fmt_sizes(s: &[usize]) -> String {
    match s {
        [one] => one.to_string(),
        [first, .., last] => format!("{first} .. {last} ({} sizes)", s.len()),
        [] => "-".into(),
    }
}

fn header_block(o: &PerfOpts, info: &RunInfo, notes: &[String]) -> String {
    let line = "-".repeat(87);
    let mode = match o.role {
        Role::Loopback if info.worker_cores.len() == 1 => format!(
            "loopback: server and client on one engine connected to itself; one worker \
             (core {}), so both ends share it (different workers need 2 worker cores)",
            info.worker_cores[0]
        ),
        Role::Loopback => {
            "loopback: server and client on one engine connected to itself; each worker runs \
             a client, the accepted ends are placed round-robin"
                .into()
        }
        Role::Server => format!(
            "server, listening on {}; serves one client until it disconnects",
            info.addr.map_or("-".into(), |a| a.to_string())
        ),
        Role::Client(a) => format!("client of {a}"),
    };
    let depth = if o.test.is_lat() {
        "1 (latency test)".to_string()
    } else {
        format!(
            "{} (at most {} MiB in flight{})",
            o.tx_depth,
            MAX_BYTES_IN_FLIGHT >> 20,
            if o.test.verb() == corelink_apps::perf::opts::Verb::Send {
                format!(", {SEND_WINDOW} for sends: the receives posted per connection")
            } else {
                String::new()
            }
        )
    };
    let mut s = format!(
        "{line}\n{:^87}\n Provider        : {:<14} Device : {}\n \
         Transport type  : {:<14} QPs    : {} per connection (engine, rdma_cm)\n \
         Mode            : {mode}\n \
         Workers         : {} (cores {:?}), control core {}{}\n \
         TX depth        : {depth}\n \
         Max inline      : {} B   Post list: {}   Signalled: one in {}\n \
         Scheduler       : {}\n \
         {}\n \
         Sizes           : {}\n",
        o.test.title(),
        info.provider,
        info.device,
        o.transport.name(),
        info.lanes,
        info.worker_cores.len(),
        info.worker_cores,
        info.control_core,
        match info.yield_after {
            0 => String::new(),
            n => format!("; idle, they yield their cores after {n} empty polls"),
        },
        info.max_inline,
        info.post_list,
        info.signal_every,
        sched_line(o),
        match o.duration {
            Some(d) => format!("Duration        : {} s per size", d.as_secs()),
            None => format!("Iterations      : {} per size", o.iters),
        },
        fmt_sizes(&o.sizes),
    );
    if o.test.is_lat() {
        let how = match o.test.lat_divisor() {
            d if d > 1.0 => "one-way (half the round trip)",
            _ => "full round trip",
        };
        s.push_str(&format!(" Latency         : {how}\n"));
    }
    if o.test.is_rpc() {
        let packing = match o.no_pack {
            true => "off (--no-pack): every message in a send of its own".to_string(),
            false => format!(
                "on: a pass's messages of at most {} B to one peer after its first share sends",
                corelink_rpc::DEFAULT_PACK_MAX
            ),
        };
        s.push_str(&format!(" RPC packing     : {packing}\n"));
    }
    for n in notes {
        s.push_str(&format!(" Note            : {n}\n"));
    }
    s.push_str(&line);
    s
}

fn table_header(lat: bool) -> String {
    let r = Report { lat: lat.then(Latency::default), ..Report::default() };
    r.header()
}

fn run_test(cli: &Cli, test: Test, addr: Option<&str>, raw: bool) -> Result<(), PerfError> {
    let (o, notes) = perf_opts(cli, test, addr, raw)?;
    let json = cli.json;
    let show = |block: String| {
        if json {
            eprintln!("{block}");
        } else {
            println!("{block}");
            if o.role != Role::Server {
                println!("{}", table_header(o.test.is_lat()));
            }
        }
    };
    let mut on_report = |r: &Report| {
        if json {
            println!("{}", r.to_json());
        } else {
            println!("{}", r.row());
        }
    };
    let reports = if o.on_verbs() {
        let mut on_start = |i: &VerbsInfo| show(verbs_run::header_block(&o, i, &notes));
        verbs_run::run(&o, &mut on_start, &mut on_report)?
    } else {
        let mut on_start = |i: &RunInfo| show(header_block(&o, i, &notes));
        engine_run::run(&o, &mut on_start, &mut on_report)?
    };
    if o.role == Role::Server {
        let m = "corelink-perf server: the client disconnected; done";
        if json {
            eprintln!("{m}");
        } else {
            println!("{m}");
        }
    } else if !json {
        println!("{}", "-".repeat(87));
    }
    if let Some(path) = &cli.plot {
        if o.role == Role::Server {
            eprintln!("corelink-perf: --plot: a server has nothing to plot");
        } else {
            let title = format!(
                "corelink-perf {} ({}, {})",
                o.report_name(),
                reports_provider(&reports),
                o.transport.name()
            );
            plot::plot(path, &title, &reports)
                .map_err(|e| PerfError::Run(format!("--plot {}: {e}", path.display())))?;
            eprintln!("corelink-perf: plot written to {}", path.display());
        }
    }
    Ok(())
}

/// An RPC test, `--rounds` times, each after the engine's send test when `--with-send`:
/// the two alternate in one process, on the same options.
fn run_rpc(cli: &Cli, test: Test, addr: Option<&str>) -> Result<(), PerfError> {
    if cli.rounds == 0 {
        return Err(PerfError::Usage("--rounds 0: at least one".into()));
    }
    if cli.plot.is_some() && (cli.with_send || cli.rounds > 1) {
        return Err(PerfError::Usage(
            "--plot draws one run: not with --with-send or --rounds".into(),
        ));
    }
    for _ in 0..cli.rounds {
        if let (true, Some(send)) = (cli.with_send, test.send_counterpart()) {
            run_test(cli, send, addr, false)?;
        }
        run_test(cli, test, addr, false)?;
    }
    Ok(())
}

fn reports_provider(r: &[Report]) -> String {
    r.first().and_then(|r| r.provider.clone()).unwrap_or_default()
}

/// The baselines, as the usage errors list them.
const BASELINES: &str =
    "memcpy, ring_pingpong, tcp_lat, tcp_bw, or raw_TEST (raw_write, raw_read_lat, ...)";

fn run_baseline(cli: &Cli, kind: &str, addr: Option<&str>) -> Result<(), PerfError> {
    let kind = match kind {
        "memcpy" => BaselineKind::Memcpy,
        "ring_pingpong" => BaselineKind::RingPingpong,
        "tcp_lat" => BaselineKind::TcpLat,
        "tcp_bw" => BaselineKind::TcpBw,
        // The test's loop on the verbs runner, with its options and output.
        k if k.starts_with("raw_") => {
            return match PerfOpts::raw_test(k) {
                Some(t) => run_test(cli, t, addr, true),
                None => Err(PerfError::Usage(format!("baseline {k:?}: {RAW_BASELINES}"))),
            }
        }
        k => return Err(PerfError::Usage(format!("baseline {k:?}: {BASELINES}"))),
    };
    let default = match kind {
        BaselineKind::Memcpy | BaselineKind::TcpBw => 65536,
        BaselineKind::RingPingpong | BaselineKind::TcpLat => 8,
    };
    let o = BaselineOpts {
        sizes: sizes(cli, default),
        iters: cli.iters.unwrap_or(1000),
        duration: cli.duration.map(Duration::from_secs),
        server: addr.map(|a| server_addr(a, cli.port)).transpose()?,
        cores: (0, 1),
        tx_depth: cli.tx_depth.max(1),
    };
    if o.iters == 0 {
        return Err(PerfError::Usage("-n 0: at least one iteration".into()));
    }
    let reports = baseline::run(kind, &o).map_err(PerfError::Run)?;
    for (i, r) in reports.iter().enumerate() {
        if cli.json {
            println!("{}", r.to_json());
        } else {
            if i == 0 {
                println!("{}", r.header());
            }
            println!("{}", r.row());
        }
    }
    if let Some(path) = &cli.plot {
        plot::plot(path, &format!("corelink-perf baseline {kind:?}"), &reports)
            .map_err(|e| PerfError::Run(format!("--plot {}: {e}", path.display())))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args: Vec<&str> = cli.args.iter().map(String::as_str).collect();
    let res = match args.as_slice() {
        ["baseline", kind] => run_baseline(&cli, kind, None),
        ["baseline", kind, addr] => run_baseline(&cli, kind, Some(addr)),
        ["baseline"] => Err(PerfError::Usage(format!("baseline KIND: {BASELINES}"))),
        [test, rest @ ..] if rest.len() <= 1 => match Test::from_name(test) {
            Some(t) if t.is_rpc() => run_rpc(&cli, t, rest.first().copied()),
            Some(_) if cli.with_send || cli.rounds != 1 => {
                Err(PerfError::Usage("--with-send and --rounds go with rpc_lat / rpc_bw".into()))
            }
            Some(t) => run_test(&cli, t, rest.first().copied(), false),
            None => Err(PerfError::Usage(format!(
                "TEST {test:?}: one of {} {}, or baseline",
                Test::ALL.map(Test::name).join(" "),
                Test::RPC.map(Test::name).join(" ")
            ))),
        },
        _ => Err(PerfError::Usage("TEST [SERVER_ADDR]: too many arguments".into())),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ PerfError::Usage(_)) => {
            eprintln!("corelink-perf: {e} (see --help)");
            ExitCode::from(2)
        }
        Err(e @ PerfError::Unsupported(_)) => {
            eprintln!("corelink-perf: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("corelink-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The header's scheduler line.
fn sched_line(o: &PerfOpts) -> String {
    let s = &o.sched;
    if s.flat {
        return "flat (each request posted at once, signalled)".into();
    }
    let merge = match (s.hot_records, s.no_merge) {
        (0, _) => "merging off (one work request per iteration)".to_string(),
        (n, false) => format!("merging on, {n} hot records"),
        (n, true) => format!("merging off, {n} hot records"),
    };
    let prio = if s.no_priority { "arrival order" } else { "priorities on" };
    let bg = match s.bg_writes {
        0 => String::new(),
        n => format!(", {n} background writes of {} B", s.bg_size),
    };
    let out = s.max_outstanding.map(|n| format!(", {n} per QP on the device")).unwrap_or_default();
    let quiet = if s.quiet { ", quiet pings and pongs" } else { "" };
    format!("{prio}, {merge}{bg}{out}{quiet}")
}
