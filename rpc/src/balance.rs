//! Load balancing: a group of client sessions (its members, each a server) and the choice of
//! the member a call on the group goes to — the one with the fewest outstanding calls (in
//! flight and waiting for a credit), ties broken round robin. The group knows nothing of the
//! endpoint: the endpoint tells it each member's load when it picks, keeps its members to
//! sessions that are up (a session that closes or fails leaves every group it was in), and
//! counts the picks it made.

use crate::ids::SessionId;

/// A member of a group, as [`crate::Endpoint::members`] shows it: its session and how many
/// calls the group placed on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    session: SessionId,
    picks: u64,
}

impl Member {
    /// Its session.
    pub fn session(&self) -> SessionId {
        self.session
    }

    /// Calls on the group placed on this member since it joined (calls the endpoint
    /// accepted; a call refused after the pick is not counted).
    pub fn picks(&self) -> u64 {
        self.picks
    }
}

/// A group's members and its round-robin cursor.
///
/// Invariants: no session is a member twice; `next` is below the number of members (0 when
/// there are none). The endpoint keeps every member a client session that is up.
#[derive(Debug, Default)]
pub(crate) struct Group {
    members: Vec<Member>,
    /// Where the next pick's scan starts: the member after the last one picked, so that
    /// among members of equal load each gets its turn.
    next: usize,
}

impl Group {
    /// A group of no members, with room for `capacity` (joins beyond grow it: set-up, not the
    /// per-call path).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Group { members: Vec::with_capacity(capacity), next: 0 }
    }

    /// The members, in the order they joined.
    pub(crate) fn members(&self) -> &[Member] {
        &self.members
    }

    /// Whether `session` is a member.
    pub(crate) fn contains(&self, session: SessionId) -> bool {
        self.members.iter().any(|m| m.session == session)
    }

    /// Adds `session` (with no picks yet); false if it was a member already.
    pub(crate) fn add(&mut self, session: SessionId) -> bool {
        if self.contains(session) {
            return false;
        }
        self.members.push(Member { session, picks: 0 });
        true
    }

    /// Takes `session` out; false if it was not a member. The members after it keep their
    /// turn: the cursor moves back with them.
    pub(crate) fn remove(&mut self, session: SessionId) -> bool {
        let Some(i) = self.members.iter().position(|m| m.session == session) else {
            return false;
        };
        self.members.remove(i);
        if i < self.next {
            self.next -= 1;
        }
        if self.next >= self.members.len() {
            self.next = 0;
        }
        true
    }

    /// The member a call goes to: of those whose `load` is known (`None`: not up, skipped),
    /// the one with the least; among equals the first from the cursor on, cyclically. The
    /// pick is counted and the cursor moves past it. `None`: no member is up.
    pub(crate) fn pick(
        &mut self,
        mut load: impl FnMut(SessionId) -> Option<usize>,
    ) -> Option<SessionId> {
        let n = self.members.len();
        let mut best: Option<(usize, usize)> = None;
        for k in 0..n {
            let i = (self.next + k) % n;
            let Some(l) = load(self.members[i].session) else { continue };
            if best.is_none_or(|(_, least)| l < least) {
                best = Some((i, l));
            }
        }
        let (i, _) = best?;
        self.next = (i + 1) % n;
        let m = &mut self.members[i];
        m.picks += 1;
        Some(m.session)
    }

    /// Takes back a pick of `session` whose call was refused (it is still counted if the
    /// session left meanwhile: nothing to take it from).
    pub(crate) fn unpick(&mut self, session: SessionId) {
        if let Some(m) = self.members.iter_mut().find(|m| m.session == session) {
            m.picks = m.picks.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(i: u16) -> SessionId {
        SessionId::new(i, 0)
    }

    fn group(n: u16) -> Group {
        let mut g = Group::with_capacity(usize::from(n));
        for i in 0..n {
            assert!(g.add(s(i)));
        }
        g
    }

    /// Picks `calls` times with each pick adding one to its member's load (a burst: nothing
    /// answered meanwhile), from `loads`; the picks per member.
    fn burst(g: &mut Group, loads: &mut [usize], calls: usize) -> Vec<u64> {
        for _ in 0..calls {
            let picked = g.pick(|m| Some(loads[m.index()])).unwrap();
            loads[picked.index()] += 1;
        }
        g.members().iter().map(Member::picks).collect()
    }

    #[test]
    fn equal_members_take_turns() {
        let mut g = group(3);
        // Loads that never change (every call answered before the next): round robin.
        let order: Vec<SessionId> = (0..6).map(|_| g.pick(|_| Some(0)).unwrap()).collect();
        assert_eq!(order, [s(0), s(1), s(2), s(0), s(1), s(2)]);
        // A burst spreads evenly too.
        let mut g = group(3);
        assert_eq!(burst(&mut g, &mut [0; 3], 300), [100, 100, 100]);
    }

    #[test]
    fn the_least_loaded_member_is_picked() {
        let mut g = group(3);
        assert_eq!(g.pick(|m| Some([5, 2, 9][m.index()])), Some(s(1)));
        assert_eq!(g.pick(|m| Some([5, 2, 9][m.index()])), Some(s(1)), "still the least");
        // From uneven loads a burst first fills the lighter members up to the heaviest.
        let mut g = group(3);
        let mut loads = [4, 0, 2];
        assert_eq!(burst(&mut g, &mut loads, 6), [0, 4, 2]);
        assert_eq!(loads, [4, 4, 4]);
        assert_eq!(burst(&mut g, &mut loads, 3), [1, 5, 3], "then all take turns");
    }

    #[test]
    fn members_that_are_not_up_are_skipped() {
        let mut g = group(3);
        let down = |m: SessionId| (m != s(1)).then_some(0);
        let picks: Vec<SessionId> = (0..4).map(|_| g.pick(down).unwrap()).collect();
        assert_eq!(picks, [s(0), s(2), s(0), s(2)]);
        assert_eq!(g.pick(|_| None), None, "none up: no pick");
        assert_eq!(
            g.members().iter().map(Member::picks).sum::<u64>(),
            4,
            "a failed pick counts nothing"
        );
        assert_eq!(Group::default().pick(|_| Some(0)), None, "no members");
    }

    #[test]
    fn members_join_once_and_leave_keeping_the_turns() {
        let mut g = group(3);
        assert!(!g.add(s(1)), "a member joins once");
        assert_eq!(g.pick(|_| Some(0)), Some(s(0)));
        assert_eq!(g.pick(|_| Some(0)), Some(s(1)));
        // s2's turn is next; taking out s0 (before it) keeps it next.
        assert!(g.remove(s(0)));
        assert!(!g.remove(s(0)));
        assert_eq!(g.pick(|_| Some(0)), Some(s(2)));
        assert_eq!(g.pick(|_| Some(0)), Some(s(1)));
        // Taking out the member whose turn it is passes it to the next (wrapping).
        assert!(g.remove(s(2)));
        assert_eq!(g.pick(|_| Some(0)), Some(s(1)));
        assert!(g.remove(s(1)));
        assert_eq!(g.pick(|_| Some(0)), None);
        // Added back (a reconnected server is a new session): it takes calls again.
        assert!(g.add(s(7)));
        assert_eq!(g.pick(|_| Some(0)), Some(s(7)));
        assert_eq!(g.members(), [Member { session: s(7), picks: 1 }]);
    }

    #[test]
    fn a_refused_call_gives_its_pick_back() {
        let mut g = group(2);
        let picked = g.pick(|_| Some(0)).unwrap();
        g.unpick(picked);
        assert_eq!(g.members().iter().map(Member::picks).collect::<Vec<_>>(), [0, 0]);
        g.unpick(s(9)); // not a member: nothing
    }
}
