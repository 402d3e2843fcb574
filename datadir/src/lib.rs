//! The data directory's own files, other than queue logs: how they are
//! replaced, what happens to one that turns out damaged, and the lock that
//! keeps a second broker out.
//!
//! The broker's topology file, the embedded key store and the broker's
//! secrets all go through here, so each of those files gets the same
//! guarantees: a crash leaves either the old or the new content, never half
//! of one; no file or directory the broker makes there is readable by other
//! users, whatever the umask, not even while it is being written; and a
//! damaged file is set aside for a person to look at, never deleted.
//!
//! Map:
//! - [`write_atomic`] and its helpers ([`temporary_target`],
//!   [`remove_temporaries`], [`sync_dir`], [`parent_dir`], the file modes):
//!   replacing a file whole, and cleaning up what a crash mid-write left;
//!   [`create_dir_all`]: directories for the owner alone ([`DIR_MODE`]).
//! - [`move_aside`]: a damaged file kept as `{name}.corrupt-{unix ms}`.
//! - [`StorageWarning`]: what start-up worked around, for the operator.
//! - [`DataDirLock`], [`LockError`]: the `{data_dir}/lock` flock.
//!
//! Everything here blocks on the file system: it is meant for start-up and
//! for threads of their own, never for a shard's core.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod aside;
mod lock;
mod warning;
mod write;

pub use aside::move_aside;
pub use lock::{DataDirLock, LockError};
pub use warning::StorageWarning;
pub use write::{
    create_dir_all, parent_dir, remove_temporaries, sync_dir, temporary_target, write_atomic,
    DIR_MODE, FILE_MODE, SECRET_MODE,
};
