//! What `ciphermq-admin` adds to an error when nothing listened where it
//! connected: the likely reason, and the setting or flag that fixes it.

use super::broker_file::{BrokerFile, DEFAULT_BROKER, DEFAULT_ENDPOINT};

/// The hint for a refused connection to the admin endpoint. `file` is the
/// `--config` file when the address came from it (not from `--endpoint`).
pub(crate) fn endpoint_refused(file: Option<&BrokerFile>) -> String {
    const RESTART: &str = "then restart the broker (a reload does not start the endpoint)";
    match file {
        Some(f) if f.admin_enabled == Some(false) => format!(
            "hint: {} has `[admin] enabled = false`, so a broker started from it serves no \
             admin endpoint: set `enabled = true` there (and `address`, now {:?}), {RESTART}; \
             or pass --endpoint HOST:PORT if it listens elsewhere",
            f.path.display(),
            f.admin_address()
        ),
        Some(f) if f.admin_enabled.is_none() => format!(
            "hint: {} does not set `[admin] enabled`, and the admin endpoint is off by \
             default: set `enabled = true` in its `[admin]` section (and `address`, default \
             {DEFAULT_ENDPOINT}), {RESTART}; or pass --endpoint HOST:PORT if it listens \
             elsewhere",
            f.path.display()
        ),
        Some(f) => format!(
            "hint: {} enables the admin endpoint on {:?}: is the broker running, started \
             from this file? `[admin]` is read when the broker starts (a reload does not \
             apply it)",
            f.path.display(),
            f.admin_address()
        ),
        None => format!(
            "hint: the broker's admin endpoint is off by default: set `[admin] enabled = \
             true` (and `address`, default {DEFAULT_ENDPOINT}) in the broker's config file, \
             {RESTART}; if it listens elsewhere, pass --endpoint HOST:PORT, or --config \
             with the broker's config file"
        ),
    }
}

/// The hint for a refused connection to the broker port. `file` is the
/// `--config` file when the address came from it (not from `--broker`).
pub(crate) fn broker_refused(file: Option<&BrokerFile>) -> String {
    match file {
        Some(f) => format!(
            "hint: is the broker running? {} has it listen on `server.address`; a broker \
             started with --address listens elsewhere: pass --broker HOST:PORT",
            f.path.display()
        ),
        None => format!(
            "hint: is the broker running? Its client port is `server.address` in its config \
             file (default {DEFAULT_BROKER}): pass --broker HOST:PORT, or --config with the \
             broker's config file"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn file(admin: &str) -> BrokerFile {
        BrokerFile::parse(Path::new("/etc/ciphermq/config.toml"), admin).unwrap()
    }

    #[test]
    fn a_refused_endpoint_names_the_setting_that_starts_it() {
        let plain = endpoint_refused(None);
        assert!(
            plain.contains("off by default")
                && plain.contains("`[admin] enabled = true`")
                && plain.contains("restart")
                && plain.contains("--endpoint"),
            "{plain}"
        );
        let off = endpoint_refused(Some(&file("[admin]\nenabled = false\n")));
        assert!(
            off.starts_with("hint: /etc/ciphermq/config.toml has `[admin] enabled = false`")
                && off.contains("\"127.0.0.1:9091\"")
                && off.contains("restart"),
            "{off}"
        );
        let unset = endpoint_refused(Some(&file("")));
        assert!(
            unset.contains("does not set `[admin] enabled`") && unset.contains("off by default"),
            "{unset}"
        );
        let on = endpoint_refused(Some(&file(
            "[admin]\nenabled = true\naddress = \"127.0.0.1:9191\"\n",
        )));
        assert!(
            on.contains("enables the admin endpoint on \"127.0.0.1:9191\"")
                && on.contains("is the broker running"),
            "{on}"
        );
        assert!(broker_refused(None).contains("--broker"));
        assert!(broker_refused(Some(&file(""))).contains("/etc/ciphermq/config.toml"));
    }
}
