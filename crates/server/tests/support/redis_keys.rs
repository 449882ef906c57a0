//! Cleaning up after a test that writes to the shared Redis at 127.0.0.1:6379 under a prefix of its own.
//! One copy for every test binary, included with `#[path]`.

/// Deletes every key under its prefix when dropped, so when the test ends, passed or failed.
pub struct RedisKeys(pub String);

impl Drop for RedisKeys {
    fn drop(&mut self) {
        let Ok(mut connection) =
            redis::Client::open("redis://127.0.0.1:6379").and_then(|c| c.get_connection())
        else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.0))
            .query(&mut connection)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&keys).query(&mut connection);
        }
    }
}
