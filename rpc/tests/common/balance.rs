//! Load balancing, generic over the provider: a client opens a session to each of three
//! servers, groups them and calls the group. The calls spread over the three; a server shut
//! down mid-run is taken out (its session closes) and the calls made after go to the two left,
//! each ending once with its answer. (`balance_soft.rs` goes further on `soft`: a slow server,
//! a group with no member up, merging per session, no allocation.)

use std::sync::mpsc::channel;

use super::*;

/// Calls the group `g` once for each tag in `tags` (the request is the tag), telling `tx` each
/// outcome and `picks` the session each call went to.
fn spread<P: Provider>(
    rpc: &mut Rpc<'_, P>,
    g: corelink_rpc::GroupId,
    tags: std::ops::Range<u64>,
    tx: &Sender<Outcome>,
    picks: &Sender<(u64, SessionId)>,
) {
    for tag in tags {
        let tx = tx.clone();
        let request = tag.to_le_bytes();
        let made = rpc.call_group(g, ECHO, &request, LONG, move |_, r| {
            let _ = tx.send((tag, r.map(<[u8]>::to_vec)));
        });
        let (session, _) = made.unwrap();
        picks.send((tag, session)).unwrap();
    }
}

/// The check: `servers` serve, `client` calls their group.
pub fn a_group_spreads_calls_and_avoids_a_downed_server<P: Provider>(
    servers: [&Site; 3],
    client: &Site,
) {
    let mut up: Vec<Rig<P>> =
        servers.iter().map(|s| Rig::<P>::start(&s.map(""), 8, || |_: &mut _, _| {})).collect();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.listen).collect();
    let (tx, rx) = outcomes();
    let (picks_tx, picks) = channel::<(u64, SessionId)>();
    let (sessions_tx, sessions) = channel::<Vec<SessionId>>();
    let caller = Rig::<P>::start(&client.map(""), 8, move || {
        let (tx, picks_tx, sessions_tx, addrs) =
            (tx.clone(), picks_tx.clone(), sessions_tx.clone(), addrs.clone());
        let (mut mine, mut connected, mut group) = (Vec::new(), 0, None);
        move |rpc: &mut Rpc<'_, P>, ev| match ev {
            Ev::Start => mine = addrs.iter().map(|a| rpc.connect(*a).unwrap()).collect(),
            Ev::Session(_, SessionEvent::Connected) => {
                connected += 1;
                if connected == 3 {
                    let g = rpc.group(&mine).unwrap();
                    group = Some(g);
                    sessions_tx.send(mine.clone()).unwrap();
                    spread(rpc, g, 0..30, &tx, &picks_tx);
                }
            }
            // The downed server's session: the group goes on without it.
            Ev::Session(s, SessionEvent::Closed) if group.is_some() && mine.first() == Some(&s) => {
                if let Some(g) = group {
                    spread(rpc, g, 30..50, &tx, &picks_tx);
                }
            }
            _ => {}
        }
    });
    let ids = sessions.recv_timeout(HANG).expect("three sessions");
    let served =
        |picks: &[(u64, SessionId)], s: SessionId| picks.iter().filter(|p| p.1 == s).count();
    let first: Vec<(u64, SessionId)> = (0..30).map(|_| picks.recv_timeout(HANG).unwrap()).collect();
    let mut answers = take(&rx, 30);
    answers.sort_by_key(|a| a.0);
    for (tag, r) in &answers {
        assert_eq!(r.as_deref().ok(), Some(&tag.to_le_bytes()[..]), "call {tag}: {r:?}");
    }
    let spread_over: Vec<usize> = ids.iter().map(|&s| served(&first, s)).collect();
    assert!(spread_over.iter().all(|&n| n >= 5), "calls per server: {spread_over:?}");
    // Server 0 goes down: the later calls go to the other two, and each ends once.
    let down = up.remove(0);
    down.engine.shutdown().unwrap();
    let later: Vec<(u64, SessionId)> = (0..20).map(|_| picks.recv_timeout(HANG).unwrap()).collect();
    let mut answers = take(&rx, 20);
    answers.sort_by_key(|a| a.0);
    for ((tag, r), want) in answers.iter().zip(30u64..) {
        assert_eq!(*tag, want, "each call ends once");
        assert_eq!(r.as_deref().ok(), Some(&tag.to_le_bytes()[..]), "call {tag}: {r:?}");
    }
    assert_eq!(served(&later, ids[0]), 0, "none to the downed server: {later:?}");
    assert!(served(&later, ids[1]) > 0 && served(&later, ids[2]) > 0, "{later:?}");
    let handled: u64 = up.iter().map(|r| r.metrics_when(|m| m.handled > 0).handled).sum();
    assert!(handled >= 20, "the two left ran the later calls: {handled}");
    caller.engine.shutdown().unwrap();
    for r in up {
        r.engine.shutdown().unwrap();
    }
}
