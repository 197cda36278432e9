//! The gateway's stream slots (server-sent events, followed logs), shared out among users: at
//! most `total` open at once through one replica's gateway, and at most `per_user` of them for
//! one user (the user the token names), so that one user holding streams cannot take every
//! slot and shut the others out. A slot is released when its stream ends (the slot is dropped).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tonic::Status;

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_user: HashMap<String, usize>,
}

/// Counts the open streams, in all and by user.
#[derive(Clone)]
pub struct StreamShares {
    held: Arc<Mutex<Held>>,
    total: usize,
    per_user: usize,
}

/// Why a stream was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{0} streams are open on this replica's gateway; try again later")]
    Full(usize),
    #[error("\"{user}\" holds {held} streams, its share of this replica's gateway; close one first")]
    Share { user: String, held: usize },
}

impl From<Refused> for Status {
    fn from(r: Refused) -> Status {
        Status::resource_exhausted(r.to_string())
    }
}

impl StreamShares {
    /// `total` slots, `per_user` of them at most for one user (both at least 1).
    pub fn new(total: usize, per_user: usize) -> StreamShares {
        let total = total.max(1);
        StreamShares { held: Arc::default(), total, per_user: per_user.clamp(1, total) }
    }

    /// A slot for a stream of `user`, released when dropped.
    pub fn take(&self, user: &str) -> Result<StreamSlot, Refused> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mine = held.by_user.get(user).copied().unwrap_or(0);
        if mine >= self.per_user {
            return Err(Refused::Share { user: user.chars().take(64).collect(), held: mine });
        }
        if held.total >= self.total {
            return Err(Refused::Full(self.total));
        }
        held.total += 1;
        *held.by_user.entry(user.to_string()).or_default() += 1;
        Ok(StreamSlot { held: self.held.clone(), user: user.to_string() })
    }

    /// Open streams (all, of `user`).
    #[cfg(test)]
    pub fn open(&self, user: &str) -> (usize, usize) {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        (held.total, held.by_user.get(user).copied().unwrap_or(0))
    }
}

/// One open stream's slot.
#[derive(Debug)]
pub struct StreamSlot {
    held: Arc<Mutex<Held>>,
    user: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by_user.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.by_user.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_gets_its_share_and_the_others_still_get_slots() {
        let shares = StreamShares::new(5, 2);
        let a1 = shares.take("alice").unwrap();
        let _a2 = shares.take("alice").unwrap();
        assert_eq!(shares.take("alice").err(), Some(Refused::Share { user: "alice".into(), held: 2 }));
        let _b1 = shares.take("bob").unwrap();
        let _b2 = shares.take("bob").unwrap();
        let _c1 = shares.take("carol").unwrap();
        // Five open: the total refuses a user below its share.
        assert_eq!(shares.open("carol"), (5, 1));
        assert_eq!(shares.take("carol").err(), Some(Refused::Full(5)));
        // A stream that ends frees its slot, for its user and in all.
        drop(a1);
        assert_eq!(shares.open("alice"), (4, 1));
        let _c2 = shares.take("carol").unwrap();
        assert!(shares.take("alice").is_err(), "the total is full again");
    }

    #[test]
    fn refusals_are_resource_exhausted_and_shares_are_never_zero() {
        let shares = StreamShares::new(0, 0);
        let _a = shares.take("alice").unwrap();
        let refused: Status = shares.take("bob").unwrap_err().into();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("1 streams are open"), "{}", refused.message());
        let shares = StreamShares::new(512, 64);
        let held: Vec<StreamSlot> = (0..64).map(|_| shares.take("alice").unwrap()).collect();
        let refused: Status = shares.take("alice").unwrap_err().into();
        assert!(refused.message().contains("\"alice\" holds 64 streams"), "{}", refused.message());
        drop(held);
        assert_eq!(shares.open("alice"), (0, 0));
    }
}
