//! The test kit of the workspace: what every integration test that runs a
//! broker needs, in one place instead of a copy per test crate.
//!
//! - [`pki`]: certificates made by `ciphermq-pki` for the CNs a test names;
//! - [`ca`]: a CA loaded or made with rcgen, for what `ciphermq-pki` does
//!   not issue (re-issued server certificates, URI SANs, CRLs);
//! - [`config`]: the `config.toml` text of a test broker;
//! - [`broker`]: a broker on its own threads in the test's process;
//! - [`process`]: the broker binary as a child process, ready once it says
//!   where it listens;
//! - [`pg`]: a fresh PostgreSQL database per test.
//!
//! Only integration tests (`tests/`) may use it, as a dev-dependency: it
//! depends on `ciphermq-broker` and `ciphermq-clients`, and a unit test
//! inside either crate's `src/` would link two copies of that crate.
//!
//! Its functions panic, with a message naming what failed, instead of
//! returning errors: a test that cannot make its certificates or start its
//! broker has failed, and the panic is its report.

#![warn(missing_docs)]

pub mod broker;
pub mod ca;
pub mod config;
pub mod pg;
pub mod pki;
pub mod process;

pub use broker::RunningBroker;
pub use config::BrokerConfig;
pub use process::{BrokerProcess, Refused};
