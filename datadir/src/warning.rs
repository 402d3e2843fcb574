//! What start-up worked around.

use std::fmt;
use std::path::PathBuf;

/// Something wrong with the data directory that the broker worked around at
/// start: it serves, but an operator should know (a file was set aside, an
/// older copy was used, a queue was adopted). Shown in the log at start and
/// meant for `/ready` and `/api/status`, so it is not lost in a log rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageWarning {
    /// The file or directory concerned.
    pub path: PathBuf,
    /// What happened and what it costs, for a person.
    pub message: String,
}

impl StorageWarning {
    /// A warning about `path`.
    pub fn new(path: impl Into<PathBuf>, message: impl Into<String>) -> StorageWarning {
        StorageWarning {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for StorageWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_with_its_path_first() {
        let w = StorageWarning::new("/d/topology.json", "was missing");
        assert_eq!(w.to_string(), "/d/topology.json: was missing");
    }
}
