//! The one table of backends: per backend, the servers it runs on, how a dlock URL for them is
//! formed, what it declares about itself and what it expects in each safety scenario.
//!
//! The compliance binaries, the safety report, the benchmark and the image check read this table
//! instead of keeping lists of their own, so adding a backend is one more crate and one more
//! entry in [`BACKENDS`]. A backend that runs on a kind of deployment the table does not know yet
//! also needs a [`Fixture`] variant (and the safety report a target for it).
//!
//! The test kit cannot depend on the backend crates (they depend on it for their tests), so an
//! entry holds data, a fixture to start and a URL builder; each consumer connects through the URL
//! (the facade's `dlock::connect`, or the backend's own from-URL builder).

use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::fixtures::{
    images, EtcdCluster, EtcdOptions, Member, PostgresServer, RedisMasters, RedisServer, Result,
    ZkEnsemble, ZkOptions,
};
use crate::scenario::{
    Class::{self, *},
    Declared, Scenario,
};

/// A server image the fixtures run; `scripts/test-images` builds one look-alike of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Image {
    /// Redis (single servers, Redlock masters, primary and replica).
    Redis,
    /// etcd.
    Etcd,
    /// ZooKeeper.
    ZooKeeper,
    /// PostgreSQL.
    Postgres,
}

impl Image {
    /// Every image, in the order `scripts/test-images` prints them.
    pub const ALL: [Image; 4] = [Image::Redis, Image::Etcd, Image::ZooKeeper, Image::Postgres];

    /// The image's name in `scripts/test-images` (`dlock-test/NAME:TAG`).
    pub fn name(self) -> &'static str {
        match self {
            Image::Redis => "redis",
            Image::Etcd => "etcd",
            Image::ZooKeeper => "zookeeper",
            Image::Postgres => "postgres",
        }
    }

    /// The variable that names the image to run (see [`mod@images`]).
    pub fn env(self) -> &'static str {
        match self {
            Image::Redis => images::REDIS_IMAGE_ENV,
            Image::Etcd => images::ETCD_IMAGE_ENV,
            Image::ZooKeeper => images::ZOOKEEPER_IMAGE_ENV,
            Image::Postgres => images::POSTGRES_IMAGE_ENV,
        }
    }
}

/// The kind of deployment a backend runs on, and so which fixture starts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fixture {
    /// No server: the lock table lives in the process.
    InProcess,
    /// One Redis server ([`RedisServer`]).
    RedisServer,
    /// Independent Redis masters ([`RedisMasters`]).
    RedisMasters,
    /// A ZooKeeper ensemble ([`ZkEnsemble`]), with a 500 ms tick so sessions of 1 s are allowed.
    ZkEnsemble,
    /// An etcd cluster ([`EtcdCluster`]).
    EtcdCluster,
    /// One PostgreSQL server ([`PostgresServer`]).
    PostgresServer,
}

impl Fixture {
    /// The images the fixture runs.
    pub fn images(self) -> &'static [Image] {
        match self {
            Fixture::InProcess => &[],
            Fixture::RedisServer | Fixture::RedisMasters => &[Image::Redis],
            Fixture::ZkEnsemble => &[Image::ZooKeeper],
            Fixture::EtcdCluster => &[Image::Etcd],
            Fixture::PostgresServer => &[Image::Postgres],
        }
    }

    /// Whether starting it needs Docker (no server given in a `DLOCK_TEST_*_URL` variable).
    pub fn needs_docker(self) -> bool {
        match self {
            Fixture::InProcess => false,
            Fixture::RedisServer => RedisServer::needs_docker(),
            Fixture::RedisMasters => RedisMasters::needs_docker(),
            Fixture::ZkEnsemble => ZkEnsemble::needs_docker(),
            Fixture::EtcdCluster => EtcdCluster::needs_docker(),
            Fixture::PostgresServer => PostgresServer::needs_docker(),
        }
    }

    /// Starts the deployment with `members` servers (ignored for one Redis or PostgreSQL server
    /// and in-process).
    pub async fn start(self, members: usize) -> Result<Deployment> {
        Ok(match self {
            Fixture::InProcess => Deployment::InProcess,
            Fixture::RedisServer => Deployment::RedisServer(RedisServer::start().await?),
            Fixture::RedisMasters => Deployment::RedisMasters(RedisMasters::start(members).await?),
            Fixture::ZkEnsemble => Deployment::ZkEnsemble(
                ZkEnsemble::start_with(members, ZkOptions::default().with_tick_time(ZK_TICK))
                    .await?,
            ),
            Fixture::EtcdCluster => Deployment::EtcdCluster(
                EtcdCluster::start_with(members, EtcdOptions::default()).await?,
            ),
            Fixture::PostgresServer => Deployment::PostgresServer(PostgresServer::start().await?),
        })
    }
}

/// Whether a TCP connection to `address` (`host:port`) opens within a second.
async fn reachable(address: &str) -> bool {
    let connect = tokio::net::TcpStream::connect(address);
    matches!(
        tokio::time::timeout(Duration::from_secs(1), connect).await,
        Ok(Ok(_))
    )
}

/// `text` with each occurrence of the address `from` (`host:port`) replaced by `to`, where the
/// port is not the start of a longer one.
fn replace_address(text: &str, from: &str, to: &str) -> String {
    if from.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(from) {
        let after = &rest[at + from.len()..];
        out.push_str(&rest[..at]);
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            out.push_str(from);
        } else {
            out.push_str(to);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The ZooKeeper tick of [`Fixture::ZkEnsemble`]: sessions may be as short as two ticks.
pub const ZK_TICK: Duration = Duration::from_millis(500);

/// A running deployment, as [`Fixture::start`] started it.
#[derive(Debug)]
pub enum Deployment {
    /// Nothing runs.
    InProcess,
    /// One Redis server.
    RedisServer(RedisServer),
    /// Independent Redis masters.
    RedisMasters(RedisMasters),
    /// A ZooKeeper ensemble.
    ZkEnsemble(ZkEnsemble),
    /// An etcd cluster.
    EtcdCluster(EtcdCluster),
    /// One PostgreSQL server.
    PostgresServer(PostgresServer),
}

impl Deployment {
    /// The servers' addresses, in member order, as the fixture gives them (`redis://host:port`,
    /// `http://host:port`, `host:port`, or PostgreSQL's URL with its user and password:
    /// [`PostgresServer::url`]); none in-process.
    pub fn endpoints(&self) -> Vec<String> {
        match self {
            Deployment::InProcess => Vec::new(),
            Deployment::RedisServer(server) => vec![server.url()],
            Deployment::RedisMasters(masters) => masters.urls(),
            Deployment::ZkEnsemble(ensemble) => ensemble.endpoints(),
            Deployment::EtcdCluster(cluster) => cluster.endpoints(),
            Deployment::PostgresServer(server) => vec![server.url()],
        }
    }

    /// [`Deployment::endpoints`] with each member's loopback address replaced by its address on
    /// the fixture's own network ([`Member::network_endpoint`]), for clients that must not go
    /// through Docker's port proxy: the benchmark, where the proxy would be what is measured.
    ///
    /// A member whose network address the host cannot reach (no TCP connection within a second:
    /// Docker Desktop, rootless Docker, a remote engine) keeps its loopback address, and so do
    /// external servers.
    pub async fn network_endpoints(&self) -> Result<Vec<String>> {
        let mut endpoints = self.endpoints();
        let Ok(members) = self.members() else {
            return Ok(endpoints);
        };
        for member in members {
            let (loopback, network) = (member.endpoint(), member.network_endpoint().await?);
            if !reachable(&network).await {
                continue;
            }
            for endpoint in &mut endpoints {
                *endpoint = replace_address(endpoint, &loopback, &network);
            }
        }
        Ok(endpoints)
    }

    /// Where the servers run, as a report states it.
    pub fn whereabouts(&self) -> &'static str {
        match self.members() {
            Ok([]) => "in process",
            Ok(members) if members.iter().all(Member::on_host_network) => {
                "containers on the host's network"
            }
            Ok(_) => "containers on Docker bridge networks",
            Err(_) => "servers given by URL",
        }
    }

    /// The members' containers; an error for external servers, and none in-process.
    pub fn members(&self) -> Result<&[Member]> {
        match self {
            Deployment::InProcess => Ok(&[]),
            Deployment::RedisServer(server) => server.member().map(std::slice::from_ref),
            Deployment::RedisMasters(masters) => masters.members(),
            Deployment::ZkEnsemble(ensemble) => ensemble.members(),
            Deployment::EtcdCluster(cluster) => cluster.members(),
            Deployment::PostgresServer(server) => server.member().map(std::slice::from_ref),
        }
    }

    /// The index of the consensus leader; an error where there is none to ask.
    pub async fn leader(&self) -> Result<usize> {
        match self {
            Deployment::ZkEnsemble(ensemble) => ensemble.leader().await,
            Deployment::EtcdCluster(cluster) => cluster.leader().await,
            _ => Err(crate::fixtures::FixtureError::Config(
                "only ZooKeeper and etcd elect a leader".into(),
            )),
        }
    }

    /// Waits until every member serves again, as after a partition heals; at once for
    /// deployments without a quorum to wait for.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        match self {
            Deployment::ZkEnsemble(ensemble) => ensemble.wait_ready(timeout).await,
            Deployment::EtcdCluster(cluster) => cluster.wait_ready(timeout).await,
            _ => Ok(()),
        }
    }

    /// Removes the containers and reports failures (dropping the deployment also removes them).
    pub async fn shutdown(self) -> Result<()> {
        match self {
            Deployment::InProcess => Ok(()),
            Deployment::RedisServer(server) => server.shutdown().await,
            Deployment::RedisMasters(masters) => masters.shutdown().await,
            Deployment::ZkEnsemble(ensemble) => ensemble.shutdown().await,
            Deployment::EtcdCluster(cluster) => cluster.shutdown().await,
            Deployment::PostgresServer(server) => server.shutdown().await,
        }
    }
}

/// What an entry is, and so which harnesses run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A dlock backend crate: the compliance suite, the safety report and the benchmark run it.
    Backend,
    /// Another configuration of the backend named here: a row of the safety report only.
    Variant(&'static str),
    /// A deliberately broken client the safety report runs to show its checker catches it.
    Baseline,
}

/// A declared safety line: the class the backend expects in one scenario, and why.
type Line = (Class, &'static str);

/// One backend (or safety-report row) and everything the harnesses need to know about it.
#[derive(Debug)]
pub struct Backend {
    /// The name in flags (`--only`), progress lines and JSON: `redis`, `zk`, …
    pub name: &'static str,
    /// The name shown in tables.
    pub title: &'static str,
    /// What the entry is.
    pub role: Role,
    /// The URL scheme of its clients (`dlock::connect`'s table).
    pub scheme: &'static str,
    /// The deployment it runs on.
    pub fixture: Fixture,
    /// Per scenario, in [`Scenario::ALL`] order: the class it expects and the documented
    /// guarantee the expectation rests on. A cell whose observation differs fails the safety
    /// report; change a line only when the guarantee changes, and say why in the reason.
    pub safety: &'static [Line],
}

impl Backend {
    /// The line it declares for `scenario` (not run, with a note, if the table has no such line:
    /// the registry's test keeps that from landing).
    pub fn declared(&self, scenario: Scenario) -> Declared {
        match self.safety.get(usize::from(scenario.number()) - 1) {
            Some(&(class, reason)) => Declared { class, reason },
            None => Declared {
                class: NotRun,
                reason: "the registry has no line for this scenario",
            },
        }
    }

    /// A dlock URL for the servers at `endpoints` (as [`Deployment::endpoints`] gives them; any
    /// scheme and path of theirs are dropped) with the query `params` (`key=value&…`, or empty).
    pub fn url(&self, endpoints: &[String], params: &str) -> String {
        let hosts: Vec<&str> = endpoints
            .iter()
            .map(|e| {
                let bare = e.split_once("://").map_or(e.as_str(), |(_, rest)| rest);
                bare.split('/').next().unwrap_or(bare)
            })
            .collect();
        let query = if params.is_empty() {
            String::new()
        } else {
            format!("?{params}")
        };
        format!("{}://{}{query}", self.scheme, hosts.join(","))
    }
}

/// Entries are equal when their names are: names are unique (the registry's test checks).
impl PartialEq for Backend {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Backend {}

/// Serialized as its name, which reports and filters use.
impl Serialize for Backend {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name)
    }
}

/// The entry named `name`.
pub fn backend(name: &str) -> Option<&'static Backend> {
    BACKENDS.iter().find(|b| b.name == name)
}

/// The dlock backend crates, in table order (the entries with [`Role::Backend`]).
pub fn dlock_backends() -> impl Iterator<Item = &'static Backend> {
    BACKENDS.iter().filter(|b| b.role == Role::Backend)
}

/// The images some entry's fixture runs, each once, in [`Image::ALL`] order.
pub fn images() -> Vec<Image> {
    Image::ALL
        .into_iter()
        .filter(|image| BACKENDS.iter().any(|b| b.fixture.images().contains(image)))
        .collect()
}

/// Every entry, in the safety matrix's column order.
pub const BACKENDS: &[Backend] = &[
    Backend {
        name: "memory",
        title: "in-process",
        role: Role::Backend,
        scheme: "memory",
        fixture: Fixture::InProcess,
        safety: &[
            (Safe, "one table behind a mutex"),
            (CaughtByFencing, "the lease expires in-process; the token counter only grows"),
            (CaughtByFencing, "the next holder gets a larger token; the late write is refused"),
            (Safe, "dlock-core never hands out a lease whose validity is over"),
            (NotApplicable, "a crash ends the process, which holds the lock table too"),
            (NotApplicable, "in-process: there is no link to cut"),
            (NotApplicable, "in-process: there is no service to partition"),
            (NotApplicable, "in-process: there is no server to restart"),
            (NotApplicable, "in-process: the lock table and its clients share one clock"),
            (NotApplicable, "in-process: nothing is replicated"),
            (Safe, "release and extend compare the owner token"),
        ],
    },
    // Per-key counter; fencing "monotonic while the server keeps its data".
    Backend {
        name: "redis",
        title: "Redis",
        role: Role::Backend,
        scheme: "redis",
        fixture: Fixture::RedisServer,
        safety: &[
            (Safe, "SET NX PX and the counter INCR run in one script"),
            (CaughtByFencing, "the key expires after the TTL; the counter gives the next holder a larger token"),
            (CaughtByFencing, "the next holder's token is larger; the late write is refused"),
            (Safe, "dlock-core never hands out a lease whose validity is over"),
            (Safe, "an abandoned key expires after its TTL"),
            (Safe, "the client-side validity ends a drift allowance before the server's TTL"),
            (NotApplicable, "one server: a cut between client and server is scenario 6"),
            (CaughtByFencing, "a lost counter restarts from the server clock in µs, above earlier tokens (crate docs)"),
            (CaughtByFencing, "the server's clock jumps past the TTL and drops the key early; the next holder's token is larger, and the holder's clock watch warns at its next renewal"),
            (NotCaught, "replication is asynchronous: lock and counter can go back, tokens repeat (crate docs)"),
            (Safe, "release and extend are ownership-checked scripts"),
        ],
    },
    // The same client as the Redis row with `min_replicas = 1`: each grant waits for the replica.
    Backend {
        name: "redis-wait",
        title: "Redis, WAIT for 1 replica",
        role: Role::Variant("redis"),
        scheme: "redis",
        fixture: Fixture::RedisServer,
        safety: &[
            (NotApplicable, SAME_AS_REDIS),
            (NotApplicable, SAME_AS_REDIS),
            (NotApplicable, SAME_AS_REDIS),
            (NotApplicable, SAME_AS_REDIS),
            (NotApplicable, SAME_AS_REDIS),
            (NotApplicable, SAME_AS_REDIS),
            (NotApplicable, SAME_AS_REDIS),
            (NotApplicable, SAME_AS_REDIS),
            (NotApplicable, SAME_AS_REDIS),
            (Unavailable, "the cut-off replica never acknowledges the holder's grant, so it is taken back and refused, and the promoted replica has no replica to acknowledge the successor's: no overlap, no hand-over. WAIT narrows, not closes, the window: with several replicas, promoting one that did not acknowledge still loses the grant"),
            (NotApplicable, SAME_AS_REDIS),
        ],
    },
    // Ephemeral sequential nodes, czxid tokens, leases that follow the session.
    Backend {
        name: "zk",
        title: "ZooKeeper",
        role: Role::Backend,
        scheme: "zk",
        fixture: Fixture::ZkEnsemble,
        safety: &[
            (Safe, "the lowest sequence node holds the lock"),
            (CaughtByFencing, "the session expires while paused; czxids only grow"),
            (CaughtByFencing, "the client-side TTL deletes the node; the next czxid is larger"),
            (Safe, "dlock-core never hands out a lease whose validity is over"),
            (Safe, "the ephemeral node goes when the session expires"),
            (Safe, "the lease is uncertain, then lost, before the session can expire on the server"),
            (Safe, "the cut-off member's session expires on the quorum side; the client's session bound ends first"),
            (NotApplicable, "the ensemble logs every write before acknowledging; there is no cache-only mode"),
            (NotApplicable, "no wall clock expires the lock: the leader times sessions by elapsed time"),
            (NotApplicable, "replication is by consensus; no asynchronous replica is promoted"),
            (Safe, "release and extend check the own node in the own session"),
        ],
    },
    // A session lease per client, create-revision tokens, client-enforced TTL.
    Backend {
        name: "etcd",
        title: "etcd",
        role: Role::Backend,
        scheme: "etcd",
        fixture: Fixture::EtcdCluster,
        safety: &[
            (Safe, "the oldest contender key holds the lock"),
            (CaughtByFencing, "the session lease expires while paused; revisions only grow"),
            (CaughtByFencing, "the client-side TTL deletes the key; the next revision is larger"),
            (Safe, "dlock-core never hands out a lease whose validity is over"),
            (Safe, "the contender key goes when the session lease expires"),
            (Safe, "the lease is uncertain, then lost at the session's confirmed end"),
            (Safe, "the cut-off member cannot keep the lease alive; the client's confirmed end passes first"),
            (NotApplicable, "etcd persists every write through Raft before acknowledging"),
            (NotApplicable, "no wall clock expires the lock: the leader times leases by elapsed time"),
            (NotApplicable, "replication is by consensus; no asynchronous replica is promoted"),
            (Safe, "release and extend are transactions comparing revision and lease"),
        ],
    },
    // Session-level advisory locks on one dedicated session per client, tokens from a sequence.
    Backend {
        name: "postgres",
        title: "PostgreSQL",
        role: Role::Backend,
        scheme: "postgres",
        fixture: Fixture::PostgresServer,
        safety: &[
            (Safe, "one session holds a key's advisory lock; the granting statement takes the token"),
            (CaughtByFencing, "the server ends the paused holder's idle session, freeing its locks; nextval only grows"),
            (CaughtByFencing, "the lease ends at its TTL and is unlocked; the next holder's nextval is larger"),
            (Safe, "dlock-core never hands out a lease whose validity is over"),
            (Safe, "the silent holder's session is ended by idle_session_timeout, which frees its locks (a process that exits closes its connection, which frees them at once)"),
            (Safe, "the lease is uncertain, then lost, before idle_session_timeout ends the session on the server"),
            (NotApplicable, "one server: a cut between client and server is scenario 6"),
            (NotApplicable, "the server logs every commit before acknowledging; a restart ends every session (locks freed, holders lost) and the sequence survives"),
            (NotApplicable, "no wall clock expires the lock: it lives as long as its session"),
            (NotApplicable, "the fixture runs one server; a failover to a replica loses held locks (dlock-postgres/README.md)"),
            (Safe, "unlock and extend run on the holder's own session and touch only its locks"),
        ],
    },
    // Five masters, tokens the maximum over a quorum written back, no delayed restart (the
    // matrix's servers start fresh; see scenario 8's reason).
    Backend {
        name: "redlock",
        title: "Redlock",
        role: Role::Backend,
        scheme: "redlock",
        fixture: Fixture::RedisMasters,
        safety: &[
            (Safe, "a quorum of SET NX PX grants within the validity"),
            (CaughtByFencing, "keys expire after the TTL; the intersecting master gives the next holder a larger token"),
            (CaughtByFencing, "the next holder's token is larger; the late write is refused"),
            (Safe, "the client checks the validity left after the quorum, and so does dlock-core"),
            (Safe, "abandoned keys expire after the TTL on every master"),
            (Safe, "renewals need a quorum; the client-side validity ends before the masters' TTL"),
            (Safe, "a holder left with a minority cannot renew and loses the lease before the majority's keys expire"),
            (CaughtByFencing, "without delayed restart a master restarted empty breaks exclusion; its counter restarts from its clock in µs, above earlier tokens (crate docs)"),
            (CaughtByFencing, "a master whose clock jumps ahead expires the key early and breaks exclusion (the clock assumption); the intersecting master still gives a larger token, and the holder's clock watch warns at its next renewal"),
            (NotApplicable, "independent masters: no replica is promoted"),
            (Safe, "release and extend are ownership-checked on every master"),
        ],
    },
    // The same client as the Redlock row, with `delayed_restart` set: only restarts differ.
    Backend {
        name: "redlock-delayed",
        title: "Redlock, delayed restart",
        role: Role::Variant("redlock"),
        scheme: "redlock",
        fixture: Fixture::RedisMasters,
        safety: &[
            (NotApplicable, SAME_AS_REDLOCK),
            (NotApplicable, SAME_AS_REDLOCK),
            (NotApplicable, SAME_AS_REDLOCK),
            (NotApplicable, SAME_AS_REDLOCK),
            (NotApplicable, SAME_AS_REDLOCK),
            (NotApplicable, SAME_AS_REDLOCK),
            (NotApplicable, SAME_AS_REDLOCK),
            (Unavailable, "the restarted master does not vote for the longest TTL; the other masters cannot make a quorum without the holder's"),
            (NotApplicable, SAME_AS_REDLOCK),
            (NotApplicable, SAME_AS_REDLOCK),
            (NotApplicable, SAME_AS_REDLOCK),
        ],
    },
    // The legacy scheme: the value is an expiry timestamp, no owner, no token.
    Backend {
        name: "legacy-getset",
        title: "baseline: SETNX/GETSET",
        role: Role::Baseline,
        scheme: "redis",
        fixture: Fixture::RedisServer,
        safety: &baseline(
            "an expired timestamp is taken over with GETSET",
            "dlock-core's client-side validity ends before the timestamp",
        ),
    },
    // SETNX then EXPIRE in two round trips, DEL to release, no token.
    Backend {
        name: "naive-expire",
        title: "baseline: SETNX+EXPIRE",
        role: Role::Baseline,
        scheme: "redis",
        fixture: Fixture::RedisServer,
        safety: &baseline(
            "the crash comes after EXPIRE here, so the key still expires",
            "dlock-core's client-side validity ends before the key's expiry",
        ),
    },
];

/// The same reason for every line of the Redis `WAIT` variant but the failover.
const SAME_AS_REDIS: &str =
    "the same client as the Redis row; only the failover to a replica differs";

/// The same reason for every line of the Redlock variant but the restart.
const SAME_AS_REDLOCK: &str = "the same client as the Redlock row; only restarts differ";

/// The baselines' lines: without a token and with a plain `DEL`, they differ only in how an
/// abandoned lock frees (`crash`) and when the client's validity ends (`cut_off`).
const fn baseline(crash: &'static str, cut_off: &'static str) -> [Line; 11] {
    [
        (Safe, "SETNX excludes while nothing fails"),
        (
            NotCaught,
            "no fencing token: every holder presents the same one",
        ),
        (
            NotCaught,
            "no fencing token: the late write is admitted over the successor's",
        ),
        (
            Safe,
            "dlock-core judges validity for every client, baselines included",
        ),
        (Safe, crash),
        (Safe, cut_off),
        (
            NotApplicable,
            "one server: a cut between client and server is scenario 6",
        ),
        (
            NotCaught,
            "the restart loses the lock and nothing orders the holders",
        ),
        (
            NotApplicable,
            "not run: the jumping clock is scenario 9 of the dlock rows",
        ),
        (
            NotCaught,
            "the promoted replica lost the lock and nothing orders the holders",
        ),
        (
            NotCaught,
            "release is a plain DEL: it removes the successor's lock",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn an_address_is_replaced_only_where_its_port_ends() {
        assert_eq!(
            replace_address(
                "http://127.0.0.1:3000,127.0.0.1:30001/x",
                "127.0.0.1:3000",
                "172.18.0.2:2379"
            ),
            "http://172.18.0.2:2379,127.0.0.1:30001/x"
        );
        assert_eq!(replace_address("a:1", "b:1", "c:2"), "a:1");
        assert_eq!(replace_address("a:1", "", "c:2"), "a:1");
    }

    #[tokio::test]
    async fn an_address_is_reachable_only_while_something_listens_there() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        assert!(reachable(&address).await);
        drop(listener);
        assert!(!reachable(&address).await);
    }

    #[test]
    fn every_entry_declares_one_line_per_scenario_with_a_reason() {
        for b in BACKENDS {
            assert_eq!(b.safety.len(), Scenario::ALL.len(), "{}", b.name);
            for scenario in Scenario::ALL {
                let d = b.declared(scenario);
                assert_ne!(
                    d.class, NotRun,
                    "{} {scenario:?}: declare what it expects",
                    b.name
                );
                assert!(!d.reason.trim().is_empty(), "{} {scenario:?}", b.name);
            }
        }
    }

    #[test]
    fn names_and_titles_are_unique_and_fit_flags() {
        let names: HashSet<&str> = BACKENDS.iter().map(|b| b.name).collect();
        let titles: HashSet<&str> = BACKENDS.iter().map(|b| b.title).collect();
        assert_eq!(names.len(), BACKENDS.len());
        assert_eq!(titles.len(), BACKENDS.len());
        for b in BACKENDS {
            assert!(
                b.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{:?} is used in --only filters and JSON",
                b.name
            );
            assert_eq!(backend(b.name), Some(b));
        }
    }

    /// A variant runs its base's client on the same deployment. (What each backend declares
    /// is its crate's `CAPABILITIES`; dlock-safety checks the declarations against the table.)
    #[test]
    fn variants_share_their_base() {
        for b in BACKENDS {
            if let Role::Variant(of) = b.role {
                let base = backend(of).unwrap_or_else(|| panic!("{}: no entry {of}", b.name));
                assert_eq!(base.role, Role::Backend, "{}", b.name);
                assert_eq!(base.fixture, b.fixture, "{}", b.name);
                assert_eq!(base.scheme, b.scheme, "{}", b.name);
            }
        }
    }

    #[test]
    fn urls_keep_hosts_and_drop_schemes_and_paths() {
        let url = |name: &str, endpoints: &[&str], params: &str| {
            let endpoints: Vec<String> = endpoints.iter().map(|e| (*e).to_owned()).collect();
            backend(name).map(|b| b.url(&endpoints, params))
        };
        assert_eq!(url("memory", &[], "").as_deref(), Some("memory://"));
        assert_eq!(
            url("redis", &["redis://127.0.0.1:7000/0"], "").as_deref(),
            Some("redis://127.0.0.1:7000")
        );
        assert_eq!(
            url(
                "redlock",
                &["redis://a:1", "redis://b:2"],
                "request_timeout=200ms"
            )
            .as_deref(),
            Some("redlock://a:1,b:2?request_timeout=200ms")
        );
        assert_eq!(
            url("zk", &["a:1", "b:2"], "").as_deref(),
            Some("zk://a:1,b:2")
        );
        assert_eq!(
            url("etcd", &["http://a:1"], "session_timeout=2s").as_deref(),
            Some("etcd://a:1?session_timeout=2s")
        );
        // PostgreSQL's endpoint is its URL: the user and password stay, the database goes.
        assert_eq!(
            url(
                "postgres",
                &["postgres://postgres:pw@127.0.0.1:5432/postgres"],
                "sslmode=disable"
            )
            .as_deref(),
            Some("postgres://postgres:pw@127.0.0.1:5432?sslmode=disable")
        );
    }

    /// `scripts/test-images` builds the images the registry's fixtures run: its `names=(…)`, its
    /// export lines and its derived images name exactly [`images()`]. The script stays plain shell
    /// (it runs on a fresh machine before anything is compiled, and its content is the images'
    /// tag), so this test is what keeps the two in step.
    #[test]
    fn scripts_test_images_builds_exactly_the_registry_images() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/test-images");
        let script = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let names: Vec<&str> = script
            .lines()
            .find_map(|l| l.strip_prefix("names=("))
            .and_then(|l| l.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{path} has no names=(…) line"))
            .split_whitespace()
            .collect();
        let wanted: Vec<&str> = images().into_iter().map(Image::name).collect();
        assert_eq!(names, wanted, "scripts/test-images names=(…)");
        for image in images() {
            let export = format!(
                "printf 'export {}=%s\\n' \"$repo/{}:$tag\"",
                image.env(),
                image.name()
            );
            assert!(script.contains(&export), "{path} lacks: {export}");
            assert!(
                script.contains(&format!("derive {} \\", image.name())),
                "{path} does not derive the {} image",
                image.name()
            );
        }
    }
}
