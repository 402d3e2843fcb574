//! Per-CN quotas on what a receiver may create.
//!
//! A valid certificate is no promise of good intent: without a cap, one
//! receiver could declare queues and bindings until the topology (and the
//! cost of every change to it, and of every save of it) is as large as it
//! likes. The topology counts what each CN holds ([`Usage`]) as changes are
//! applied, so a check is one lookup, and refuses a receiver's change that
//! would take it past its [`Quotas`]. Admins and the broker itself are not
//! limited; what they create for a receiver (an admin's queue under its
//! name, a dead-letter queue) still counts towards that receiver's usage.

use std::fmt;

/// The most one receiver CN may hold; `usize::MAX` leaves one unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Queues it owns (`performance.max_queues_per_cn`).
    pub queues_per_cn: usize,
    /// Exchanges it owns, i.e. declared first (`performance.max_exchanges_per_cn`).
    pub exchanges_per_cn: usize,
    /// Bindings it made (`performance.max_bindings_per_cn`).
    pub bindings_per_cn: usize,
}

impl Quotas {
    /// No limits: a topology without installed quotas behaves like this.
    pub const UNLIMITED: Quotas = Quotas {
        queues_per_cn: usize::MAX,
        exchanges_per_cn: usize::MAX,
        bindings_per_cn: usize::MAX,
    };

    /// The cap on `resource`.
    pub fn limit(&self, resource: Resource) -> usize {
        match resource {
            Resource::Queues => self.queues_per_cn,
            Resource::Exchanges => self.exchanges_per_cn,
            Resource::Bindings => self.bindings_per_cn,
        }
    }
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas::UNLIMITED
    }
}

/// What one CN holds, counted against its [`Quotas`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Queues it owns.
    pub queues: usize,
    /// Exchanges it owns.
    pub exchanges: usize,
    /// Bindings it made.
    pub bindings: usize,
}

impl Usage {
    /// The count of `resource`.
    pub fn of(&self, resource: Resource) -> usize {
        match resource {
            Resource::Queues => self.queues,
            Resource::Exchanges => self.exchanges,
            Resource::Bindings => self.bindings,
        }
    }

    /// Adds `delta` (saturating at zero) to the count of `resource`.
    pub(crate) fn add(&mut self, resource: Resource, delta: isize) {
        let count = match resource {
            Resource::Queues => &mut self.queues,
            Resource::Exchanges => &mut self.exchanges,
            Resource::Bindings => &mut self.bindings,
        };
        *count = count.saturating_add_signed(delta);
    }
}

/// A kind of thing a quota caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Queues owned.
    Queues,
    /// Exchanges owned.
    Exchanges,
    /// Bindings made.
    Bindings,
}

impl Resource {
    /// The plural noun, as replies and logs say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Queues => "queues",
            Resource::Exchanges => "exchanges",
            Resource::Bindings => "bindings",
        }
    }

    /// The config key that sets its quota, for a message a person can act on.
    pub fn config_key(self) -> &'static str {
        match self {
            Resource::Queues => "performance.max_queues_per_cn",
            Resource::Exchanges => "performance.max_exchanges_per_cn",
            Resource::Bindings => "performance.max_bindings_per_cn",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
