//! An endpoint's groups of client sessions: made and changed at set-up (or whenever a
//! session opens or is replaced), kept to sessions that are up (a session leaves every group
//! when it closes or fails), and the calls on a group, each placed on the member with the
//! fewest outstanding calls (the choice is [`Group::pick`]'s).

use corelink_engine::verbs::Provider;
use corelink_engine::Cx;

use super::{Ask, Continuation, Endpoint, GroupAsk, Phase, SessionEntry};
use crate::balance::{Group, Member};
use crate::error::{Result, RpcError};
use crate::ids::{CallId, GroupId, SessionId};

/// The outstanding calls of `id` (requests on the wire, timed-out ones still holding their
/// credit included, and live calls waiting for a credit) if it is a client session that is
/// up (connecting or open); `None` otherwise (a server session, closing, gone).
fn load_of<P: Provider>(sessions: &[SessionEntry<P>], id: SessionId) -> Option<usize> {
    let e = sessions.get(id.index())?;
    let s = e.session.as_ref().filter(|_| e.generation == id.generation())?;
    if !s.served.is_empty() || s.phase == Phase::Closing {
        return None;
    }
    Some(s.slots.len() - s.free_slots.len() + s.queued)
}

impl<P: Provider> Endpoint<P> {
    /// A group of `members` (client sessions of this endpoint, connecting or open; repeats
    /// count once) that calls can be balanced across ([`crate::Rpc::call_group`]); none is
    /// fine (members join with [`Endpoint::add_member`]). A member leaves the group by
    /// itself when its session closes or fails. Refused, and no group made, with
    /// [`RpcError::NoSuchSession`] naming a member that is not a client session of this
    /// endpoint, [`RpcError::SessionClosed`] for one that is closing, or
    /// [`RpcError::TooManyGroups`] once the endpoint has as many groups as
    /// [`crate::EndpointConfig::max_sessions`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use corelink_rpc::{Endpoint, EndpointConfig, RpcError};
    /// # let res = corelink_config::WorkerResources::default();
    /// let mut ep = Endpoint::<corelink_engine::verbs::soft::Soft>::new(
    ///     EndpointConfig::for_worker(&res), &res)?;
    /// let group = ep.group(&[])?; // members join once their sessions are made
    /// assert!(ep.members(group)?.is_empty());
    /// # Ok::<(), RpcError>(())
    /// ```
    pub fn group(&mut self, members: &[SessionId]) -> Result<GroupId> {
        let max = usize::from(self.cfg.max_sessions);
        if self.groups.len() >= max {
            return Err(RpcError::TooManyGroups { max });
        }
        for &s in members {
            self.may_join(s)?;
        }
        let mut group = Group::with_capacity(members.len());
        for &s in members {
            group.add(s);
        }
        // Below `max_sessions`, a `u16`.
        let id = GroupId(self.groups.len() as u16);
        self.groups.push(group);
        Ok(id)
    }

    /// Adds `session` (a client session of this endpoint, connecting or open: a new one, a
    /// server's replacement after a reconnect) to `group`; `false` if it was a member
    /// already. Refused with [`RpcError::NoSuchGroup`], or as [`Endpoint::group`] refuses the
    /// session.
    pub fn add_member(&mut self, group: GroupId, session: SessionId) -> Result<bool> {
        self.may_join(session)?;
        let g = self.groups.get_mut(group.index()).ok_or(RpcError::NoSuchGroup(group))?;
        Ok(g.add(session))
    }

    /// Takes `session` out of `group` (no call on the group goes to it from now on; its calls
    /// made go on); `false` if it was not a member. Refused with [`RpcError::NoSuchGroup`].
    pub fn remove_member(&mut self, group: GroupId, session: SessionId) -> Result<bool> {
        let g = self.groups.get_mut(group.index()).ok_or(RpcError::NoSuchGroup(group))?;
        Ok(g.remove(session))
    }

    /// The members of `group` (the sessions up, in the order they joined) with the calls
    /// placed on each ([`Member::picks`]).
    pub fn members(&self, group: GroupId) -> Result<&[Member]> {
        let g = self.groups.get(group.index()).ok_or(RpcError::NoSuchGroup(group))?;
        Ok(g.members())
    }

    /// Outstanding calls of client session `session` (on the wire, timed out but still
    /// holding their credit, and waiting for a credit), if it is up: the load a group
    /// balances.
    pub fn outstanding(&self, session: SessionId) -> Option<usize> {
        load_of(&self.sessions, session)
    }

    /// Whether `session` may be a member: a client session of this endpoint
    /// ([`RpcError::NoSuchSession`]) that is not closing ([`RpcError::SessionClosed`]).
    fn may_join(&self, session: SessionId) -> Result<()> {
        match self.session(session) {
            Some(s) if s.served.is_empty() && s.phase == Phase::Closing => {
                Err(RpcError::SessionClosed)
            }
            Some(s) if s.served.is_empty() => Ok(()),
            _ => Err(RpcError::NoSuchSession(session)),
        }
    }

    /// Takes `session` out of every group (it is closing or gone).
    /// The groups `session` is a member of.
    pub(super) fn groups_of(&self, session: SessionId) -> Vec<GroupId> {
        let of = |(i, g): (usize, &Group)| g.contains(session).then_some(GroupId(i as u16));
        self.groups.iter().enumerate().filter_map(of).collect()
    }

    /// `session` (reconnected) joins `groups` again.
    pub(super) fn rejoin_groups(&mut self, session: SessionId, groups: &[GroupId]) {
        for g in groups {
            if let Some(group) = self.groups.get_mut(g.index()) {
                group.add(session);
            }
        }
    }

    pub(super) fn leave_groups(&mut self, session: SessionId) {
        for g in &mut self.groups {
            g.remove(session);
        }
    }

    /// A call on `group`: on the member [`Group::pick`] chooses, as `call_with` makes it
    /// there. Refused: the error and `then`, unrun (the pick not counted).
    pub(crate) fn call_group_with(
        &mut self,
        cx: &mut Cx<P>,
        ask: GroupAsk,
        fill: impl FnOnce(&mut [u8]),
        then: Continuation<P>,
    ) -> Result<(SessionId, CallId), (RpcError, Continuation<P>)> {
        let GroupAsk { group, ty, len, timeout } = ask;
        let Endpoint { groups, sessions, metrics, .. } = self;
        let Some(g) = groups.get_mut(group.index()) else {
            return Err((RpcError::NoSuchGroup(group), then));
        };
        let Some(session) = g.pick(|s| load_of(sessions, s)) else {
            metrics.no_server += 1;
            return Err((RpcError::NoServer { group }, then));
        };
        let ask = Ask { session, ty, len, timeout };
        match self.call_with(cx, ask, fill, then) {
            Ok(call) => {
                self.metrics.balanced += 1;
                Ok((session, call))
            }
            Err(refused) => {
                if let Some(g) = self.groups.get_mut(group.index()) {
                    g.unpick(session);
                }
                Err(refused)
            }
        }
    }
}
