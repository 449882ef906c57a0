//! MariaDB for tests: the shared server the outbox relay's tests write their own databases into.

/// The shared MariaDB: `RANKGATE_TEST_MARIADB` (scripts/test.sh sets it when it starts a private server),
/// else the machine's at 127.0.0.1:3306 (`root` without a password; CI starts it).
pub fn mariadb_url() -> String {
    std::env::var("RANKGATE_TEST_MARIADB").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}
