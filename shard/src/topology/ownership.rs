//! Who may change what: the actor asking, the ownership refusals, and
//! the broker's rule over bindings.

use std::fmt;
use std::sync::Arc;

use ciphermq_proto::ExchangeKind;

use super::QueueInfo;
#[cfg(doc)]
use super::TopologyStore;
#[cfg(doc)]
use crate::routing::Target;

/// Why a receiver's bind to a fanout exchange it does not own is refused: a
/// fanout exchange ignores the routing key, so such a binding would copy
/// every message sent through it, whoever it is for.
pub const FANOUT_NOT_OWNED: &str = "receivers may only bind queues to fanout exchanges they own";

/// Why a receiver may not delete an exchange it does not own.
pub const EXCHANGE_NOT_OWNED: &str = "receivers may only delete exchanges they own";

/// Why a receiver may not delete its own exchange while another owner's
/// queue is bound to it.
pub const EXCHANGE_HAS_OTHERS_BINDINGS: &str =
    "receivers may not delete an exchange while queues of other owners are bound to it";

/// Why a receiver may not delete a queue it does not own.
pub const QUEUE_NOT_OWNED: &str = "receivers may only delete queues they own";

/// Who asks for a topology change: what ownership allows depends on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Actor {
    /// An administrator (or the broker itself): may bind any queue to any
    /// exchange, and what it declares belongs to no receiver.
    Admin,
    /// A receiver, by CN: owns the exchanges it declares first, and may bind
    /// a queue to a fanout exchange only if it owns that exchange.
    Receiver(Arc<str>),
}

impl Actor {
    /// A receiver actor for `cn`.
    pub fn receiver(cn: &str) -> Actor {
        Actor::Receiver(Arc::from(cn))
    }
}

/// A binding as a [`BindingRule`] judges it: everything the topology knows
/// about it at the moment it is applied or re-judged.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// The exchange's name.
    pub exchange: &'a str,
    /// Its type.
    pub kind: ExchangeKind,
    /// The receiver owning the exchange, if one does.
    pub exchange_owner: Option<&'a str>,
    /// The binding key (a topic pattern on a topic exchange).
    pub key: &'a str,
    /// The bound queue.
    pub queue: &'a QueueInfo,
    /// Who made it; `None` when that was not recorded (a binding saved by a
    /// build that did not record it).
    pub bound_by: Option<&'a Actor>,
}

/// The broker's say over which bindings may exist: its ACL, which can change
/// while the broker runs (a reload). Installed with
/// [`TopologyStore::set_binding_rule`], it is asked about every bind as it is
/// applied (so a bind checked under an ACL a reload has since replaced
/// cannot slip in) and, on installation, about every binding already there.
pub trait BindingRule: Send + Sync + fmt::Debug {
    /// `Err(reason)` when `binding` may not exist; the reason is worded for
    /// an `Access denied: <reason>` reply and for the log.
    fn check(&self, binding: &Binding<'_>) -> Result<(), String>;

    /// The receiver that owns `queue`, whose envelopes alone it may store
    /// (see [`Target::confined_to`]); `None` for a queue no receiver owns.
    fn confined_to(&self, queue: &QueueInfo) -> Option<Arc<str>>;
}

/// A binding a [`BindingRule`] refused when it was installed, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedBinding {
    /// The exchange it was on.
    pub exchange: String,
    /// Its binding key.
    pub key: String,
    /// The queue it filled.
    pub queue: String,
    /// Who had made it, if that was recorded.
    pub bound_by: Option<Actor>,
    /// Why the rule refused it.
    pub reason: String,
}
