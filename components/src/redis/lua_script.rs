//! Running the components' Lua scripts, for a server and a Redis Cluster
//! alike: `EVALSHA` with the script's SHA1, and on a `NOSCRIPT` reply
//! `EVAL` with its source.
//!
//! `NOSCRIPT` says the script is not in that server's cache (a restart, a
//! replica promoted, a `SCRIPT FLUSH` emptied it, or the master is new) and
//! that it did not run; `EVAL` runs it once and leaves it in the cache, so
//! the next `EVALSHA` finds it. Both commands name the script's keys, so
//! on a cluster both go to the master of the keys' slot (or, behind `ASK`,
//! to the node importing it) and nowhere else. The redis crate's own repair
//! (`ScriptInvocation::invoke_async`) loads the script with `SCRIPT LOAD`,
//! which its cluster client sends to every node of its slot map — replicas
//! and unreachable nodes too — and fails unless all answer: with one master
//! down, every script on a healthy master whose cache was empty failed
//! until its deadline.
//!
//! (From Redis 7.4 a script cached by `EVAL` is dropped when more than 500
//! others were `EVAL`ed after it; the next call then pays one `NOSCRIPT`
//! round trip again.)

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind, ToRedisArgs};

/// A Lua script: its source and the SHA1 `EVALSHA` names it by.
#[derive(Debug, Clone)]
pub struct LuaScript {
    source: String,
    sha: String,
}

impl LuaScript {
    /// The script of `source`.
    pub fn new(source: &str) -> Self {
        Self {
            source: source.to_string(),
            sha: redis::Script::new(source).get_hash().to_string(),
        }
    }

    /// The script's SHA1, as `EVALSHA` names it.
    pub fn sha(&self) -> &str {
        &self.sha
    }

    /// A call of the script with `key` as its first key.
    pub fn key<T: ToRedisArgs>(&self, key: T) -> Invocation<'_> {
        let mut invocation = self.prepare_invoke();
        invocation.key(key);
        invocation
    }

    /// A call of the script with no key or argument yet.
    pub fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`LuaScript`]: its keys (`KEYS`) and arguments (`ARGV`).
pub struct Invocation<'a> {
    script: &'a LuaScript,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

/// Keys and arguments may be secrets: only how many there are is shown.
impl std::fmt::Debug for Invocation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation")
            .field("sha", &self.script.sha)
            .field("keys", &self.keys.len())
            .field("args", &self.args.len())
            .finish()
    }
}

impl Invocation<'_> {
    /// Adds a key (`KEYS[n]`).
    pub fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds an argument (`ARGV[n]`).
    pub fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// Runs the script on `conn`: `EVALSHA`, and `EVAL` with the source
    /// when the server answers `NOSCRIPT` (see the module docs).
    pub async fn invoke_async<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.evalsha().query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.eval().query_async(conn).await
            }
            answer => answer,
        }
    }

    /// `EVALSHA sha numkeys key… arg…`.
    fn evalsha(&self) -> Cmd {
        self.command("EVALSHA", &self.script.sha)
    }

    /// `EVAL source numkeys key… arg…`.
    fn eval(&self) -> Cmd {
        self.command("EVAL", &self.script.source)
    }

    fn command(&self, name: &str, script: &str) -> Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&*self.keys)
            .arg(&*self.args);
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{Arg, RedisFuture, Value};
    use std::sync::{Arc, Mutex};

    /// A connection that answers each command with the next of `replies`
    /// and records the words of what it was sent.
    #[derive(Clone, Default)]
    struct Scripted {
        replies: Arc<Mutex<Vec<Value>>>,
        sent: Arc<Mutex<Vec<Vec<String>>>>,
    }

    impl Scripted {
        fn answering(replies: Vec<Value>) -> Self {
            let scripted = Self::default();
            *scripted.replies.lock().expect("lock") = replies;
            scripted
        }

        fn sent(&self) -> Vec<Vec<String>> {
            self.sent.lock().expect("lock").clone()
        }
    }

    impl ConnectionLike for Scripted {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
            let words = cmd
                .args_iter()
                .map(|arg| match arg {
                    Arg::Simple(word) => String::from_utf8_lossy(word).into_owned(),
                    _ => "<not a word>".to_string(),
                })
                .collect();
            self.sent.lock().expect("lock").push(words);
            let reply = self.replies.lock().expect("lock").remove(0);
            Box::pin(async move { Ok(reply) })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _cmd: &'a redis::Pipeline,
            _offset: usize,
            _count: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            Box::pin(async { unreachable!("scripts send no pipeline") })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    fn noscript() -> Value {
        redis::parse_redis_value(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
            .expect("a RESP error")
    }

    fn words(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| word.to_string()).collect()
    }

    /// A cached script runs with `EVALSHA` alone.
    #[tokio::test]
    async fn a_cached_script_runs_by_its_sha() {
        let script = LuaScript::new("return ARGV[1]");
        let mut conn = Scripted::answering(vec![Value::Int(7)]);
        let reply: i64 = script
            .key("k")
            .arg(7)
            .invoke_async(&mut conn)
            .await
            .expect("ran");
        assert_eq!(reply, 7);
        assert_eq!(
            conn.sent(),
            [words(&["EVALSHA", script.sha(), "1", "k", "7"])]
        );
    }

    /// `NOSCRIPT` (the script did not run) is answered with `EVAL` of the
    /// source with the same keys and arguments — a command routed by its
    /// key — never with `SCRIPT LOAD`, which a cluster client sends to
    /// every node.
    #[tokio::test]
    async fn noscript_is_answered_by_eval_of_the_source_never_script_load() {
        let source = "return redis.call('GET', KEYS[1])";
        let script = LuaScript::new(source);
        let mut conn = Scripted::answering(vec![noscript(), Value::Int(1)]);
        let mut invocation = script.key("{a}1");
        invocation.key("{a}2").arg("x").arg(5);
        let reply: i64 = invocation.invoke_async(&mut conn).await.expect("ran");
        assert_eq!(reply, 1);
        assert_eq!(
            conn.sent(),
            [
                words(&["EVALSHA", script.sha(), "2", "{a}1", "{a}2", "x", "5"]),
                words(&["EVAL", source, "2", "{a}1", "{a}2", "x", "5"]),
            ]
        );
    }

    /// Another error is the caller's, the script not sent again.
    #[tokio::test]
    async fn other_errors_are_returned_as_they_are() {
        let script = LuaScript::new("return 1");
        let wrong = redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n")
            .expect("a RESP error");
        let mut conn = Scripted::answering(vec![wrong]);
        let err = script
            .key("k")
            .invoke_async::<i64>(&mut conn)
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Some("WRONGTYPE"));
        assert_eq!(conn.sent().len(), 1);
    }

    #[test]
    fn the_sha_is_redis_own() {
        assert_eq!(
            LuaScript::new("return KEYS[1]").sha(),
            "4a2267357833227dd98abdedb8cf24b15a986445"
        );
    }
}
