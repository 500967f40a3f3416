//! The access control lists of the nodes dlock creates.
//!
//! Without credentials every node is open (`world:anyone` may do anything), as before.
//!
//! With digest credentials, every node dlock creates — the base path (and the chroot above it,
//! if missing), each key's parent, each contender's node — carries:
//!
//! * `digest:USER:HASH` **ALL**: the identity that created it, named explicitly, and
//! * `world:anyone` **READ**: anyone may list a key's queue and read who holds or waits.
//!
//! What follows from ZooKeeper's rules (deleting a node needs DELETE on its *parent*; creating
//! one needs CREATE on the parent; writing its data needs WRITE on the node itself):
//!
//! * Other clients with the **same** credentials contend, queue, release and clean up normally:
//!   they hold ALL on every node.
//! * A client with **other** credentials (or none) can list the queue and read each node's data
//!   (kazoo's `contenders()` works), but cannot delete or overwrite anyone's node, and cannot
//!   create a node in the key's queue or under the base path: it cannot contend for keys below a
//!   base that another identity created. Give each identity a root of its own
//!   ([`with_prefix`](crate::ZkLockBuilder::with_prefix)).
//!
//! The creator is named as a digest id rather than with ZooKeeper's `auth` scheme because `auth`
//! grants every identity the session has, which includes the identity a server with client
//! certificates derives from the certificate (`x509:CN=…`): every client presenting the same
//! certificate would then hold ALL, whatever its digest credentials.

use std::fmt;

use base64::Engine;
use dlock_core::backend::url::Credentials;
use zookeeper_client as zk;

/// The ACL of every node dlock creates with the given credentials.
#[derive(Clone)]
pub(crate) struct NodeAcl {
    acls: Vec<zk::Acl>,
    /// The digest user, for `Debug` (the hash stays out of it).
    user: Option<String>,
}

impl NodeAcl {
    /// Open nodes without credentials; creator ALL and world READ with them.
    pub(crate) fn for_credentials(credentials: Option<&Credentials>) -> NodeAcl {
        match credentials {
            None => NodeAcl {
                acls: vec![zk::Acl::new(zk::Permission::ALL, zk::AuthId::anyone())],
                user: None,
            },
            Some(credentials) => {
                let password = credentials.password.as_deref().unwrap_or_default();
                let id = digest_id(&credentials.user, password);
                NodeAcl {
                    acls: vec![
                        zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", &id)),
                        zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone()),
                    ],
                    user: Some(credentials.user.clone()),
                }
            }
        }
    }

    /// The ACL entries, as create requests take them.
    pub(crate) fn acls(&self) -> zk::Acls<'_> {
        zk::Acls::new(&self.acls)
    }
}

/// Names the user, never the hash (a hash of the password can be attacked offline).
impl fmt::Debug for NodeAcl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.user {
            None => f.write_str("NodeAcl(world:anyone ALL)"),
            Some(user) => write!(f, "NodeAcl(digest:{user}:*** ALL, world:anyone READ)"),
        }
    }
}

/// ZooKeeper's digest id of `user` with `password`: `user:base64(sha1("user:password"))`, as
/// its `DigestAuthenticationProvider.generateDigest` computes it.
pub(crate) fn digest_id(user: &str, password: &str) -> String {
    let hash = sha1_smol::Sha1::from(format!("{user}:{password}")).digest();
    let encoded = base64::engine::general_purpose::STANDARD.encode(hash.bytes());
    format!("{user}:{encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_ids_match_zookeeper() {
        // `DigestAuthenticationProvider.generateDigest("super:test")` in ZooKeeper's own docs
        // (zookeeperAdmin, "super" user): super:D/InIHSb7yEEbrWz8b9l71RjZJU=
        assert_eq!(
            digest_id("super", "test"),
            "super:D/InIHSb7yEEbrWz8b9l71RjZJU="
        );
    }

    #[test]
    fn debug_shows_no_hash() {
        let credentials = Credentials::decode("app:topsecret").unwrap();
        let acl = NodeAcl::for_credentials(Some(&credentials));
        let shown = format!("{acl:?}");
        let hash = digest_id("app", "topsecret");
        assert!(
            !shown.contains(&hash[4..]) && !shown.contains("topsecret"),
            "{shown}"
        );
        assert_eq!(acl.acls.len(), 2);
        let open = NodeAcl::for_credentials(None);
        assert_eq!(open.acls.len(), 1);
    }
}
