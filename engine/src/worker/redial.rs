//! Reconnect policies: connects a handler made with [`crate::Cx::connect_with`] (or a client
//! with [`crate::Client::connect_with`]), kept by their issuer and token so that the
//! connection is made again when it closes (for any reason but this side's own close) or when
//! a try fails, after a backoff that doubles from try to try, until the policy's tries are
//! spent. The worker waits out each backoff on its timers (`Due::Redial`) and tells the issuer
//! of every step ([`crate::Handler::on_redial`], [`crate::Event::Redial`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::handoff::{ConnectData, Origin};
use crate::request::ConnId;

/// A connect under a policy: its issuer (the handler, or a client) and its token (tokens are
/// unique per issuer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct DialKey {
    pub(crate) origin: Origin,
    pub(crate) token: u64,
}

impl DialKey {
    /// The handler's connect `token`.
    pub(crate) fn handler(token: u64) -> DialKey {
        DialKey { origin: Origin::Handler, token }
    }
}

/// How a connection this side makes is made again ([`crate::Cx::connect_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconnect {
    /// Tries after each close (or after a failed first connect) before giving up; 0: none.
    pub attempts: u32,
    /// The wait before the first try; each further try waits twice the one before.
    pub backoff: Duration,
    /// The longest wait between tries.
    pub max_backoff: Duration,
}

impl Default for Reconnect {
    /// Eight tries, from 10 ms, doubling to at most 1 s (about 2.3 s of tries in all).
    fn default() -> Self {
        Reconnect {
            attempts: 8,
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
        }
    }
}

impl Reconnect {
    /// The wait before try `attempt` (from 1).
    pub(crate) fn wait(&self, attempt: u32) -> Duration {
        let doubled = self.backoff.saturating_mul(1u32 << (attempt.saturating_sub(1)).min(20));
        doubled.min(self.max_backoff)
    }
}

/// One step of a reconnect policy, as the handler hears it.
#[derive(Debug)]
pub struct Redial<'a> {
    /// The connect's token (the one given to [`crate::Cx::connect_with`]).
    pub token: u64,
    /// This try's number, from 1 after each close.
    pub attempt: u32,
    /// How long until it goes.
    pub after: Duration,
    /// Why it is made: the last try's error (`None`: the connection closed, as
    /// [`crate::Handler::on_closed`] said just before).
    pub failed: Option<&'a crate::EngineError>,
}

/// A connect under a policy.
#[derive(Debug)]
pub(crate) struct Dial {
    addr: SocketAddr,
    private_data: ConnectData,
    policy: Reconnect,
    /// Tries made since the last close (0: the first connect, or connected).
    attempt: u32,
    /// Its connection, while it is up.
    conn: Option<ConnId>,
    /// Its next try waits on a timer.
    waiting: bool,
}

/// What to do after a try failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Try again: try `attempt` after `after` (the caller sets the timer).
    Again { attempt: u32, after: Duration },
    /// The policy is spent (or ended): the connect failed for good.
    GiveUp,
}

/// The connects under a policy, by token.
#[derive(Debug, Default)]
pub(crate) struct Redials {
    by_token: HashMap<DialKey, Dial>,
}

impl Redials {
    /// Takes on connect `token` (false: a connect under a policy has that token already).
    pub(crate) fn add(
        &mut self,
        token: DialKey,
        addr: SocketAddr,
        private_data: ConnectData,
        policy: Reconnect,
    ) -> bool {
        if self.by_token.contains_key(&token) {
            return false;
        }
        let dial = Dial { addr, private_data, policy, attempt: 0, conn: None, waiting: false };
        self.by_token.insert(token, dial);
        true
    }

    /// Whether any connect is under a policy.
    #[inline(always)]
    pub(crate) fn has_any(&self) -> bool {
        !self.by_token.is_empty()
    }

    /// Whether `token` is a connect under a policy.
    pub(crate) fn has(&self, token: DialKey) -> bool {
        self.by_token.contains_key(&token)
    }

    /// Connect `token` is up as `conn`: its tries start again from 1 at its next close.
    pub(crate) fn connected(&mut self, token: DialKey, conn: ConnId) {
        if let Some(d) = self.by_token.get_mut(&token) {
            d.conn = Some(conn);
            d.attempt = 0;
        }
    }

    /// A try of `token` failed: the next one, or the end of the policy (the dial forgotten).
    pub(crate) fn failed(&mut self, token: DialKey) -> AfterFailure {
        self.next_try(token)
    }

    /// Connection `conn` closed (`local`: this side closed it, which ends its policy): its
    /// dial's token and next try, if it is one.
    pub(crate) fn closed(&mut self, conn: ConnId, local: bool) -> Option<(DialKey, AfterFailure)> {
        let token = *self.by_token.iter().find(|(_, d)| d.conn == Some(conn))?.0;
        if local {
            self.by_token.remove(&token);
            return Some((token, AfterFailure::GiveUp));
        }
        if let Some(d) = self.by_token.get_mut(&token) {
            d.conn = None;
            d.attempt = 0;
        }
        Some((token, self.next_try(token)))
    }

    fn next_try(&mut self, token: DialKey) -> AfterFailure {
        let Some(d) = self.by_token.get_mut(&token) else { return AfterFailure::GiveUp };
        if d.attempt >= d.policy.attempts {
            self.by_token.remove(&token);
            return AfterFailure::GiveUp;
        }
        d.attempt += 1;
        d.waiting = true;
        AfterFailure::Again { attempt: d.attempt, after: d.policy.wait(d.attempt) }
    }

    /// The timer of `token`'s try went off: where to connect, unless its policy ended since.
    pub(crate) fn due(&mut self, token: DialKey) -> Option<(SocketAddr, ConnectData)> {
        let d = self.by_token.get_mut(&token).filter(|d| d.waiting)?;
        d.waiting = false;
        Some((d.addr, d.private_data.clone()))
    }

    /// Ends the policy of `token` (its connection, if up, stays; its timer, if set, finds
    /// nothing when it goes off); whether it had one.
    pub(crate) fn stop(&mut self, token: DialKey) -> bool {
        self.by_token.remove(&token).is_some()
    }

    /// Ends every policy whose try waits (the worker is stopping): their tokens.
    pub(crate) fn drain_waiting(&mut self) -> Vec<DialKey> {
        let tokens: Vec<DialKey> =
            self.by_token.iter().filter(|(_, d)| d.waiting).map(|(t, _)| *t).collect();
        for t in &tokens {
            self.stop(*t);
        }
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(token: u64) -> DialKey {
        DialKey::handler(token)
    }

    fn conn(slot: u16) -> ConnId {
        ConnId { worker: 0, slot, generation: 1 }
    }

    fn policy(attempts: u32) -> Reconnect {
        Reconnect {
            attempts,
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(35),
        }
    }

    #[test]
    fn waits_double_up_to_the_most() {
        let p = policy(5);
        let ms: Vec<u128> = (1..=4).map(|a| p.wait(a).as_millis()).collect();
        assert_eq!(ms, [10, 20, 35, 35]);
        assert_eq!(Reconnect::default().wait(40), Duration::from_secs(1));
    }

    #[test]
    fn a_close_starts_the_tries_and_a_connection_resets_them() {
        let mut r = Redials::default();
        let addr = "10.0.0.1:1".parse().unwrap();
        assert!(r.add(k(7), addr, ConnectData::new(), policy(2)));
        assert!(!r.add(k(7), addr, ConnectData::new(), policy(2)), "a token in use");
        r.connected(k(7), conn(3));
        let after = r.closed(conn(3), false);
        let ten = Duration::from_millis(10);
        assert_eq!(after, Some((k(7), AfterFailure::Again { attempt: 1, after: ten })));
        assert_eq!(r.due(k(7)).map(|(a, _)| a), Some(addr));
        assert!(r.due(k(7)).is_none(), "one try per timer");
        let twenty = Duration::from_millis(20);
        assert_eq!(r.failed(k(7)), AfterFailure::Again { attempt: 2, after: twenty });
        r.due(k(7)).unwrap();
        assert_eq!(r.failed(k(7)), AfterFailure::GiveUp, "two tries, spent");
        assert!(!r.has(k(7)));
        // Connected again, the count starts over.
        r.add(k(8), addr, ConnectData::new(), policy(2));
        r.connected(k(8), conn(4));
        let a = r.closed(conn(4), false).unwrap().1;
        assert_eq!(a, AfterFailure::Again { attempt: 1, after: ten });
        r.due(k(8)).unwrap();
        r.connected(k(8), conn(5));
        let a = r.closed(conn(5), false).unwrap().1;
        assert_eq!(a, AfterFailure::Again { attempt: 1, after: ten });
    }

    #[test]
    fn a_clients_token_is_its_own() {
        let mut r = Redials::default();
        let addr = "10.0.0.1:1".parse().unwrap();
        let client = DialKey { origin: Origin::Client(2), token: 7 };
        assert!(r.add(k(7), addr, ConnectData::new(), policy(1)));
        assert!(r.add(client, addr, ConnectData::new(), policy(1)), "another issuer's 7");
        assert!(r.stop(client) && r.has(k(7)) && !r.has(client));
    }

    #[test]
    fn a_local_close_or_a_stop_ends_the_policy() {
        let mut r = Redials::default();
        let addr = "10.0.0.1:1".parse().unwrap();
        r.add(k(1), addr, ConnectData::new(), policy(3));
        r.connected(k(1), conn(1));
        assert_eq!(r.closed(conn(1), true), Some((k(1), AfterFailure::GiveUp)));
        assert!(!r.has(k(1)));
        assert_eq!(r.closed(conn(9), false), None, "not a dial's");
        r.add(k(2), addr, ConnectData::new(), policy(3));
        assert!(matches!(r.failed(k(2)), AfterFailure::Again { attempt: 1, .. }));
        assert!(r.stop(k(2)) && !r.stop(k(2)));
        assert!(r.due(k(2)).is_none(), "its timer finds nothing");
        r.add(k(3), addr, ConnectData::new(), policy(3));
        r.failed(k(3));
        assert_eq!(r.drain_waiting(), vec![k(3)]);
        assert!(!r.has(k(3)));
    }
}
