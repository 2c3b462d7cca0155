//! The handle's `Future` under tokio: one soft worker serves an echo type; tokio tasks on a
//! multi-threaded runtime call it through one `Handle` (made on the worker, moved out), many
//! calls in flight at once, and the blocking call beside them from a plain thread's view.
//!
//! Run: `cargo run -p corelink-rpc --example tokio_handle`.

use std::sync::mpsc::channel;
use std::sync::Mutex;
use std::time::Duration;

use corelink_engine::verbs::soft::Soft;
use corelink_engine::{Engine, Placement};
use corelink_rpc::{handle, Endpoint, EndpointConfig, Reject, ReqType, RpcHandler, Serve};

const ECHO: ReqType = ReqType(1);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: std::net::SocketAddr = "10.98.21.1:7000".parse()?;
    let map = corelink_config::parse(&format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{addr}\""
    ))?
    .validate(&corelink_config::MachineTopology::load()?)?;
    let res = map.map.worker.clone();
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let engine = Engine::<Soft>::start(&map, Placement::RoundRobin, move |_| {
        let mut endpoint = Endpoint::new(EndpointConfig::for_worker(&res), &res).unwrap();
        endpoint.register(ECHO, |req, resp| resp.write(req.data).map_err(|_| Reject(1))).unwrap();
        let (h, inbox) = handle(256);
        tx.lock().unwrap().send(h).unwrap();
        RpcHandler::new(endpoint, Serve).with_inbox(inbox)
    })?;
    let mut h = rx.recv_timeout(Duration::from_secs(30))?;
    let session = h.connect(addr)?;
    let timeout = Duration::from_secs(10);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build()?;
    let calls: Vec<_> = (0..1000u32)
        .map(|i| (i, h.call_async(session, ECHO, format!("call {i}").into_bytes(), timeout)))
        .collect();
    let ok = rt.block_on(async move {
        let tasks: Vec<_> = calls
            .into_iter()
            .map(|(i, call)| {
                tokio::spawn(async move { call.await.map(|r| r == format!("call {i}").as_bytes()) })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            if t.await.expect("the task ran")? {
                ok += 1;
            }
        }
        Ok::<_, corelink_rpc::RpcError>(ok)
    })?;
    println!("{ok} of 1000 calls under tokio got their echo");
    let last = h.call(session, ECHO, b"and one blocking call", timeout)?;
    println!("{}", String::from_utf8_lossy(&last));
    drop(h);
    engine.shutdown()?;
    Ok(())
}
