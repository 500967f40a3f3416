//! The Lua scripts of a Redis lock, and how their answers are decoded.
//!
//! Each lock operation is one script, so it is atomic on the server: no other client's command can
//! run between the ownership check and the change. They are shared with the Redlock backend, which
//! runs the same scripts on every master.
//!
//! * [`ACQUIRE`]: `SET lock owner NX PX ttl` when the lock is free and nobody waits ahead of the
//!   caller (a fair queue of waiters, see [`ACQUIRE`]); only then `INCR` the fencing counter
//!   (and re-arm its expiry, if it has one), write the owner record with the lock's TTL and
//!   return the new token. Otherwise stand in the queue (a waiting `lock()`) and return the
//!   holder's remaining `PTTL`, so a waiter knows when an abandoned lock runs out, and whether
//!   the caller heads the queue. A repeated request by the same owner (a retry after a lost
//!   reply) re-arms the TTL and is granted a new, larger token.
//! * [`EXTEND`]: if the lock's value is the owner, `PEXPIRE` it and its owner record; never
//!   re-creates it.
//! * [`EXTEND_MANY`]: [`EXTEND`] for many locks in one call, so auto-renew costs one round trip
//!   per batch rather than one per lease.
//! * [`RELEASE`]: if the lock's value is the owner, `DEL` it and its owner record, else take the
//!   owner out of the queue; then announce the queue's head on its client's wake channel
//!   (`PUBLISH`, or `SPUBLISH` on a Redis Cluster).
//! * [`RAISE_FENCE`] (used by Redlock, not by this crate's client): if the lock's value is the
//!   owner, raise the fencing counter to at least a given token, never lowering it, and put the
//!   token in the owner record.
//! * [`EVICT`]: whoever holds the lock — only the holder with a given fencing token, if one is
//!   given — `DEL` the lock and its owner record and announce it as a release does. The counter
//!   is left alone, so the next grant's token is greater than the evicted one.
//!
//! * [`peek`] (a `MULTI`, not a script): the lock's value and remaining TTL, the counter and the
//!   owner record, read together without changing anything, for `inspect` and `list`.
//!
//! Every script names the owner record ([`keys::owner_key`](super::keys::owner_key)) next to the
//! lock key; the Rust functions below derive it from the lock key.
//!
//! Extend and release tell "expired" (no lock) from "taken over" (another owner's lock, left
//! untouched).
//!
//! # The fencing counter after a data loss
//!
//! When the counter does not exist — the first grant of a key, or a server that restarted without
//! persistence, or a `FLUSHALL` — the script starts it at the server's clock in microseconds
//! (`TIME`), not at 1. Tokens issued after a total loss of the data therefore stay above the ones
//! issued before it, as long as the server's clock did not go back and the key saw fewer than a
//! million grants per second on average. A caller may name a least start
//! ([`AcquireCall::least_start`], its own clock ahead by a margin: Redlock's client does), and the
//! counter then starts at the greater of the two; the same holds with that caller's clock among
//! the clocks that must not go back, or lag the one that started the lost counter by more than
//! the time since. A counter that survives but is *stale* (an asynchronous
//! replica promoted after a crash, a restore from an older snapshot) can still repeat tokens: that
//! is why the backend declares
//! [`MonotonicWhileDataSurvives`](dlock_core::backend::FencingGuarantee::MonotonicWhileDataSurvives).
//!
//! # The fencing counter's expiry
//!
//! By default a counter never expires: one small key stays behind for every lock name ever
//! granted. With a fence TTL (`RedisLockBuilder::with_fence_ttl`, the `fence_ttl` URL parameter) the
//! acquire script gives the counter that expiry with every grant, in the same script, so a
//! counter disappears once its key has gone unused (no grant) for the fence TTL.
//!
//! What that keeps, exactly:
//!
//! * While no grant of a key is more than the fence TTL after the one before, its counter never
//!   goes away, and tokens grow strictly by `INCR` alone, whatever the clocks do.
//! * After a longer pause the counter is gone, and the next grant restarts it at the server's
//!   clock in microseconds, as after a data loss (above). That value is above every earlier token
//!   of the key as long as the server's clock did not go back (for Redlock: no master's clock is
//!   behind another's by more than the pause) and the key averaged fewer than a million grants per
//!   second since its counter was started. Tokens therefore still grow across the restart under
//!   the same conditions under which they survive a total data loss; the option only makes such
//!   restarts routine for keys used less often than the fence TTL.
//!
//! A client without the option leaves an existing expiry alone (`INCR` keeps it), so clients of
//! one key should agree on the setting; `PERSIST` a counter to make it permanent again.
//!
//! # Script cache
//!
//! Scripts run by SHA1 (`EVALSHA`). When the server answers `NOSCRIPT` — it restarted, failed over,
//! or someone ran `SCRIPT FLUSH` — the call is repeated once with `EVAL` and the full source, which
//! also puts the script back in the cache. `NOSCRIPT` guarantees the first attempt did nothing, so
//! repeating it is safe. dlock-redlock loads every script ([`load_all`]) on each connection it
//! opens, before using it.
//!
//! `redis::Script` does the same job with one more round trip: on `NOSCRIPT` it sends
//! `SCRIPT LOAD` (in a Redis Cluster, to every primary) and then `EVALSHA` again, and it copies
//! every key and argument into vectors of its own per call. `EVAL` carries the key, runs at once
//! on the key's shard, and caches the script there.

use std::sync::LazyLock;
use std::time::Duration;

use dlock_core::backend::clock::ClockReading;
use dlock_core::backend::Extension;
use dlock_core::inspect::{Eviction, Holder};
use dlock_core::{FencingToken, OwnerRecord, Released};
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind};
use tokio::time::Instant;

use super::keys::{lapse_key, owner_key, queue_key};

/// One Lua script with its SHA1, ready to run by hash.
#[derive(Debug)]
pub struct LockScript {
    name: &'static str,
    source: &'static str,
    hash: String,
}

impl LockScript {
    pub(crate) fn new(name: &'static str, source: &'static str) -> Self {
        LockScript {
            name,
            source,
            hash: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// A short name for errors and tracing: `acquire`, `extend`, `extend_many`, `release`,
    /// `raise_fence` or `evict`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Lua source.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// The SHA1 of the source, as `EVALSHA` and `SCRIPT EXISTS` take it.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// Runs the script with `keys` and `args`: `EVALSHA`, and `EVAL` once if the server's script
    /// cache lost it.
    ///
    /// # Cancel safety
    /// If dropped, the script may or may not have run once; it never runs twice.
    pub async fn invoke<C, T>(&self, con: &mut C, keys: &[&str], args: &[&[u8]]) -> RedisResult<T>
    where
        C: ConnectionLike + Send,
        T: FromRedisValue,
    {
        let by_hash = self.command("EVALSHA", &self.hash, keys, args);
        match by_hash.query_async(con).await {
            Err(e) if is_noscript(&e) => {
                tracing::debug!(
                    script = self.name,
                    "server lost the script cache: running the source"
                );
                self.command("EVAL", self.source, keys, args)
                    .query_async(con)
                    .await
            }
            other => other,
        }
    }

    fn command(&self, verb: &str, script: &str, keys: &[&str], args: &[&[u8]]) -> Cmd {
        let bytes = verb.len()
            + script.len()
            + 2
            + keys.iter().map(|k| k.len()).sum::<usize>()
            + args.iter().map(|a| a.len()).sum::<usize>();
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), bytes);
        cmd.arg(verb).arg(script).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        for arg in args {
            cmd.arg(*arg);
        }
        cmd
    }
}

/// Every script a lock and its primitives run.
pub fn all() -> [&'static LockScript; 11] {
    use super::primitives;
    [
        &ACQUIRE,
        &EXTEND,
        &EXTEND_MANY,
        &RELEASE,
        &RAISE_FENCE,
        &EVICT,
        &primitives::ACQUIRE,
        &primitives::EXTEND,
        &primitives::RELEASE,
        &primitives::PEEK,
        &primitives::RAISE_FENCE,
    ]
}

/// `SCRIPT LOAD` of every script of [`all`], in one pipeline (each reply is ignored). Sent on a
/// new connection before it is used, so that the requests made together on it (a burst of
/// renewals on a fresh master) find their scripts cached, rather than each meeting `NOSCRIPT`
/// and sending its source.
pub fn load_all() -> redis::Pipeline {
    let mut pipeline = redis::pipe();
    for script in all() {
        pipeline
            .cmd("SCRIPT")
            .arg("LOAD")
            .arg(script.source())
            .ignore();
    }
    pipeline
}

fn is_noscript(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// The Lua function the scripts that name a queue's head announce it with: an entry
/// `owner:tag` on the wake channel of its client (the release channel, `:`, the tag), with the
/// owner token as the message; an entry without a tag on the release channel itself.
macro_rules! announce_lua {
    () => {
        r#"
local function announce(command, channel, head)
  local owner, tag = string.match(head, '^([^:]*):(.+)$')
  if tag then
    redis.pcall(command, channel .. ':' .. tag, owner)
  else
    redis.pcall(command, channel, head)
  end
end
"#
    };
}

/// Takes a lock, or stands in its queue of waiters. Returns the fencing token (always positive)
/// when granted; otherwise `{pttl, head, foreign, ahead}`: the holder's remaining `PTTL` (-1: no
/// TTL, -2: the lock is free but another waiter is ahead), 1 if the caller heads the queue, 1 if
/// the holder has no owner record of its own (a foreign client's `SET NX`, whose release is not
/// announced), and for the second in line the milliseconds until the head's entry lapses (-1
/// otherwise: it comes back then, in case the head crashed). See [`decode_acquire`].
///
/// The fair queue (see [`keys`](super::keys#the-waiters-queue)): while the lock is held or
/// anyone waits, the script
/// 1. drops the waiters whose entry lapsed (a crashed waiter stops refreshing its entry);
/// 2. with an entry lifetime above 0 (a waiting `lock()`; 0 is a `try_lock`), puts the caller
///    in the queue if it is not there — at the arrival score given, or past the queue's last
///    one — and sets its entry to lapse that long from now (server time);
/// 3. grants only if the lock is free and the caller heads the queue (or nobody waits), and
///    then takes the caller out of the queue;
/// 4. if the lock is free and step 1 made someone else the head, announces that head's owner
///    token, so that its client wakes it (no lost wake-up when a queued waiter crashed).
///
/// A queue entry is the owner token followed by `:` and the wake tag of the waiter's client
/// (just the owner token without a tag). A head is announced on the release channel followed by
/// `:` and its tag ([`keys::wake_channel`](super::keys::wake_channel)), a channel only that client
/// listens to, so a release costs the other waiting clients nothing; a head without a tag is
/// announced on the release channel itself.
///
/// An uncontended grant (free lock, empty queue) skips all of it: `EXISTS` on the queue, then
/// `SET NX`, which takes the free lock in the same command that finds it free; only when the
/// queue exists or `SET NX` finds the lock taken does the script read the holder (`GET`) and
/// go through the steps above. Then `INCR` for the token and the owner record (`HSET`,
/// `PEXPIRE`): five commands in all.
///
/// A grant writes the owner record hash (`token`, `fencing`, `record`) with the lock's TTL. The
/// token goes in as text made by `%d`: Lua's own number-to-text conversion keeps only 14 digits.
/// A repeated request by the holder (a retry after a lost reply) re-arms the TTL and is granted
/// a new, larger token.
///
/// `KEYS[1]` lock key, `KEYS[2]` fencing counter, `KEYS[3]` owner record, `KEYS[4]` waiters,
/// `KEYS[5]` waiter lapses; `ARGV[1]` owner token, `ARGV[2]` TTL in ms, `ARGV[3]` the owner
/// record's JSON, `ARGV[4]` the counter's expiry in ms or `''` (see
/// [the module docs](self#the-fencing-counters-expiry)), `ARGV[5]` the queue entry's lifetime
/// in ms (0: never enqueue), `ARGV[6]` the arrival score or `''` (past the last), `ARGV[7]` the
/// release channel or `''`, `ARGV[8]` `PUBLISH` or `SPUBLISH`, `ARGV[9]` the wake tag or `''`,
/// `ARGV[10]` the least start of a new counter in µs or `''` (see [`AcquireCall::least_start`]).
/// Needs Redis 5 or later (effects replication, for `TIME` followed by a write).
pub static ACQUIRE: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        "acquire",
        concat!(
            announce_lua!(),
            r#"
local owner = ARGV[1]
local member = owner
if ARGV[9] ~= '' then member = owner .. ':' .. ARGV[9] end
local queued = redis.call('EXISTS', KEYS[4]) == 1
local holder = false
if queued or not redis.call('SET', KEYS[1], owner, 'NX', 'PX', ARGV[2]) then
  holder = redis.call('GET', KEYS[1])
  if holder == owner then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  else
    if holder or queued then
      local t = redis.call('TIME')
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      local first = false
      if queued then
        first = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
        local lapsed = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
        for i = 1, #lapsed do redis.call('ZREM', KEYS[4], lapsed[i]) end
        if #lapsed > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now) end
      end
      local lifetime = tonumber(ARGV[5])
      if lifetime > 0 then
        if not redis.call('ZSCORE', KEYS[4], member) then
          local score = ARGV[6]
          if score == '' then
            local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
            score = string.format('%d', (tonumber(last[2]) or 0) + 1)
          end
          redis.call('ZADD', KEYS[4], score, member)
        end
        redis.call('ZADD', KEYS[5], string.format('%d', now + lifetime), member)
      end
      local head = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
      if not holder and head and head ~= first and head ~= member and ARGV[7] ~= '' then
        announce(ARGV[8], ARGV[7], head)
      end
      if holder or (head and head ~= member) then
        local pttl, foreign, ahead = -2, 0, -1
        if holder then
          pttl = redis.call('PTTL', KEYS[1])
          if redis.call('HGET', KEYS[3], 'token') ~= holder then foreign = 1 end
        end
        if head == member then return {pttl, 1, foreign, ahead} end
        if redis.call('ZRANK', KEYS[4], member) == 1 then
          local lapse = redis.call('ZSCORE', KEYS[5], head)
          if lapse then ahead = math.max(0, tonumber(lapse) - now) end
        end
        return {pttl, 0, foreign, ahead}
      end
      if head then
        redis.call('ZREM', KEYS[4], member)
        redis.call('ZREM', KEYS[5], member)
      end
    end
    redis.call('SET', KEYS[1], owner, 'PX', ARGV[2])
  end
end
local token = redis.call('INCR', KEYS[2])
if token == 1 then
  local now = redis.call('TIME')
  token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if ARGV[10] ~= '' then token = math.max(token, tonumber(ARGV[10])) end
  redis.call('SET', KEYS[2], string.format('%d', token))
end
if ARGV[4] ~= '' then redis.call('PEXPIRE', KEYS[2], ARGV[4]) end
redis.call('HSET', KEYS[3], 'token', owner, 'fencing', string.format('%d', token), 'record', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return token
"#
        ),
    )
});

/// Re-arms a lock's TTL, and its owner record's, if the owner still holds it. Returns
/// `{code, seconds, microseconds}`: [`HELD_BY_CALLER`], [`NOT_HELD`] or [`HELD_BY_OTHER`], and
/// the server's clock (`TIME`), which the client compares with its own at every renewal (see
/// [`dlock_core::backend::clock`]): the server expires the key by that clock.
///
/// `KEYS[1]` lock key, `KEYS[2]` owner record; `ARGV[1]` owner token, `ARGV[2]` TTL in ms.
pub static EXTEND: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        "extend",
        r#"
local holder = redis.call('GET', KEYS[1])
local code = 0
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  code = 1
elseif holder then
  code = 2
end
local t = redis.call('TIME')
return {code, tonumber(t[1]), tonumber(t[2])}
"#,
    )
});

/// [`EXTEND`] for many locks in one script: returns one code per key, in order, followed by the
/// server's clock (`TIME`'s seconds and microseconds).
///
/// `KEYS[2i - 1]` lock key, `KEYS[2i]` its owner record; `ARGV[2i - 1]` its owner token,
/// `ARGV[2i]` its TTL in ms.
pub static EXTEND_MANY: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        "extend_many",
        r#"
local answers = {}
local n = #KEYS / 2
for i = 1, n do
  local holder = redis.call('GET', KEYS[2 * i - 1])
  if holder == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[2 * i - 1], ARGV[2 * i])
    redis.call('PEXPIRE', KEYS[2 * i], ARGV[2 * i])
    answers[i] = 1
  elseif holder then
    answers[i] = 2
  else
    answers[i] = 0
  end
end
local t = redis.call('TIME')
answers[n + 1] = tonumber(t[1])
answers[n + 2] = tonumber(t[2])
return answers
"#,
    )
});

/// Deletes a lock and its owner record if the owner still holds it; otherwise takes the owner's
/// entry out of the lock's queue of waiters (a waiter that gave up or was dropped withdraws with
/// a release by its owner token). Then, if the lock is free, announces it: the waiter at the head
/// of the queue on its client's wake channel (see [`ACQUIRE`]), so that only that waiter is
/// woken, or an empty message on the release channel if nobody is queued and the caller released
/// (for `wait_for_release` and the waiters of the primitives). Returns [`HELD_BY_CALLER`], [`NOT_HELD`]
/// or [`HELD_BY_OTHER`].
///
/// The announcement is best effort (`redis.pcall`): a user without permission for the channel
/// (Redis 7 gives new ACL users none) still releases; waiters then find out by polling. On a Redis
/// Cluster it is `SPUBLISH` on a *sharded* channel (Redis 7), which stays on the lock's shard; a
/// script may only publish on a sharded channel of its own slot, so the channel must hash like the
/// lock key (the cluster's release channel does).
///
/// The owner's entry is `owner:tag` with the wake tag in `ARGV[4]`. Without one (an eviction by
/// the holder's value, which does not know its client's tag) every entry of the owner goes,
/// whatever its tag: the queue is scanned, which only such a release pays for. A Redlock holder
/// may still stand in the queues of masters that refused it.
///
/// A waiter that gives back a grant short of a quorum (Redlock) keeps its place instead: with
/// its arrival score in `ARGV[5]` and its entry's lifetime in `ARGV[6]`, a deleted grant puts it
/// back in the queue at that score, and where it did not hold the lock its entry stays. It is not
/// announced to itself.
///
/// `KEYS[1]` lock key, `KEYS[2]` owner record, `KEYS[3]` waiters, `KEYS[4]` waiter lapses;
/// `ARGV[1]` owner token, `ARGV[2]` release channel or `""`, `ARGV[3]` `PUBLISH` or `SPUBLISH`,
/// `ARGV[4]` the owner's wake tag or `""`, optional `ARGV[5]` arrival score and `ARGV[6]` entry
/// lifetime in ms.
pub static RELEASE: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        "release",
        concat!(
            announce_lua!(),
            r#"
local member = ARGV[1]
if ARGV[4] ~= '' then member = ARGV[1] .. ':' .. ARGV[4] end
local holder = redis.call('GET', KEYS[1])
local code = 0
local stay = ARGV[5] ~= nil
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  holder = false
  code = 1
  if stay then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZADD', KEYS[3], ARGV[5], member)
    redis.call('ZADD', KEYS[4], string.format('%d', now + tonumber(ARGV[6])), member)
  end
else
  if holder then code = 2 end
  if not stay then
    redis.call('ZREM', KEYS[3], member)
    redis.call('ZREM', KEYS[4], member)
    if ARGV[4] == '' then
      local tagged = ARGV[1] .. ':'
      for _, entry in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
        if string.sub(entry, 1, #tagged) == tagged then
          redis.call('ZREM', KEYS[3], entry)
          redis.call('ZREM', KEYS[4], entry)
        end
      end
    end
  end
end
if not holder and ARGV[2] ~= '' then
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head then
    if head ~= member then announce(ARGV[3], ARGV[2], head) end
  elseif code == 1 then
    redis.pcall(ARGV[3], ARGV[2], '')
  end
end
return code
"#
        ),
    )
});

/// Raises a lock's fencing counter to at least a given token if the owner still holds the lock;
/// never lowers it. Returns [`HELD_BY_CALLER`], [`NOT_HELD`] or [`HELD_BY_OTHER`].
///
/// Redlock takes the largest token its majority of masters granted and writes it back to them with
/// this script, so that every master of that majority counts from at least that token onwards.
/// The comparison is done on Lua numbers (doubles), exact for tokens below 2^53 — the counters
/// start at the server's clock in microseconds (about 2^51 today), so that holds for centuries.
///
/// `SET` drops a key's expiry, so a raised counter gets the expiry of `ARGV[3]` again (an unraised
/// one keeps the expiry the acquire script just gave it). The owner record's `fencing` becomes the
/// token, so that a quorum of masters shows the holder's token (`HSET` keeps the record's expiry).
///
/// `KEYS[1]` lock key, `KEYS[2]` fencing counter, `KEYS[3]` owner record; `ARGV[1]` owner token,
/// `ARGV[2]` token, optional `ARGV[3]` the counter's expiry in ms.
pub static RAISE_FENCE: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        "raise_fence",
        r#"
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then
  if holder then return 2 end
  return 0
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
  if ARGV[3] then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
end
if redis.call('HGET', KEYS[3], 'token') == ARGV[1] then
  redis.call('HSET', KEYS[3], 'fencing', ARGV[2])
end
return 1
"#,
    )
});

/// Removes whoever holds a lock — only the holder whose owner record shows the fencing token
/// `ARGV[1]`, if it is not empty — with its owner record, and announces it as a release does.
/// The fencing counter is left alone, so the next grant's token is greater than the evicted
/// holder's. A holder without an owner record (a peer's `SET NX`) has no known token: it is
/// evicted only without an expected token.
///
/// Returns `{code, value, pttl, record token, record fencing, record JSON}`: code
/// [`NOT_HELD`] (nothing else follows), [`EVICTED`] or [`HELD_BY_OTHER`] (the holder is not the
/// expected one; nothing changed), with what the lock and its owner record held (see
/// [`decode_evict`]).
///
/// One script for both kinds of server: `ARGV[3]` is the publishing command, `PUBLISH`, or
/// `SPUBLISH` on a Redis Cluster (whose channel is in the lock key's slot; see [`RELEASE`]).
/// Best effort, as for a release; like a release, it names the head of the queue of waiters.
///
/// `KEYS[1]` lock key, `KEYS[2]` owner record, `KEYS[3]` waiters; `ARGV[1]` expected fencing token or `""`,
/// `ARGV[2]` release channel or `""`, `ARGV[3]` `PUBLISH` or `SPUBLISH`.
pub static EVICT: LazyLock<LockScript> = LazyLock::new(|| {
    LockScript::new(
        "evict",
        concat!(
            announce_lua!(),
            r#"
local holder = redis.call('GET', KEYS[1])
if not holder then return {0} end
local pttl = redis.call('PTTL', KEYS[1])
local record = redis.call('HMGET', KEYS[2], 'token', 'fencing', 'record')
if ARGV[1] ~= '' and (record[1] ~= holder or record[2] ~= ARGV[1]) then
  return {2, holder, pttl, record[1], record[2], record[3]}
end
redis.call('DEL', KEYS[1], KEYS[2])
if ARGV[2] ~= '' then
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head then announce(ARGV[3], ARGV[2], head) else redis.pcall(ARGV[3], ARGV[2], '') end
end
return {1, holder, pttl, record[1], record[2], record[3]}
"#
        ),
    )
});

/// Evict answer: the holder was removed.
pub const EVICTED: i64 = 1;

/// Extend/release answer: the caller held the lock (and the change was made).
pub const HELD_BY_CALLER: i64 = 1;
/// Extend/release answer: nobody holds the lock; nothing was changed.
pub const NOT_HELD: i64 = 0;
/// Extend/release answer: another owner holds the lock; it was left untouched.
pub const HELD_BY_OTHER: i64 = 2;

/// The answer of [`ACQUIRE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// The lock is the caller's, with this fencing token.
    Granted(FencingToken),
    /// Not granted: another owner holds it, or another waiter is ahead of the caller.
    Busy {
        /// The holder's remaining time to live; `None` if the holder's key has no TTL or the
        /// lock is free (and another waiter heads the queue).
        pttl: Option<Duration>,
        /// The caller heads the queue of waiters: it is granted the lock once it is free.
        head: bool,
        /// The holder is not a dlock client (no owner record of its own, as after a foreign
        /// client's `SET NX`): its release will not be announced.
        foreign: bool,
        /// For the second in line: when the head's queue entry lapses unless refreshed. If the
        /// head crashed, the caller heads the queue then.
        head_lapses_in: Option<Duration>,
    },
}

/// Decodes the reply of [`ACQUIRE`]: a positive token, or `{pttl, head, foreign, ahead}` when
/// busy.
pub fn decode_acquire(reply: redis::Value) -> RedisResult<AcquireReply> {
    match reply {
        redis::Value::Int(token @ 1..) => {
            Ok(AcquireReply::Granted(FencingToken(token.unsigned_abs())))
        }
        redis::Value::Array(fields) => {
            let field = |i: usize| match fields.get(i) {
                Some(redis::Value::Int(n)) => Ok(*n),
                _ => Err(unexpected(format!("acquire answered {fields:?}"))),
            };
            let millis = |n: i64| u64::try_from(n).ok().map(Duration::from_millis);
            Ok(AcquireReply::Busy {
                pttl: millis(field(0)?),
                head: field(1)? == 1,
                foreign: field(2)? == 1,
                head_lapses_in: millis(field(3)?),
            })
        }
        other => Err(unexpected(format!("acquire answered {other:?}"))),
    }
}

/// The answer of [`RAISE_FENCE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceRaise {
    /// The caller holds the lock; the counter is now at least the token.
    Raised,
    /// Nobody holds the lock; the counter was left alone.
    NotHeld,
    /// Another owner holds the lock; the counter was left alone.
    HeldByOther,
}

/// Decodes the reply of [`RAISE_FENCE`].
pub fn decode_raise_fence(code: i64) -> RedisResult<FenceRaise> {
    match code {
        HELD_BY_CALLER => Ok(FenceRaise::Raised),
        NOT_HELD => Ok(FenceRaise::NotHeld),
        HELD_BY_OTHER => Ok(FenceRaise::HeldByOther),
        other => Err(unexpected(format!("raise_fence answered {other}"))),
    }
}

/// Decodes the reply of [`EXTEND`].
pub fn decode_extend(code: i64) -> RedisResult<Extension> {
    match code {
        HELD_BY_CALLER => Ok(Extension::Extended),
        NOT_HELD => Ok(Extension::Expired),
        HELD_BY_OTHER => Ok(Extension::TakenOver),
        other => Err(unexpected(format!("extend answered {other}"))),
    }
}

/// Decodes the reply of [`RELEASE`].
pub fn decode_release(code: i64) -> RedisResult<Released> {
    match code {
        HELD_BY_CALLER => Ok(Released::Released),
        NOT_HELD => Ok(Released::Expired),
        HELD_BY_OTHER => Ok(Released::TakenOver),
        other => Err(unexpected(format!("release answered {other}"))),
    }
}

fn unexpected(detail: String) -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "unexpected script reply",
        detail,
    ))
}

/// A TTL as the whole milliseconds Redis takes, rounded up so the server never holds a lock for
/// less than the client counts on.
pub fn ttl_millis(ttl: Duration) -> u64 {
    let millis = ttl.as_millis();
    let rounded = if ttl.subsec_nanos().is_multiple_of(1_000_000) {
        millis
    } else {
        millis + 1
    };
    u64::try_from(rounded).unwrap_or(u64::MAX)
}

/// How a release is announced: `PUBLISH`, or `SPUBLISH` on a sharded channel (Redis Cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Publish {
    /// `PUBLISH` (a single server, Sentinel, Redlock's masters).
    #[default]
    Plain,
    /// `SPUBLISH` (Redis Cluster: the channel is in the lock key's slot).
    Sharded,
}

impl Publish {
    /// The command's name, as the scripts take it.
    pub fn command(self) -> &'static str {
        match self {
            Publish::Plain => "PUBLISH",
            Publish::Sharded => "SPUBLISH",
        }
    }
}

/// How an attempt of [`ACQUIRE`] uses the lock's queue of waiters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Queueing<'a> {
    /// How long the caller's queue entry lives unless refreshed by another attempt;
    /// [`Duration::ZERO`] (a `try_lock`) never enqueues. A waiter passes its lease TTL, so that a
    /// crashed waiter blocks the queue no longer than it would have held the lock.
    pub entry_lifetime: Duration,
    /// The caller's place in the queue when it enters it; `None`: past the last waiter (the
    /// server picks). Redlock passes one client-chosen score to every master, so that all
    /// masters order waiters alike.
    pub arrival: Option<u64>,
    /// The release channel on which a new head of the queue is announced, or `""`.
    pub channel: &'a str,
    /// How the announcement is published.
    pub publish: Publish,
    /// The caller's client's wake tag, or `""`: its queue entry is `owner:tag`, and a release
    /// that makes it the head announces it on the release channel followed by `:tag`, which only
    /// its client listens to (see [`keys::wake_channel`](super::keys::wake_channel)).
    pub wake_tag: &'a str,
}

/// One run of [`ACQUIRE`]: what is asked, with which keys.
#[derive(Debug, Clone, Copy)]
pub struct AcquireCall<'a> {
    /// The lock key.
    pub lock_key: &'a str,
    /// Its fencing counter ([`keys::fence_key`](super::keys::fence_key)).
    pub fence_key: &'a str,
    /// The owner token's hex form.
    pub owner: &'a str,
    /// The owner record's JSON, left with a grant.
    pub record: &'a str,
    /// The lease's TTL.
    pub ttl: Duration,
    /// The fencing counter's expiry, if any.
    pub fence_ttl: Option<Duration>,
    /// Where a counter that does not exist yet starts at the least, in microseconds since the
    /// Unix epoch; it starts at the greater of this and the server's clock (see
    /// [the module docs](self#the-fencing-counter-after-a-data-loss)). `None`: at the server's
    /// clock. Redlock passes one value, ahead of the masters' clocks, to every master, so that
    /// the masters of a key nobody used yet start their counters alike and its first grant
    /// needs no write-back round.
    pub least_start: Option<u64>,
    /// How the attempt uses the queue of waiters.
    pub queue: Queueing<'a>,
}

impl AcquireCall<'_> {
    /// Runs [`ACQUIRE`]; the queue's keys are derived from the lock key.
    ///
    /// # Cancel safety
    /// If dropped, the lock may or may not have been taken, and the caller may or may not stand
    /// in the queue; release by owner token, with the same wake tag, to be sure (that also
    /// withdraws a queue entry).
    pub async fn run<C>(&self, con: &mut C) -> RedisResult<AcquireReply>
    where
        C: ConnectionLike + Send,
    {
        let ttl = ttl_millis(self.ttl).to_string();
        let fence_ttl = self
            .fence_ttl
            .map(|t| ttl_millis(t).to_string())
            .unwrap_or_default();
        let lifetime = ttl_millis(self.queue.entry_lifetime).to_string();
        let arrival = self
            .queue
            .arrival
            .map(|a| a.to_string())
            .unwrap_or_default();
        let least_start = self.least_start.map(|s| s.to_string()).unwrap_or_default();
        let args = [
            self.owner.as_bytes(),
            ttl.as_bytes(),
            self.record.as_bytes(),
            fence_ttl.as_bytes(),
            lifetime.as_bytes(),
            arrival.as_bytes(),
            self.queue.channel.as_bytes(),
            self.queue.publish.command().as_bytes(),
            self.queue.wake_tag.as_bytes(),
            least_start.as_bytes(),
        ];
        let (record, queue, lapses) = (
            owner_key(self.lock_key),
            queue_key(self.lock_key),
            lapse_key(self.lock_key),
        );
        let keys = [self.lock_key, self.fence_key, &record, &queue, &lapses];
        decode_acquire(ACQUIRE.invoke(con, &keys, &args).await?)
    }
}

/// Runs [`ACQUIRE`] for `owner` (the owner token's hex form) on `lock_key` and its `fence_key`
/// (see [`crate::protocol::keys`]), leaving `record` (an owner record's JSON) in the lock's owner
/// record; `fence_ttl`, if any, becomes the counter's expiry. It never enqueues (a `try_lock`)
/// and announces nothing; see [`AcquireCall`] for the rest.
///
/// # Cancel safety
/// If dropped, the lock may or may not have been taken; release by owner token to be sure.
pub async fn acquire<C>(
    con: &mut C,
    lock_key: &str,
    fence_key: &str,
    owner: &str,
    record: &str,
    ttl: Duration,
    fence_ttl: Option<Duration>,
) -> RedisResult<AcquireReply>
where
    C: ConnectionLike + Send,
{
    AcquireCall {
        lock_key,
        fence_key,
        owner,
        record,
        ttl,
        fence_ttl,
        least_start: None,
        queue: Queueing::default(),
    }
    .run(con)
    .await
}

/// Runs [`EXTEND`] for `owner`.
///
/// # Cancel safety
/// If dropped, the TTL may or may not have been re-armed; ownership is unchanged either way.
pub async fn extend<C>(
    con: &mut C,
    lock_key: &str,
    owner: &str,
    ttl: Duration,
) -> RedisResult<Timed<Extension>>
where
    C: ConnectionLike + Send,
{
    let ttl = ttl_millis(ttl).to_string();
    let record = owner_key(lock_key);
    let sent = Instant::now();
    let (code, seconds, micros): (i64, i64, i64) = EXTEND
        .invoke(
            con,
            &[lock_key, &record],
            &[owner.as_bytes(), ttl.as_bytes()],
        )
        .await?;
    Ok(Timed::new(
        decode_extend(code)?,
        sent,
        time_us(seconds, micros),
    ))
}

/// Runs [`EXTEND_MANY`] for `(lock key, owner, ttl)` triples, one round trip for all of them.
///
/// # Cancel safety
/// If dropped, the TTLs may or may not have been re-armed; ownership is unchanged either way.
pub async fn extend_many<C>(
    con: &mut C,
    locks: &[(&str, &str, Duration)],
) -> RedisResult<Timed<Vec<Extension>>>
where
    C: ConnectionLike + Send,
{
    let records: Vec<String> = locks.iter().map(|(key, _, _)| owner_key(key)).collect();
    let keys: Vec<&str> = locks
        .iter()
        .zip(&records)
        .flat_map(|((key, _, _), record)| [*key, record.as_str()])
        .collect();
    let ttls: Vec<String> = locks
        .iter()
        .map(|(_, _, ttl)| ttl_millis(*ttl).to_string())
        .collect();
    let args: Vec<&[u8]> = locks
        .iter()
        .zip(&ttls)
        .flat_map(|((_, owner, _), ttl)| [owner.as_bytes(), ttl.as_bytes()])
        .collect();
    let sent = Instant::now();
    let mut codes: Vec<i64> = EXTEND_MANY.invoke(con, &keys, &args).await?;
    if codes.len() != locks.len() + 2 {
        return Err(unexpected(format!(
            "extend_many answered {} values for {} locks",
            codes.len(),
            locks.len()
        )));
    }
    let micros = codes.pop().unwrap_or_default();
    let seconds = codes.pop().unwrap_or_default();
    let answers = codes
        .into_iter()
        .map(decode_extend)
        .collect::<RedisResult<_>>()?;
    Ok(Timed::new(answers, sent, time_us(seconds, micros)))
}

/// A script's answer with the server's clock, read by the same script, and the client's time
/// around the request: a [`ClockReading`] for the clock watch ([`dlock_core::backend::clock`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed<T> {
    /// The script's answer.
    pub answer: T,
    /// The server's clock, and when the request was sent and answered.
    pub clock: ClockReading,
}

impl<T> Timed<T> {
    /// `answer`, with the server's clock `server_us` read by a request sent at `sent` and
    /// answered now.
    pub(crate) fn new(answer: T, sent: Instant, server_us: i64) -> Self {
        Timed {
            answer,
            clock: ClockReading {
                server_us,
                sent,
                answered: Instant::now(),
            },
        }
    }
}

/// `TIME`'s two answers in microseconds since the Unix epoch.
fn time_us(seconds: i64, micros: i64) -> i64 {
    seconds.saturating_mul(1_000_000).saturating_add(micros)
}

/// Runs [`RELEASE`] for `owner` without a wake tag (which also withdraws its queue entries,
/// whatever their tag), announcing the queue's head on `channel` (none if empty) with `PUBLISH`:
/// [`ReleaseCall`] with the defaults.
///
/// # Cancel safety
/// If dropped, the release may or may not have happened; repeating it is harmless.
pub async fn release<C>(
    con: &mut C,
    lock_key: &str,
    owner: &str,
    channel: &str,
) -> RedisResult<Released>
where
    C: ConnectionLike + Send,
{
    ReleaseCall {
        lock_key,
        owner,
        channel,
        publish: Publish::Plain,
        wake_tag: "",
        keep_place: None,
    }
    .run(con)
    .await
}

/// One run of [`RELEASE`]: what is asked, with which keys.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseCall<'a> {
    /// The lock key.
    pub lock_key: &'a str,
    /// The owner token's hex form.
    pub owner: &'a str,
    /// The release channel on which the queue's head is announced, or `""`.
    pub channel: &'a str,
    /// How the announcement is published.
    pub publish: Publish,
    /// The wake tag the owner waited with, or `""` (see [`Queueing::wake_tag`]): it names the
    /// owner's queue entry.
    pub wake_tag: &'a str,
    /// `None`: a release, which also withdraws the owner's queue entry. `Some((arrival,
    /// entry_lifetime))`: a waiter gives a grant back but keeps its place in the queue (see
    /// [`RELEASE`]).
    pub keep_place: Option<(u64, Duration)>,
}

impl ReleaseCall<'_> {
    /// Runs [`RELEASE`]; the owner record's and the queue's keys are derived from the lock key.
    ///
    /// # Cancel safety
    /// If dropped, the release may or may not have happened; repeating it is harmless.
    pub async fn run<C>(&self, con: &mut C) -> RedisResult<Released>
    where
        C: ConnectionLike + Send,
    {
        let (record, queue, lapses) = (
            owner_key(self.lock_key),
            queue_key(self.lock_key),
            lapse_key(self.lock_key),
        );
        let place = self
            .keep_place
            .map(|(arrival, lifetime)| (arrival.to_string(), ttl_millis(lifetime).to_string()));
        let mut args = vec![
            self.owner.as_bytes(),
            self.channel.as_bytes(),
            self.publish.command().as_bytes(),
            self.wake_tag.as_bytes(),
        ];
        if let Some((arrival, lifetime)) = &place {
            args.extend([arrival.as_bytes(), lifetime.as_bytes()]);
        }
        let code: i64 = RELEASE
            .invoke(con, &[self.lock_key, &record, &queue, &lapses], &args)
            .await?;
        decode_release(code)
    }
}

/// Runs [`RAISE_FENCE`] for `owner`: the counter `fence_key` becomes at least `token` if `owner`
/// holds `lock_key`.
///
/// # Cancel safety
/// If dropped, the counter may or may not have been raised; repeating it is harmless.
pub async fn raise_fence<C>(
    con: &mut C,
    lock_key: &str,
    fence_key: &str,
    owner: &str,
    token: FencingToken,
    fence_ttl: Option<Duration>,
) -> RedisResult<FenceRaise>
where
    C: ConnectionLike + Send,
{
    let token = token.0.to_string();
    let fence_ttl = fence_ttl.map(|t| ttl_millis(t).to_string());
    let mut args = vec![owner.as_bytes(), token.as_bytes()];
    args.extend(fence_ttl.as_deref().map(str::as_bytes));
    let record = owner_key(lock_key);
    let code: i64 = RAISE_FENCE
        .invoke(con, &[lock_key, fence_key, &record], &args)
        .await?;
    decode_raise_fence(code)
}

/// The reply of [`EVICT`]: code, value, pttl, and the owner record's token, fencing and JSON.
type EvictFields = (
    i64,
    Option<Vec<u8>>,
    Option<i64>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
);

/// Decodes the reply of [`EVICT`].
pub fn decode_evict(reply: EvictFields) -> RedisResult<Eviction> {
    let (code, value, pttl, token, fencing, record) = reply;
    let seen = Peek {
        holder: value,
        pttl: pttl
            .and_then(|p| u64::try_from(p).ok())
            .map(Duration::from_millis),
        counter: None,
        recorded: Recorded::read(token, fencing, record),
    };
    match code {
        NOT_HELD => Ok(Eviction::Free),
        EVICTED => Ok(Eviction::Evicted(seen.holder_view())),
        HELD_BY_OTHER => Ok(Eviction::Changed(seen.holder_view())),
        other => Err(unexpected(format!("evict answered {other}"))),
    }
}

/// Runs [`EVICT`] on `lock_key`: removes its holder (only the one with the fencing token
/// `expected`, if given) and announces it on `channel` (none if empty) with `PUBLISH`, or with
/// `SPUBLISH` if `sharded`.
///
/// # Cancel safety
/// If dropped, the eviction may or may not have happened.
pub async fn evict<C>(
    con: &mut C,
    lock_key: &str,
    expected: Option<FencingToken>,
    channel: &str,
    sharded: bool,
) -> RedisResult<Eviction>
where
    C: ConnectionLike + Send,
{
    let expected = expected.map(|t| t.0.to_string()).unwrap_or_default();
    let publish = if sharded { "SPUBLISH" } else { "PUBLISH" };
    let (record, queue) = (owner_key(lock_key), queue_key(lock_key));
    let args = [expected.as_bytes(), channel.as_bytes(), publish.as_bytes()];
    let reply: Vec<redis::Value> = EVICT
        .invoke(con, &[lock_key, &record, &queue], &args)
        .await?;
    let field = |i: usize| reply.get(i).cloned().unwrap_or(redis::Value::Nil);
    let fields: EvictFields = (
        redis::from_redis_value(field(0))?,
        redis::from_redis_value(field(1))?,
        redis::from_redis_value(field(2))?,
        redis::from_redis_value(field(3))?,
        redis::from_redis_value(field(4))?,
        redis::from_redis_value(field(5))?,
    );
    decode_evict(fields)
}

/// How many keys one `SCAN` page of [`scan_owner_records`] asks the server to look at: a page
/// costs the server well under a millisecond, and a keyspace of a million keys takes a thousand
/// pages.
pub const SCAN_COUNT: usize = 1000;

/// `SCAN cursor MATCH dlock:owner:* COUNT` [`SCAN_COUNT`]: one page of owner records, whose
/// names [`keys::lock_key_of_owner`](super::keys::lock_key_of_owner) turns into lock keys. Every
/// lock a dlock client holds has one; other data does not match.
pub fn scan_owner_records(cursor: u64) -> Cmd {
    let mut scan = redis::cmd("SCAN");
    scan.arg(cursor)
        .arg("MATCH")
        .arg(format!("{}*", super::keys::OWNER_PREFIX))
        .arg("COUNT")
        .arg(SCAN_COUNT);
    scan
}

/// What one server holds for a lock, read by [`peek`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The lock key's value (an owner token, for a dlock holder), or `None` if there is no key.
    pub holder: Option<Vec<u8>>,
    /// The lock key's remaining TTL, if it exists and has one.
    pub pttl: Option<Duration>,
    /// The fencing counter, if it exists and holds a number.
    pub counter: Option<u64>,
    /// The owner record, if there is one.
    pub recorded: Option<Recorded>,
}

/// What a lock's owner record holds (see [`keys`](super::keys#the-owner-record)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The owner token of the grant that wrote it.
    pub token: Vec<u8>,
    /// That grant's fencing token.
    pub fencing: Option<FencingToken>,
    /// Who took the lock, if the JSON parses.
    pub owner: Option<OwnerRecord>,
}

impl Recorded {
    /// The record from its hash fields; `None` without a token (no record).
    pub fn read(
        token: Option<Vec<u8>>,
        fencing: Option<Vec<u8>>,
        record: Option<Vec<u8>>,
    ) -> Option<Self> {
        Some(Recorded {
            token: token?,
            fencing: fencing
                .and_then(|f| String::from_utf8(f).ok())
                .and_then(|f| f.parse().ok())
                .map(FencingToken),
            owner: record.as_deref().and_then(OwnerRecord::parse),
        })
    }
}

impl Peek {
    /// The owner record, if it is the current holder's: its token is the lock key's value. A
    /// holder without one (a peer's `SET NX`) has `None`.
    pub fn holders_record(&self) -> Option<&Recorded> {
        let holder = self.holder.as_ref()?;
        self.recorded.as_ref().filter(|r| &r.token == holder)
    }

    /// The holder as one server shows it: its remaining TTL, and its fencing token and owner
    /// from its owner record. The token is certain: the acquire script wrote it with the grant
    /// whose owner token is still the lock key's value.
    pub fn holder_view(&self) -> Holder {
        let recorded = self.holders_record();
        let mut holder = Holder::new().with_owner(recorded.and_then(|r| r.owner.clone()));
        holder.fencing = recorded.and_then(|r| r.fencing);
        holder.expires_in = self.pttl;
        holder
    }
}

/// Reads `lock_key`'s value and remaining TTL, its counter `fence_key` and its owner record in
/// one `MULTI`, so they belong together; changes nothing.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn peek<C>(con: &mut C, lock_key: &str, fence_key: &str) -> RedisResult<Peek>
where
    C: ConnectionLike + Send,
{
    type Fields = (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>);
    let record = owner_key(lock_key);
    let (holder, pttl, counter, (token, fencing, json)): (
        Option<Vec<u8>>,
        i64,
        Option<Vec<u8>>,
        Fields,
    ) = redis::pipe()
        .atomic()
        .get(lock_key)
        .pttl(lock_key)
        .get(fence_key)
        .cmd("HMGET")
        .arg(&record)
        .arg(&["token", "fencing", "record"])
        .query_async(con)
        .await?;
    Ok(Peek {
        holder,
        pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        counter: counter
            .and_then(|c| String::from_utf8(c).ok())
            .and_then(|c| c.parse().ok()),
        recorded: Recorded::read(token, fencing, json),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_sha1_of_the_source() {
        for script in all() {
            assert_eq!(script.hash().len(), 40, "{}", script.name());
            assert_eq!(
                script.hash(),
                redis::Script::new(script.source()).get_hash()
            );
        }
        assert_ne!(ACQUIRE.hash(), RELEASE.hash());
    }

    #[test]
    fn acquire_replies_decode() {
        use redis::Value::{Array, Int};
        assert_eq!(
            decode_acquire(Int(42)).unwrap(),
            AcquireReply::Granted(FencingToken(42))
        );
        assert_eq!(
            decode_acquire(Int(1_732_291_234_000_567)).unwrap(),
            AcquireReply::Granted(FencingToken(1_732_291_234_000_567))
        );
        assert_eq!(
            decode_acquire(Array(vec![Int(1500), Int(1), Int(0), Int(-1)])).unwrap(),
            AcquireReply::Busy {
                pttl: Some(Duration::from_millis(1500)),
                head: true,
                foreign: false,
                head_lapses_in: None
            }
        );
        for no_ttl in [-1, -2] {
            assert_eq!(
                decode_acquire(Array(vec![Int(no_ttl), Int(0), Int(1), Int(7)])).unwrap(),
                AcquireReply::Busy {
                    pttl: None,
                    head: false,
                    foreign: true,
                    head_lapses_in: Some(Duration::from_millis(7))
                }
            );
        }
        assert!(decode_acquire(Int(0)).is_err());
        assert!(decode_acquire(Array(vec![Int(5)])).is_err());
    }

    #[test]
    fn extend_and_release_codes_decode() {
        assert_eq!(decode_extend(1).unwrap(), Extension::Extended);
        assert_eq!(decode_extend(0).unwrap(), Extension::Expired);
        assert_eq!(decode_extend(2).unwrap(), Extension::TakenOver);
        assert!(decode_extend(3).is_err());
        assert_eq!(decode_release(1).unwrap(), Released::Released);
        assert_eq!(decode_release(0).unwrap(), Released::Expired);
        assert_eq!(decode_release(2).unwrap(), Released::TakenOver);
        assert!(decode_release(-1).is_err());
        assert_eq!(decode_raise_fence(1).unwrap(), FenceRaise::Raised);
        assert_eq!(decode_raise_fence(0).unwrap(), FenceRaise::NotHeld);
        assert_eq!(decode_raise_fence(2).unwrap(), FenceRaise::HeldByOther);
        assert!(decode_raise_fence(7).is_err());
    }

    #[test]
    fn evict_replies_decode_with_the_holders_record_only() {
        let owner = b"0123456789abcdef0123456789abcdef".to_vec();
        let json = br#"{"host":"web-1","pid":7,"since":"2026-11-26T03:40:00Z"}"#.to_vec();
        let reply = |code, token: &[u8]| {
            (
                code,
                Some(owner.clone()),
                Some(1500),
                Some(token.to_vec()),
                Some(b"42".to_vec()),
                Some(json.clone()),
            )
        };
        let Eviction::Evicted(holder) = decode_evict(reply(1, &owner)).unwrap() else {
            panic!("not evicted");
        };
        assert_eq!(holder.fencing, Some(FencingToken(42)));
        assert_eq!(holder.owner.map(|o| o.pid), Some(7));
        assert_eq!(holder.expires_in, Some(Duration::from_millis(1500)));
        // A record of another owner token says nothing of this holder.
        let Eviction::Changed(holder) = decode_evict(reply(2, b"other")).unwrap() else {
            panic!("not changed");
        };
        assert_eq!((holder.fencing, holder.owner), (None, None));
        assert_eq!(
            decode_evict((0, None, None, None, None, None)).unwrap(),
            Eviction::Free
        );
        assert!(decode_evict((5, None, None, None, None, None)).is_err());
    }

    #[test]
    fn ttls_round_up_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(10)), 10);
        assert_eq!(ttl_millis(Duration::from_micros(10_001)), 11);
        assert_eq!(
            ttl_millis(Duration::from_secs(30 * 24 * 3600)),
            2_592_000_000
        );
    }
}
