//! Who may do what: identities from certificates, roles and the permission
//! matrix, rate limits, the policy snapshot a reload swaps, and connections
//! ended from outside.

pub(crate) mod acl;
pub(crate) mod forced_close;
pub(crate) mod identity;
pub(crate) mod policy;
pub(crate) mod rate_limit;
pub(crate) mod reload;
