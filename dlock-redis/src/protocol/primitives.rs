//! How the semaphore, the read-write lock and the election are stored and changed on a Redis
//! server: their keys ([`PrimitiveKeys`]) and the Lua scripts that take, extend, release and
//! inspect them. Shared with dlock-redlock, which runs the same scripts on every master.
//!
//! One name of one family (semaphore, read-write lock, election) is a *group* of holders, kept
//! in keys that all carry the same hash tag, so that every script touches one Redis Cluster slot:
//!
//! | what | name | value | expiry |
//! |---|---|---|---|
//! | holders | `dlock:<family>:holders:<T>` | sorted set: owner token → expiry (server time, ms) | the last holder's expiry |
//! | holder data | `dlock:<family>:data:<T>` | hash: `f:<owner>` fencing token, `r:<owner>` owner record JSON, `v:<owner>` an election value, `p` a semaphore's permits, `w` the writer's owner token | as the holders |
//! | fencing counter | `dlock:<family>:fence:<T>` | integer, one sequence for every holder of the group | never, or the fence TTL after the last grant |
//! | waiting writers | `dlock:rw:intents:<T>` | sorted set: owner token → expiry of the intent | the last intent's expiry |
//! | release channel | `dlock:released:` + the holders key | (pub/sub channel) | — |
//!
//! `<family>` is `sem`, `rw` or `elect`; `<T>` is the lock key with a hash tag made as for the
//! owner record ([`keys::owner_key`](super::keys::owner_key)): `{jobs/nightly}`,
//! `{t7}jobs:{t7}:nightly`, or `{<slot tag>}a}b`. The role sits before `<T>`, so that no
//! name's key can equal another name's.
//!
//! Every script first drops the holders whose expiry passed (by the server's clock, `TIME`) with
//! their data, then decides; the holders key and the data hash get the expiry of the last
//! holder, so a group whose holders all crashed vanishes by itself, and the agreed permits with
//! it.

use std::sync::LazyLock;
use std::time::Duration;

use dlock_core::backend::{Extension, Primitive};
use dlock_core::inspect::Holder;
use dlock_core::{FencingToken, OwnerRecord, Released};
use redis::aio::ConnectionLike;
use redis::RedisResult;

use super::keys::{hash_slot, hash_tag, release_channel, slot_tag};
use super::scripts::{ttl_millis, FenceRaise, LockScript, Timed};

/// The families of names: the same name in two families names two groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Semaphores.
    Semaphore,
    /// Read-write locks (readers and writers of a name share one group).
    ReadWrite,
    /// Elections.
    Election,
}

impl Family {
    /// The family of `primitive`.
    pub fn of(primitive: &Primitive) -> Family {
        match primitive {
            Primitive::Semaphore { .. } => Family::Semaphore,
            Primitive::Read | Primitive::Write => Family::ReadWrite,
            _ => Family::Election,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Family::Semaphore => "sem",
            Family::ReadWrite => "rw",
            Family::Election => "elect",
        }
    }
}

/// The Redis names of one group (see [the module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimitiveKeys {
    /// The holders, scored by expiry.
    pub holders: String,
    /// The holders' fencing tokens, records and values; the permits; the writer.
    pub data: String,
    /// The fencing counter.
    pub fence: String,
    /// Waiting writers (read-write locks only; empty for the others).
    pub intents: String,
    /// The channel releases are announced on (in the group's slot).
    pub channel: String,
}

impl PrimitiveKeys {
    /// The names of `family`'s group of the lock key `lock_key`.
    pub fn new(lock_key: &str, family: Family) -> Self {
        let tagged = tagged(lock_key);
        let name = |role: &str| format!("dlock:{}:{role}:{tagged}", family.word());
        let holders = name("holders");
        PrimitiveKeys {
            data: name("data"),
            fence: name("fence"),
            intents: name("intents"),
            channel: release_channel(&holders),
            holders,
        }
    }
}

/// `lock_key` with a hash tag in front unless it has one (see [the module docs](self)).
fn tagged(lock_key: &str) -> String {
    if let Some(tag) = hash_tag(lock_key.as_bytes()) {
        return format!("{{{}}}{lock_key}", String::from_utf8_lossy(tag));
    }
    if !lock_key.contains('}') {
        return format!("{{{lock_key}}}");
    }
    format!("{{{}}}{lock_key}", slot_tag(hash_slot(lock_key.as_bytes())))
}

/// What every script starts with: the server's time in ms, dropping expired holders, and
/// re-arming the group's expiry.
const PRELUDE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function prune(z, h, now)
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #gone == 0 then return end
  local writer = redis.call('HGET', h, 'w')
  for _, o in ipairs(gone) do
    redis.call('HDEL', h, 'f:' .. o, 'r:' .. o, 'v:' .. o)
    if writer == o then redis.call('HDEL', h, 'w') end
  end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
end
local function arm(z, h, now)
  local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if last[2] then
    local left = string.format('%d', tonumber(last[2]) - now)
    redis.call('PEXPIRE', z, left)
    redis.call('PEXPIRE', h, left)
  else
    redis.call('DEL', z, h)
  end
end
local function arm_intents(q, now)
  local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', q, string.format('%d', tonumber(last[2]) - now)) end
end
"#;

fn script(name: &'static str, body: &str) -> LockScript {
    let source: &'static str = Box::leak(format!("{PRELUDE}{body}").into_boxed_str());
    LockScript::new(name, source)
}

/// Takes a place in a group. Returns `{1, token}` when granted, `{0, pttl}` when busy (`pttl`
/// the time until the first holder or intent runs out, `-1` if none), `{2, permits}` when a
/// semaphore's live holders agreed on other permits (nothing changed).
///
/// * mode `s` (semaphore, `ARGV[5]` permits): granted while fewer than the permits hold it;
/// * mode `r` (reader): granted while no writer holds it and no writer waits;
/// * mode `w` (writer): granted while nobody holds it; when busy with `ARGV[6]` set, registers
///   the writer's intent for `ARGV[6]` ms, which makes new readers busy; a grant removes it;
/// * mode `e` (candidate, `ARGV[5]` value): granted while nobody holds it.
///
/// An owner that already holds a place (a retry after a lost reply) is granted again with a new
/// token. `KEYS`: holders, data, counter, intents. `ARGV`: mode, owner token, TTL ms, record
/// JSON, permits or value or `''`, intent TTL ms or `''`, counter expiry ms or `''`, a new
/// counter's least start in µs or `''` (as the lock's
/// [`AcquireCall::least_start`](super::scripts::AcquireCall::least_start)).
pub static ACQUIRE: LazyLock<LockScript> = LazyLock::new(|| {
    script(
        "acquire_primitive",
        r#"
local z, h, f, q = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mode, owner, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
prune(z, h, now)
redis.call('ZREMRANGEBYSCORE', q, '-inf', now)
local mine = redis.call('ZSCORE', z, owner)
local count = redis.call('ZCARD', z)
local free
if mode == 's' then
  local permits = tonumber(ARGV[5])
  local agreed = redis.call('HGET', h, 'p')
  if agreed and count > 0 and tonumber(agreed) ~= permits then
    return {2, tonumber(agreed)}
  end
  free = mine or count < permits
elseif mode == 'r' then
  local writer = redis.call('HGET', h, 'w')
  free = mine or (not writer and redis.call('ZCARD', q) == 0)
else
  free = mine or count == 0
end
if not free then
  if mode == 'w' and ARGV[6] ~= '' then
    redis.call('ZADD', q, now + tonumber(ARGV[6]), owner)
    arm_intents(q, now)
  end
  local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  if not first[2] then first = redis.call('ZRANGE', q, 0, 0, 'WITHSCORES') end
  if first[2] then return {0, tonumber(first[2]) - now} end
  return {0, -1}
end
local token = redis.call('INCR', f)
if token == 1 then
  local t = redis.call('TIME')
  token = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if ARGV[8] ~= '' then token = math.max(token, tonumber(ARGV[8])) end
  redis.call('SET', f, string.format('%d', token))
end
if ARGV[7] ~= '' then redis.call('PEXPIRE', f, ARGV[7]) end
redis.call('ZADD', z, now + ttl, owner)
redis.call('HSET', h, 'f:' .. owner, string.format('%d', token), 'r:' .. owner, ARGV[4])
if mode == 's' then redis.call('HSET', h, 'p', ARGV[5]) end
if mode == 'e' then redis.call('HSET', h, 'v:' .. owner, ARGV[5]) end
if mode == 'w' then
  redis.call('HSET', h, 'w', owner)
  redis.call('ZREM', q, owner)
end
arm(z, h, now)
return {1, token}
"#,
    )
});

/// Re-arms a holder's expiry if it still holds its place: `{1, now}`, else `{0, now}` (never
/// re-creates it), with `now` the server's clock in milliseconds, for the clock watch.
/// `KEYS`: holders, data. `ARGV`: owner token, TTL ms.
pub static EXTEND: LazyLock<LockScript> = LazyLock::new(|| {
    script(
        "extend_primitive",
        r#"
local z, h = KEYS[1], KEYS[2]
local now = now_ms()
prune(z, h, now)
if not redis.call('ZSCORE', z, ARGV[1]) then return {0, now} end
redis.call('ZADD', z, 'XX', now + tonumber(ARGV[2]), ARGV[1])
arm(z, h, now)
return {1, now}
"#,
    )
});

/// Gives a place back: removes the holder and its data, and the owner's writer intent; then
/// announces it on the channel (`ARGV[3]` `PUBLISH` or `SPUBLISH`, best effort) if anything was
/// removed. With `ARGV[4]` set (a waiting Redlock writer giving back a minority's grants) the
/// intent is kept — registered for `ARGV[4]` ms — instead of removed. Returns `1` if the owner
/// held a place, else `0`.
///
/// `KEYS`: holders, data, intents. `ARGV`: owner token, channel or `''`, publish command, intent
/// TTL ms or `''`.
pub static RELEASE: LazyLock<LockScript> = LazyLock::new(|| {
    script(
        "release_primitive",
        r#"
local z, h, q, owner = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local now = now_ms()
prune(z, h, now)
local withdrew = 0
if ARGV[4] ~= '' then
  redis.call('ZADD', q, now + tonumber(ARGV[4]), owner)
  arm_intents(q, now)
else
  withdrew = redis.call('ZREM', q, owner)
end
local removed = redis.call('ZREM', z, owner)
if removed == 1 then
  redis.call('HDEL', h, 'f:' .. owner, 'r:' .. owner, 'v:' .. owner)
  if redis.call('HGET', h, 'w') == owner then redis.call('HDEL', h, 'w') end
  arm(z, h, now)
end
if (removed == 1 or withdrew == 1) and ARGV[2] ~= '' then redis.pcall(ARGV[3], ARGV[2], '') end
return removed
"#,
    )
});

/// Looks at a group without changing it: `{0}` if nobody holds a place, else `{count, fencing,
/// pttl, record, value, writer, owner}` of the earliest holder (the smallest fencing token),
/// `writer` being `1` for a writer. `KEYS`: holders, data.
pub static PEEK: LazyLock<LockScript> = LazyLock::new(|| {
    script(
        "peek_primitive",
        r#"
local z, h = KEYS[1], KEYS[2]
local now = now_ms()
local live = redis.call('ZRANGEBYSCORE', z, '(' .. now, '+inf', 'WITHSCORES')
if #live == 0 then return {0} end
local best, best_token, best_expiry
for i = 1, #live, 2 do
  local token = tonumber(redis.call('HGET', h, 'f:' .. live[i]) or '0')
  if not best or token < best_token then
    best, best_token, best_expiry = live[i], token, tonumber(live[i + 1])
  end
end
local writer = 0
if redis.call('HGET', h, 'w') == best then writer = 1 end
return {#live / 2, redis.call('HGET', h, 'f:' .. best), best_expiry - now,
  redis.call('HGET', h, 'r:' .. best), redis.call('HGET', h, 'v:' .. best), writer, best}
"#,
    )
});

/// Raises the group's counter to at least `ARGV[2]` if the owner `ARGV[1]` holds a place, and
/// makes that its recorded token (Redlock's write-back, as the lock's `RAISE_FENCE`). Returns
/// `1` if it holds a place, else `0`. `KEYS`: holders, data, counter. `ARGV`: owner token,
/// token, counter expiry ms or `''`.
pub static RAISE_FENCE: LazyLock<LockScript> = LazyLock::new(|| {
    script(
        "raise_fence_primitive",
        r#"
local z, h, f = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
prune(z, h, now)
if not redis.call('ZSCORE', z, ARGV[1]) then return 0 end
local current = tonumber(redis.call('GET', f) or '0')
if current < tonumber(ARGV[2]) then
  redis.call('SET', f, ARGV[2])
  if ARGV[3] ~= '' then redis.call('PEXPIRE', f, ARGV[3]) end
end
redis.call('HSET', h, 'f:' .. ARGV[1], ARGV[2])
return 1
"#,
    )
});

/// What one request asks of a group.
#[derive(Debug, Clone, Copy)]
pub enum Mode<'a> {
    /// A semaphore permit, with the permits the caller agreed on.
    Semaphore(u32),
    /// A read hold.
    Read,
    /// A write hold; with `Some(ttl)` a busy answer registers the writer's intent for `ttl`.
    Write(Option<Duration>),
    /// Leadership, publishing the value.
    Election(&'a str),
}

/// The answer of [`ACQUIRE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrimitiveReply {
    /// Granted, with this fencing token.
    Granted(FencingToken),
    /// Busy; the first holder or waiting writer runs out after `pttl`, if known.
    Busy {
        /// Time until the first holder (or intent) runs out.
        pttl: Option<Duration>,
    },
    /// The semaphore's live holders agreed on these permits.
    Mismatch(u32),
}

/// Runs [`ACQUIRE`] (see there); `least_start` as the lock's
/// [`AcquireCall::least_start`](super::scripts::AcquireCall::least_start).
///
/// # Cancel safety
/// If dropped, the place may or may not have been taken; release by owner token to be sure.
#[allow(clippy::too_many_arguments)]
pub async fn acquire<C>(
    con: &mut C,
    keys: &PrimitiveKeys,
    mode: Mode<'_>,
    owner: &str,
    record: &str,
    ttl: Duration,
    fence_ttl: Option<Duration>,
    least_start: Option<u64>,
) -> RedisResult<PrimitiveReply>
where
    C: ConnectionLike + Send,
{
    let (word, extra, intent) = match mode {
        Mode::Semaphore(permits) => ("s", permits.to_string(), None),
        Mode::Read => ("r", String::new(), None),
        Mode::Write(intent) => ("w", String::new(), intent),
        Mode::Election(value) => ("e", value.to_string(), None),
    };
    let ttl = ttl_millis(ttl).to_string();
    let intent = intent
        .map(|t| ttl_millis(t).to_string())
        .unwrap_or_default();
    let fence_ttl = fence_ttl
        .map(|t| ttl_millis(t).to_string())
        .unwrap_or_default();
    let least_start = least_start.map(|s| s.to_string()).unwrap_or_default();
    let args: [&[u8]; 8] = [
        word.as_bytes(),
        owner.as_bytes(),
        ttl.as_bytes(),
        record.as_bytes(),
        extra.as_bytes(),
        intent.as_bytes(),
        fence_ttl.as_bytes(),
        least_start.as_bytes(),
    ];
    let names = [
        keys.holders.as_str(),
        &keys.data,
        &keys.fence,
        &keys.intents,
    ];
    let (code, number): (i64, i64) = ACQUIRE.invoke(con, &names, &args).await?;
    Ok(match code {
        1 => PrimitiveReply::Granted(FencingToken(number.unsigned_abs())),
        2 => PrimitiveReply::Mismatch(u32::try_from(number).unwrap_or(u32::MAX)),
        _ => PrimitiveReply::Busy {
            pttl: u64::try_from(number).ok().map(Duration::from_millis),
        },
    })
}

/// Runs [`EXTEND`]: `Extended`, or `Expired` if the owner holds no place (any more).
///
/// # Cancel safety
/// If dropped, the expiry may or may not have been re-armed.
pub async fn extend<C>(
    con: &mut C,
    keys: &PrimitiveKeys,
    owner: &str,
    ttl: Duration,
) -> RedisResult<Timed<Extension>>
where
    C: ConnectionLike + Send,
{
    let ttl = ttl_millis(ttl).to_string();
    let sent = tokio::time::Instant::now();
    let (code, now_ms): (i64, i64) = EXTEND
        .invoke(
            con,
            &[&keys.holders, &keys.data],
            &[owner.as_bytes(), ttl.as_bytes()],
        )
        .await?;
    let answer = if code == 1 {
        Extension::Extended
    } else {
        Extension::Expired
    };
    Ok(Timed::new(answer, sent, now_ms.saturating_mul(1000)))
}

/// Runs [`RELEASE`], announcing on the group's channel with `publish` (`PUBLISH`, `SPUBLISH`, or
/// `""` for no announcement); `keep_intent` keeps a waiting writer's intent for that long.
///
/// # Cancel safety
/// If dropped, the release may or may not have happened; repeating it is harmless.
pub async fn release<C>(
    con: &mut C,
    keys: &PrimitiveKeys,
    owner: &str,
    publish: &str,
    keep_intent: Option<Duration>,
) -> RedisResult<Released>
where
    C: ConnectionLike + Send,
{
    let channel = if publish.is_empty() {
        ""
    } else {
        keys.channel.as_str()
    };
    let keep = keep_intent
        .map(|t| ttl_millis(t).to_string())
        .unwrap_or_default();
    let code: i64 = RELEASE
        .invoke(
            con,
            &[&keys.holders, &keys.data, &keys.intents],
            &[
                owner.as_bytes(),
                channel.as_bytes(),
                publish.as_bytes(),
                keep.as_bytes(),
            ],
        )
        .await?;
    Ok(if code == 1 {
        Released::Released
    } else {
        Released::Expired
    })
}

/// The earliest holder of a group, as [`peek`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    /// How many hold a place.
    pub count: usize,
    /// The earliest holder's owner token.
    pub owner: Vec<u8>,
    /// Its fencing token.
    pub fencing: Option<FencingToken>,
    /// Its remaining time.
    pub pttl: Duration,
    /// Its owner record.
    pub record: Option<OwnerRecord>,
    /// Its value (an election's leader).
    pub value: Option<String>,
    /// Whether it is a writer.
    pub writer: bool,
}

impl GroupView {
    /// The holder as `inspect` reports it: with the count of holders where they share the name.
    pub fn holder(&self, family: Family) -> Holder {
        let mut holder = Holder::new()
            .with_expiry(self.pttl)
            .with_owner(self.record.clone())
            .with_value(self.value.clone());
        holder.fencing = self.fencing;
        let shared = match family {
            Family::Semaphore => true,
            Family::ReadWrite => !self.writer,
            Family::Election => false,
        };
        if shared {
            holder.with_holders(self.count)
        } else {
            holder
        }
    }
}

/// Runs [`PEEK`]: the earliest holder, or `None`.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn peek<C>(con: &mut C, keys: &PrimitiveKeys) -> RedisResult<Option<GroupView>>
where
    C: ConnectionLike + Send,
{
    let reply: Vec<redis::Value> = PEEK.invoke(con, &[&keys.holders, &keys.data], &[]).await?;
    let field = |i: usize| reply.get(i).cloned().unwrap_or(redis::Value::Nil);
    let count: i64 = redis::from_redis_value(field(0))?;
    if count <= 0 {
        return Ok(None);
    }
    let text = |v: Option<Vec<u8>>| v.and_then(|v| String::from_utf8(v).ok());
    let fencing: Option<Vec<u8>> = redis::from_redis_value(field(1))?;
    let pttl: i64 = redis::from_redis_value(field(2))?;
    let record: Option<Vec<u8>> = redis::from_redis_value(field(3))?;
    let value: Option<Vec<u8>> = redis::from_redis_value(field(4))?;
    let writer: i64 = redis::from_redis_value(field(5))?;
    let owner: Vec<u8> = redis::from_redis_value(field(6))?;
    Ok(Some(GroupView {
        count: usize::try_from(count).unwrap_or(0),
        owner,
        fencing: text(fencing).and_then(|f| f.parse().ok()).map(FencingToken),
        pttl: Duration::from_millis(u64::try_from(pttl).unwrap_or(0)),
        record: record.as_deref().and_then(OwnerRecord::parse),
        value: text(value),
        writer: writer == 1,
    }))
}

/// Runs [`RAISE_FENCE`]: `Raised` if the owner holds a place, else `NotHeld`.
///
/// # Cancel safety
/// If dropped, the counter may or may not have been raised; repeating it is harmless.
pub async fn raise_fence<C>(
    con: &mut C,
    keys: &PrimitiveKeys,
    owner: &str,
    token: FencingToken,
    fence_ttl: Option<Duration>,
) -> RedisResult<FenceRaise>
where
    C: ConnectionLike + Send,
{
    let token = token.0.to_string();
    let fence_ttl = fence_ttl
        .map(|t| ttl_millis(t).to_string())
        .unwrap_or_default();
    let code: i64 = RAISE_FENCE
        .invoke(
            con,
            &[&keys.holders, &keys.data, &keys.fence],
            &[owner.as_bytes(), token.as_bytes(), fence_ttl.as_bytes()],
        )
        .await?;
    Ok(if code == 1 {
        FenceRaise::Raised
    } else {
        FenceRaise::NotHeld
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_keys_share_one_slot_and_differ_per_family() {
        for name in ["jobs/nightly", "{t7}:job", "a}b", "x{}y", "{", "ключ"] {
            let sem = PrimitiveKeys::new(name, Family::Semaphore);
            let slot = hash_slot(sem.holders.as_bytes());
            for key in [&sem.data, &sem.fence, &sem.intents, &sem.channel] {
                assert_eq!(hash_slot(key.as_bytes()), slot, "{name}: {key}");
            }
            let rw = PrimitiveKeys::new(name, Family::ReadWrite);
            assert_ne!(sem.holders, rw.holders);
            assert_ne!(sem.fence, rw.fence);
        }
        let keys = PrimitiveKeys::new("jobs/nightly", Family::Semaphore);
        assert_eq!(keys.holders, "dlock:sem:holders:{jobs/nightly}");
        assert_eq!(
            keys.channel,
            "dlock:released:dlock:sem:holders:{jobs/nightly}"
        );
        assert_eq!(
            PrimitiveKeys::new("jobs:{t7}:nightly", Family::ReadWrite).fence,
            "dlock:rw:fence:{t7}jobs:{t7}:nightly"
        );
    }

    #[test]
    fn scripts_are_named_and_hashed() {
        for script in [&*ACQUIRE, &*EXTEND, &*RELEASE, &*PEEK, &*RAISE_FENCE] {
            assert_eq!(
                script.hash(),
                redis::Script::new(script.source()).get_hash()
            );
            assert!(script.name().ends_with("_primitive"));
        }
    }
}
