//! Where the PostgreSQL coordinator connects and which schema it uses.

use std::time::Duration;

use crate::error::ClusterError;

/// Settings of [`PgCoordinator`](crate::PgCoordinator). The server is the
/// one of `[database]`; the schema keeps the cluster's tables apart (one per
/// cluster, or per test).
#[derive(Clone, PartialEq, Eq)]
pub struct PgCoordinatorConfig {
    /// Server host name or address.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// Role to log in as.
    pub user: String,
    /// Password, when the server asks for one. Never printed.
    pub password: Option<String>,
    /// Database holding the schema.
    pub dbname: String,
    /// Schema of the cluster tables, created if missing: lowercase ASCII
    /// letters, digits and `_`, not starting with a digit or `pg_`, at most
    /// 63 bytes (it is put into SQL, so nothing else is accepted).
    pub schema: String,
    /// Longest wait for one connection attempt (values below 100 ms count
    /// as 100 ms).
    pub connect_timeout: Duration,
}

impl Default for PgCoordinatorConfig {
    /// `postgres@127.0.0.1:5432/ciphermq`, schema `ciphermq_cluster`, 10 s
    /// to connect.
    fn default() -> PgCoordinatorConfig {
        PgCoordinatorConfig {
            host: "127.0.0.1".to_owned(),
            port: 5432,
            user: "postgres".to_owned(),
            password: None,
            dbname: "ciphermq".to_owned(),
            schema: "ciphermq_cluster".to_owned(),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Debug for PgCoordinatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCoordinatorConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("dbname", &self.dbname)
            .field("schema", &self.schema)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl PgCoordinatorConfig {
    /// `host:port/dbname`, for messages a person reads.
    pub(crate) fn target(&self) -> String {
        format!("{}:{}/{}", self.host, self.port, self.dbname)
    }

    /// How the coordinator's connections show in `pg_stat_activity`:
    /// `ciphermq-cluster <schema>`, so an operator tells clusters apart.
    pub fn application_name(&self) -> String {
        format!("ciphermq-cluster {}", self.schema)
    }

    /// Refuses a schema name that is not a plain lowercase identifier.
    pub fn check_schema(&self) -> Result<(), ClusterError> {
        let name = &self.schema;
        let bad = |why| {
            Err(ClusterError::BadSchemaName {
                name: name.clone(),
                why,
            })
        };
        if name.is_empty() || name.len() > 63 {
            return bad("it must be 1 to 63 bytes long");
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return bad("only lowercase ASCII letters, digits and '_' are allowed");
        }
        if name.as_bytes()[0].is_ascii_digit() {
            return bad("it must not start with a digit");
        }
        if name.starts_with("pg_") {
            return bad("names starting with pg_ are reserved by PostgreSQL");
        }
        Ok(())
    }

    /// The driver's settings: every statement resolves table names in
    /// [`schema`](Self::schema).
    pub(crate) fn driver(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .application_name(self.application_name())
            .options(format!("-c search_path={}", self.schema))
            .connect_timeout(self.connect_timeout.max(Duration::from_millis(100)))
            // A silently dead server is noticed within about a minute.
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        if let Some(password) = &self.password {
            config.password(password.as_bytes());
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_schema(schema: &str) -> PgCoordinatorConfig {
        PgCoordinatorConfig {
            schema: schema.to_owned(),
            ..PgCoordinatorConfig::default()
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let config = PgCoordinatorConfig {
            password: Some("hunter2".to_owned()),
            ..PgCoordinatorConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(config.target(), "127.0.0.1:5432/ciphermq");
    }

    #[test]
    fn only_plain_schema_names_are_accepted() {
        for good in ["ciphermq_cluster", "c1", "_x"] {
            assert_eq!(with_schema(good).check_schema(), Ok(()), "{good}");
        }
        for bad in [
            "",
            "Public",
            "a-b",
            "a;drop",
            "1abc",
            "pg_x",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(
                    with_schema(bad).check_schema(),
                    Err(ClusterError::BadSchemaName { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
